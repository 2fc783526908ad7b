//! Writing frames to a byte stream.

use std::io::IoSlice;

use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::{ESCAPE, FrameConfig, FrameError, HEADER_LEN, LONG_HEADER_LEN};

/// Writes length-prefixed frames to `W`.
///
/// Each frame goes out as one vectored write of the header and the caller's parts (more writes
/// only when the stream accepts less); nothing is copied or buffered here, so no
/// [`FrameWriter::flush`] is needed for a plain TCP stream.
#[derive(Debug)]
pub struct FrameWriter<W> {
    inner: W,
    max_frame: usize,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// Wraps `inner` with the limits of `cfg`.
    pub fn new(inner: W, cfg: FrameConfig) -> Self {
        Self {
            inner,
            max_frame: cfg.max_frame,
        }
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
        let len = parts
            .iter()
            .fold(0u64, |sum, p| sum.saturating_add(p.len() as u64));
        let Ok(ulen) = usize::try_from(len) else {
            return Err(self.too_large(len));
        };
        if ulen > self.max_frame {
            return Err(self.too_large(len));
        }
        let mut header = [0u8; LONG_HEADER_LEN];
        let prefix = match u32::try_from(len) {
            Ok(short) if short < ESCAPE => {
                header[..HEADER_LEN].copy_from_slice(&short.to_be_bytes());
                HEADER_LEN
            }
            _ => {
                header[..HEADER_LEN].copy_from_slice(&ESCAPE.to_be_bytes());
                header[HEADER_LEN..].copy_from_slice(&len.to_be_bytes());
                LONG_HEADER_LEN
            }
        };
        let header = &header[..prefix];
        let mut slices = Vec::with_capacity(parts.len() + 1);
        slices.push(IoSlice::new(header));
        slices.extend(
            parts
                .iter()
                .filter(|p| !p.is_empty())
                .map(|p| IoSlice::new(p)),
        );
        let mut rest = &mut slices[..];
        let mut remaining = prefix + ulen;
        while remaining > 0 {
            let n = self.inner.write_vectored(rest).await?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into());
            }
            remaining -= n;
            IoSlice::advance_slices(&mut rest, n);
        }
        Ok(())
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
