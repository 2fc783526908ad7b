//! Configuration of a QP scheduler.

use super::{Chunks, SchedError};

/// Parameters of a [`Scheduler`](super::Scheduler). Invariant: `1 <= max_chunk <= quantum`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedConfig {
    quantum: u32,
    max_chunk: u32,
    latency_burst: u32,
}

impl SchedConfig {
    /// Default latency burst: 8 latency chunks in a row while bulk is backlogged.
    pub const DEFAULT_LATENCY_BURST: u32 = 8;

    /// A configuration: DRR `quantum` (bytes added to a connection's deficit per turn),
    /// `max_chunk` (largest chunk, bytes), `latency_burst` (latency chunks allowed in a row
    /// while bulk is backlogged, at least 1).
    ///
    /// # Errors
    /// [`SchedError::ZeroChunk`], [`SchedError::QuantumBelowChunk`] when
    /// `quantum < max_chunk`, [`SchedError::ZeroLatencyBurst`].
    pub fn new(quantum: u32, max_chunk: u32, latency_burst: u32) -> Result<Self, SchedError> {
        if max_chunk == 0 {
            return Err(SchedError::ZeroChunk);
        }
        if quantum < max_chunk {
            return Err(SchedError::QuantumBelowChunk { quantum, max_chunk });
        }
        if latency_burst == 0 {
            return Err(SchedError::ZeroLatencyBurst);
        }
        Ok(Self {
            quantum,
            max_chunk,
            latency_burst,
        })
    }

    /// DRR quantum (unit: bytes per turn).
    #[inline]
    pub fn quantum(&self) -> u32 {
        self.quantum
    }

    /// Largest chunk (unit: bytes).
    #[inline]
    pub fn max_chunk(&self) -> u32 {
        self.max_chunk
    }

    /// Latency chunks allowed in a row while bulk is backlogged (unit: chunks).
    #[inline]
    pub fn latency_burst(&self) -> u32 {
        self.latency_burst
    }
}

impl Default for SchedConfig {
    /// Quantum 64 KiB, chunks of 64 KiB, latency burst 8.
    fn default() -> Self {
        Self {
            quantum: Chunks::DEFAULT_MAX_CHUNK,
            max_chunk: Chunks::DEFAULT_MAX_CHUNK,
            latency_burst: Self::DEFAULT_LATENCY_BURST,
        }
    }
}
