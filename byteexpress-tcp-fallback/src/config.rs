//! Frame size limits.

/// Length of the frame header: a big-endian `u32` payload length (unit: bytes).
pub const HEADER_LEN: usize = 4;

/// The `u32` length that announces a long frame: the real length follows as a big-endian
/// `u64` (at least `ESCAPE` itself).
pub const ESCAPE: u32 = u32::MAX;

/// Length of a long frame's header: [`ESCAPE`] and the `u64` length (unit: bytes).
pub const LONG_HEADER_LEN: usize = 12;

/// Default maximum payload per frame: 16 MiB of message plus 64 KiB for the RPC header and
/// metadata (unit: bytes).
pub const DEFAULT_MAX_FRAME: usize = 16 * 1024 * 1024 + 64 * 1024;

/// Limits of one framed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameConfig {
    /// Largest payload accepted or sent (unit: bytes, header excluded). Payloads of
    /// `u32::MAX` bytes or more use the long header ([`ESCAPE`] and a `u64` length).
    pub max_frame: usize,
}

impl Default for FrameConfig {
    fn default() -> Self {
        Self {
            max_frame: DEFAULT_MAX_FRAME,
        }
    }
}
