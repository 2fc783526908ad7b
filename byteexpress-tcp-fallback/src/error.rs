//! Errors of the frame layer.

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// A frame length above the configured maximum: announced by the peer (read side, nothing
    /// was allocated for it) or requested by the caller (write side, nothing was written).
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// Payload length announced or requested (unit: bytes).
        len: u64,
        /// Configured maximum (unit: bytes).
        max: usize,
    },
    /// A long frame header ([`crate::ESCAPE`]) whose `u64` length is below `0xFFFF_FFFF`: such
    /// a length has the 4-byte form, so the stream is garbled. Nothing was allocated for it.
    #[error("long frame header with length {len}, which is below 0xFFFFFFFF")]
    BadEscape {
        /// The `u64` length it carried (unit: bytes).
        len: u64,
    },
    /// The peer closed the stream in the middle of a frame.
    #[error("stream ended mid-frame: {received} of {expected} bytes (header included)")]
    Truncated {
        /// Bytes the frame needs, header included; 4 (12 after an escape) while the header
        /// itself is incomplete (unit: bytes).
        expected: u64,
        /// Bytes of that frame received before the end of the stream (unit: bytes).
        received: usize,
    },
    /// An I/O error of the underlying stream.
    #[error("frame i/o: {0}")]
    Io(#[from] std::io::Error),
}
