//! Frame size limits.

/// Length of the frame header: a big-endian `u32` payload length (unit: bytes).
pub const HEADER_LEN: usize = 4;

/// Default maximum payload per frame: 16 MiB of message plus 64 KiB for the RPC header and
/// metadata (unit: bytes).
pub const DEFAULT_MAX_FRAME: usize = 16 * 1024 * 1024 + 64 * 1024;

/// Limits of one framed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameConfig {
    /// Largest payload accepted or sent (unit: bytes, header excluded). Values above
    /// `u32::MAX` are effectively `u32::MAX`, the largest length the header can carry.
    pub max_frame: usize,
}

impl Default for FrameConfig {
    fn default() -> Self {
        Self {
            max_frame: DEFAULT_MAX_FRAME,
        }
    }
}
