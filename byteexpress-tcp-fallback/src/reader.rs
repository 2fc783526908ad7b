//! Reading frames from a byte stream.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::{ESCAPE, FrameConfig, FrameError, HEADER_LEN, LONG_HEADER_LEN, Progress};

/// Smallest free space offered to each read, so many small frames arrive per syscall
/// (unit: bytes).
const MIN_READ: usize = 8 * 1024;
/// Largest free space a read is offered beyond what its frame misses (unit: bytes): reached
/// by doubling from [`MIN_READ`] while reads keep filling all they are offered (the socket
/// holds more: answers of 16 KiB took two reads each at 8 KiB), halved again when a read
/// brings less than a quarter of it.
const MAX_READ: usize = 64 * 1024;
/// Buffers up to this capacity (bytes) are grown for a full [`MIN_READ`]; larger ones only
/// for the bytes their frame still misses ([`FrameReader::make_room`]).
const SMALL_BUFFER: usize = 1 << 20;

/// Reads length-prefixed frames from `R`.
///
/// Reads land in one `BytesMut`; each frame is split off it without copying and returned as
/// [`Bytes`] (which keeps its share of the read buffer alive until dropped). Every read asks for
/// at least 8 KiB, and up to 64 KiB while reads keep filling what they are offered, so
/// back-to-back frames cost one syscall together. Memory held is about one maximum frame plus
/// 64 KiB beyond the frames the caller still holds (up to twice that where `BytesMut` grows a
/// buffer by doubling it).
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    max_frame: usize,
    /// The buffered frame's announced length was admitted (by [`FrameReader::read_frame_admit`]).
    admitted: bool,
    /// A refused frame: its head is being collected (`Some(head_len)`), then its remaining
    /// bytes are dropped as they arrive (`skip`).
    refused: Option<Refusal>,
    skip: usize,
    /// Called after every read that returned bytes ([`FrameReader::on_progress`]).
    progress: Option<Progress>,
    /// Free space offered to the next read beyond what its frame misses, [`MIN_READ`] ..=
    /// [`MAX_READ`] (see there).
    read_size: usize,
}

/// A frame refused by the admission check, while its head is read.
#[derive(Debug, Clone, Copy)]
struct Refusal {
    len: usize,
    head_len: usize,
}

/// What [`FrameReader::read_frame_admit`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A whole frame's payload.
    Whole(Bytes),
    /// A frame whose announced length the admission check refused: only its first bytes are
    /// kept (`head`); the rest is dropped as it arrives, never buffered whole.
    Refused {
        /// The payload's first `min(head_len, len)` bytes.
        head: Bytes,
        /// The payload length the frame announced (bytes).
        len: usize,
    },
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Wraps `inner` with the limits of `cfg`.
    pub fn new(inner: R, cfg: FrameConfig) -> Self {
        Self {
            inner,
            buf: BytesMut::with_capacity(MIN_READ),
            max_frame: cfg.max_frame,
            admitted: false,
            refused: None,
            skip: 0,
            progress: None,
            read_size: MIN_READ,
        }
    }

    /// Calls `hook` after every read that returns bytes, also in the middle of a frame (a
    /// connection's keepalive then sees a peer sending one long frame as alive).
    pub fn on_progress(&mut self, hook: Progress) {
        self.progress = Some(hook);
    }

    /// Reads more bytes into the buffer; `Ok(0)` at the end of the stream.
    async fn fill(&mut self) -> std::io::Result<usize> {
        let offered = self.buf.capacity() - self.buf.len();
        let n = self.inner.read_buf(&mut self.buf).await?;
        if n >= offered {
            self.read_size = (self.read_size * 2).min(MAX_READ);
        } else if n < offered / 4 {
            self.read_size = (self.read_size / 2).max(MIN_READ);
        }
        if n > 0
            && let Some(p) = &self.progress
        {
            p.note(n);
        }
        Ok(n)
    }

    /// Reads the next frame as [`FrameReader::read_frame`] does, but asks `admit(len)` once per
    /// frame, as soon as its length is known and before any room is reserved for it. A refused
    /// frame is returned as [`Frame::Refused`] once its first `head_len` bytes are in; its other
    /// bytes are then read and dropped (each read into the buffer's spare room, at least 8 KiB)
    /// before the next frame. Used to keep the memory that peers' partial frames hold within a
    /// budget.
    ///
    /// # Errors
    /// As [`FrameReader::read_frame`].
    ///
    /// # Cancellation
    /// Cancel-safe: the admission decision and the bytes read stay with the reader, and
    /// `admit` is not asked again for the same frame.
    pub async fn read_frame_admit(
        &mut self,
        head_len: usize,
        mut admit: impl FnMut(usize) -> bool,
    ) -> Result<Option<Frame>, FrameError> {
        loop {
            // drop what is left of a refused frame
            while self.skip > 0 {
                if self.buf.is_empty() {
                    self.buf.reserve(MIN_READ);
                    if self.fill().await? == 0 {
                        return Err(FrameError::Truncated {
                            expected: self.skip as u64,
                            received: 0,
                        });
                    }
                }
                let n = self.skip.min(self.buf.len());
                self.buf.advance(n);
                self.skip -= n;
            }
            if let Some(r) = self.refused {
                if self.buf.len() >= r.head_len {
                    let head = self.buf.split_to(r.head_len).freeze();
                    self.refused = None;
                    self.skip = r.len - r.head_len;
                    return Ok(Some(Frame::Refused { head, len: r.len }));
                }
            } else if let Some((prefix, len)) = self.announced_len()? {
                if !self.admitted {
                    if admit(len) {
                        self.admitted = true;
                    } else {
                        self.buf.advance(prefix);
                        self.refused = Some(Refusal {
                            len,
                            head_len: head_len.min(len),
                        });
                        continue;
                    }
                }
                if self.buf.len() - prefix >= len {
                    self.admitted = false;
                    self.buf.advance(prefix);
                    return Ok(Some(Frame::Whole(self.buf.split_to(len).freeze())));
                }
            }
            let needed = match self.refused {
                Some(r) => r.head_len,
                None => self.needed()?,
            };
            self.make_room(needed.saturating_sub(self.buf.len()));
            if self.fill().await? == 0 {
                if self.buf.is_empty() && self.refused.is_none() {
                    return Ok(None);
                }
                return Err(FrameError::Truncated {
                    expected: needed as u64,
                    received: self.buf.len(),
                });
            }
        }
    }

    /// Reads the next frame's payload.
    ///
    /// Returns `Ok(None)` at a clean end of stream (between frames).
    ///
    /// # Errors
    /// [`FrameError::TooLarge`] when the header announces more than the maximum (checked before
    /// reserving anything; the stream is then unusable and further calls fail the same way),
    /// [`FrameError::Truncated`] when the stream ends mid-frame, [`FrameError::Io`] otherwise.
    ///
    /// # Cancellation
    /// Cancel-safe: bytes read before a cancelled call stay buffered for the next call.
    pub async fn read_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        loop {
            if let Some((prefix, len)) = self.announced_len()?
                && self.buf.len() - prefix >= len
            {
                self.buf.advance(prefix);
                return Ok(Some(self.buf.split_to(len).freeze()));
            }
            let needed = self.needed()?;
            self.make_room(needed.saturating_sub(self.buf.len()));
            if self.fill().await? == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(FrameError::Truncated {
                    expected: needed as u64,
                    received: self.buf.len(),
                });
            }
        }
    }

    /// The buffered header's length (4, or 12 after the escape) and payload length, if the
    /// header is complete, checked against the maximum (and an escape's length against its
    /// lower bound) before anything is reserved for the payload.
    fn announced_len(&self) -> Result<Option<(usize, usize)>, FrameError> {
        let Some(header) = self.buf.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let short = u32::from_be_bytes(*header);
        let (prefix, len) = if short == ESCAPE {
            let Some(long) = self.buf.first_chunk::<LONG_HEADER_LEN>() else {
                return Ok(None);
            };
            let len = u64::from_be_bytes(long[HEADER_LEN..].try_into().expect("8 bytes"));
            if len < u64::from(ESCAPE) {
                return Err(FrameError::BadEscape { len });
            }
            (LONG_HEADER_LEN, len)
        } else {
            (HEADER_LEN, u64::from(short))
        };
        match usize::try_from(len) {
            Ok(len) if len <= self.max_frame => Ok(Some((prefix, len))),
            _ => Err(FrameError::TooLarge {
                len,
                max: self.max_frame,
            }),
        }
    }

    /// Bytes the next frame needs buffered, header included: its header's while that is
    /// incomplete (4, then 12 after an escape).
    fn needed(&self) -> Result<usize, FrameError> {
        Ok(match self.announced_len()? {
            Some((prefix, len)) => prefix.saturating_add(len),
            None if self.buf.first_chunk::<HEADER_LEN>() == Some(&ESCAPE.to_be_bytes()) => {
                LONG_HEADER_LEN
            }
            None => HEADER_LEN,
        })
    }

    /// Room in the buffer for the `missing` bytes of the frame being read, and for a read of
    /// at least the read size ([`MIN_READ`] ..= [`MAX_READ`]: several frames per read) while
    /// the buffer is small.
    /// A large buffer gets more room only when the frame's missing bytes do not fit: a large
    /// frame's tail asking for a full `MIN_READ` made `BytesMut::reserve` double the frame's
    /// whole buffer (a 4 GiB frame asked for 8.6 GB and the process aborted).
    fn make_room(&mut self, missing: usize) {
        let free = self.buf.capacity() - self.buf.len();
        let small = self.buf.capacity() <= SMALL_BUFFER;
        if free < missing || free == 0 || (small && free < self.read_size) {
            self.buf.reserve(missing.max(self.read_size));
        }
    }

    /// The largest payload accepted (unit: bytes).
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Changes the largest payload accepted (unit: bytes): applies to every frame header
    /// examined from now on, including one already buffered. Call it between frames.
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame;
    }

    /// Bytes received but not yet returned as frames (unit: bytes).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Capacity of the read buffer (unit: bytes), for memory accounting and tests.
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// The wrapped reader.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Unwraps the reader; bytes still buffered are returned with it.
    pub fn into_parts(self) -> (R, BytesMut) {
        (self.inner, self.buf)
    }
}
