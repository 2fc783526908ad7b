//! Writing frames to a byte stream.

use std::io::IoSlice;

use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::{ESCAPE, FrameConfig, FrameError, HEADER_LEN, LONG_HEADER_LEN, Progress};

/// Writes length-prefixed frames to `W`.
///
/// Each frame goes out as one vectored write of the header and the caller's parts (more writes
/// only when the stream accepts less); nothing is copied or buffered here, so no
/// [`FrameWriter::flush`] is needed for a plain TCP stream.
#[derive(Debug)]
pub struct FrameWriter<W> {
    inner: W,
    max_frame: usize,
    /// Called after every write the stream accepted bytes of ([`FrameWriter::on_progress`]).
    progress: Option<Progress>,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// Wraps `inner` with the limits of `cfg`.
    pub fn new(inner: W, cfg: FrameConfig) -> Self {
        Self {
            inner,
            max_frame: cfg.max_frame,
            progress: None,
        }
    }

    /// Calls `hook` after every write the stream accepts bytes of, also in the middle of a
    /// frame (once the socket's buffers are full, accepted bytes mean the peer is reading).
    pub fn on_progress(&mut self, hook: Progress) {
        self.progress = Some(hook);
    }

    /// Writes one frame whose payload is the concatenation of `parts`: with the 4-byte length
    /// below `0xFFFF_FFFF` bytes, else with the escape and the 8-byte length (crate docs).
    ///
    /// # Errors
    /// [`FrameError::TooLarge`] when the payload exceeds the maximum (nothing is written),
    /// [`FrameError::Io`] when the stream fails.
    ///
    /// # Cancellation
    /// Not cancel-safe: a cancelled call may leave a partial frame on the stream, which must
    /// then be closed.
    pub async fn write_frame(&mut self, parts: &[&[u8]]) -> Result<(), FrameError> {
        self.write_frames(&[parts]).await
    }

    /// Writes several frames, in order, as one run of vectored writes: one `writev(2)` when the
    /// stream takes them all (the kernel caps a call at `IOV_MAX`, 1024 slices; the rest goes
    /// in the next call). Each frame is as [`FrameWriter::write_frame`] writes it. Callers
    /// batch what is queued so that many small frames cost one syscall (issue 25: TCP writes
    /// coalesced across calls).
    ///
    /// # Errors
    /// [`FrameError::TooLarge`] for the first frame over the maximum: the frames before it are
    /// written, it and those after it are not. [`FrameError::Io`] when the stream fails.
    ///
    /// # Cancellation
    /// Not cancel-safe, as [`FrameWriter::write_frame`].
    pub async fn write_frames(&mut self, frames: &[&[&[u8]]]) -> Result<(), FrameError> {
        let mut prefixes = Vec::with_capacity(frames.len());
        let mut too_large = None;
        for parts in frames {
            let len = parts
                .iter()
                .fold(0u64, |sum, p| sum.saturating_add(p.len() as u64));
            match usize::try_from(len) {
                Ok(ulen) if ulen <= self.max_frame => prefixes.push(prefix(len)),
                _ => {
                    too_large = Some(self.too_large(len));
                    break;
                }
            }
        }
        let mut slices = Vec::with_capacity(prefixes.len() * 4);
        for (p, parts) in prefixes.iter().zip(frames) {
            slices.push(IoSlice::new(p.as_slice()));
            slices.extend(
                parts
                    .iter()
                    .filter(|p| !p.is_empty())
                    .map(|p| IoSlice::new(p)),
            );
        }
        let mut remaining: usize = slices.iter().map(|s| s.len()).sum();
        let mut rest = &mut slices[..];
        while remaining > 0 {
            let n = self.inner.write_vectored(rest).await?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into());
            }
            if let Some(p) = &self.progress {
                p.note(n);
            }
            remaining -= n;
            IoSlice::advance_slices(&mut rest, n);
        }
        match too_large {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Flushes the underlying writer (needed only when it buffers, e.g. a `BufWriter`).
    ///
    /// # Errors
    /// [`FrameError::Io`] when the stream fails.
    pub async fn flush(&mut self) -> Result<(), FrameError> {
        Ok(self.inner.flush().await?)
    }

    /// Shuts down the write direction (TCP FIN): the peer's reader sees a clean end of stream.
    ///
    /// # Errors
    /// [`FrameError::Io`] when the stream fails.
    pub async fn shutdown(&mut self) -> Result<(), FrameError> {
        Ok(self.inner.shutdown().await?)
    }

    /// Sends a last frame (typically the RPC layer's error message after a bad frame), flushes
    /// and shuts down the write direction. The caller then drops both halves.
    ///
    /// # Errors
    /// As [`FrameWriter::write_frame`] and [`FrameWriter::shutdown`].
    pub async fn close_with_frame(&mut self, parts: &[&[u8]]) -> Result<(), FrameError> {
        self.write_frame(parts).await?;
        self.flush().await?;
        self.shutdown().await
    }

    /// The wrapped writer.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// Unwraps the writer.
    pub fn into_inner(self) -> W {
        self.inner
    }

    fn too_large(&self, len: u64) -> FrameError {
        FrameError::TooLarge {
            len,
            max: self.max_frame,
        }
    }
}

/// A frame's length prefix: 4 bytes big-endian below `0xFFFF_FFFF`, else the escape and the
/// 8-byte length (crate docs).
#[derive(Debug, Clone, Copy)]
struct Prefix {
    bytes: [u8; LONG_HEADER_LEN],
    len: usize,
}

impl Prefix {
    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

fn prefix(len: u64) -> Prefix {
    let mut bytes = [0u8; LONG_HEADER_LEN];
    let len = match u32::try_from(len) {
        Ok(short) if short < ESCAPE => {
            bytes[..HEADER_LEN].copy_from_slice(&short.to_be_bytes());
            HEADER_LEN
        }
        _ => {
            bytes[..HEADER_LEN].copy_from_slice(&ESCAPE.to_be_bytes());
            bytes[HEADER_LEN..].copy_from_slice(&len.to_be_bytes());
            LONG_HEADER_LEN
        }
    };
    Prefix { bytes, len }
}
