//! Errors of the window.

/// Which account limits or rejects an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// The QP's own [`Window`](super::Window).
    Qp,
    /// The shared [`DeviceWindow`](super::DeviceWindow).
    Device,
}

/// An invalid window configuration, or a completion the window never saw posted.
/// State is left unchanged on error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WindowError {
    /// A cap, or the adaptive `min`, of 0 bytes: nothing could ever be posted but the escape.
    ZeroCap,
    /// Adaptive `min > max` (bytes).
    BadRange {
        /// Lower clamp (bytes).
        min: u64,
        /// Upper clamp (bytes).
        max: u64,
    },
    /// Adaptive initial window outside `[min, max]` (bytes).
    InitialOutOfRange {
        /// Requested initial window (bytes).
        initial: u64,
        /// Lower clamp (bytes).
        min: u64,
        /// Upper clamp (bytes).
        max: u64,
    },
    /// Adaptive target delay of 0 µs: every completion would be above target.
    ZeroTargetDelay,
    /// Adaptive additive increase of 0 bytes: the window could never grow.
    ZeroIncrease,
    /// A per-mille parameter outside `1..=1000`.
    PermilleOutOfRange(u32),
    /// A completion of more bytes than are in flight on that account (caller bug).
    Overcomplete {
        /// Which account would go negative.
        limit: Limit,
        /// Bytes reported complete.
        bytes: u64,
        /// Bytes in flight on that account.
        in_flight: u64,
    },
}

impl std::fmt::Display for WindowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ZeroCap => write!(f, "window cap must be at least 1 byte"),
            Self::BadRange { min, max } => {
                write!(f, "window min {min} B is above max {max} B")
            }
            Self::InitialOutOfRange { initial, min, max } => {
                write!(f, "initial window {initial} B outside [{min}, {max}] B")
            }
            Self::ZeroTargetDelay => write!(f, "target delay must be at least 1 µs"),
            Self::ZeroIncrease => write!(f, "additive increase must be at least 1 byte"),
            Self::PermilleOutOfRange(v) => write!(f, "per-mille value {v} outside 1..=1000"),
            Self::Overcomplete {
                limit,
                bytes,
                in_flight,
            } => write!(
                f,
                "{limit:?} completion of {bytes} B but only {in_flight} B in flight"
            ),
        }
    }
}

impl std::error::Error for WindowError {}
