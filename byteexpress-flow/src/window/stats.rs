//! Counters of a QP window, for metrics.

/// Monotonic counters of one [`Window`](super::Window) since creation
/// (unit: posts unless stated). They wrap at `u64::MAX`, which the byte counters reach after
/// 16 EiB (47 years at 100 Gb/s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowStats {
    /// Posts admitted (`try_post` calls).
    pub posted: u64,
    /// Bytes admitted (unit: bytes).
    pub posted_bytes: u64,
    /// Bytes completed (unit: bytes).
    pub completed_bytes: u64,
    /// Posts refused ([`Blocked`](super::Blocked)), by either cap.
    pub blocked: u64,
    /// Posts admitted through the single-chunk escape (over a cap, account empty).
    pub escapes: u64,
    /// Adaptive additive increases applied.
    pub increases: u64,
    /// Adaptive multiplicative decreases applied.
    pub decreases: u64,
}
