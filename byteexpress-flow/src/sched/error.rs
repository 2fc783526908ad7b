//! Errors of the scheduler.

use super::ConnId;

/// A rejected configuration or call. State is left unchanged on error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchedError {
    /// `max_chunk` of 0 bytes.
    ZeroChunk,
    /// `quantum < max_chunk` (bytes): a turn could send nothing.
    QuantumBelowChunk {
        /// DRR quantum (bytes).
        quantum: u32,
        /// Largest chunk (bytes).
        max_chunk: u32,
    },
    /// `latency_burst` of 0: the latency class would never be served while bulk is backlogged.
    ZeroLatencyBurst,
    /// A message of 0 bytes (pass wire bytes, header included).
    EmptyMessage,
    /// The connection is closed or was never opened here.
    UnknownConn(ConnId),
}

impl std::fmt::Display for SchedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ZeroChunk => write!(f, "max_chunk must be at least 1 byte"),
            Self::QuantumBelowChunk { quantum, max_chunk } => {
                write!(f, "quantum {quantum} B is below max_chunk {max_chunk} B")
            }
            Self::ZeroLatencyBurst => write!(f, "latency_burst must be at least 1"),
            Self::EmptyMessage => write!(f, "message of 0 bytes"),
            Self::UnknownConn(c) => write!(f, "unknown connection {c:?}"),
        }
    }
}

impl std::error::Error for SchedError {}
