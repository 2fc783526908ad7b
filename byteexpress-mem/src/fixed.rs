//! [`BufPool`]: a fixed number of equal buffers, as the RPC engine uses for its receive and send
//! rings. A thin layer: one [`Pool`] sized to exactly one reserve.

use byteexpress_verbs::Pd;

use crate::config::PAGE;
use crate::{MemError, Pool, PoolConfig, PoolStats, RecvReserve, RegisteredBuf};

/// A buffer of a [`BufPool`]: the same type as every pool buffer.
pub type PoolBuf = RegisteredBuf;

/// `count` buffers of `buf_size` bytes, registered once (one chunk, split into several MRs only
/// beyond the device's `max_mr_size`) with LOCAL_WRITE, REMOTE_READ and REMOTE_WRITE access.
/// [`BufPool::alloc`] never grows it: when all are out it fails ([`MemError::ReserveEmpty`]).
/// Cloning shares the pool.
#[derive(Debug, Clone)]
pub struct BufPool {
    pool: Pool,
    bufs: RecvReserve,
}

impl BufPool {
    /// Allocates and registers `count` buffers of `buf_size` bytes (each rounded up to a power of
    /// two in memory; [`PoolBuf::capacity`] stays `buf_size`). Errors: [`MemError::InvalidConfig`]
    /// for a zero or oversized request, [`MemError::Verbs`], [`MemError::Memlock`].
    pub fn new(pd: &Pd, buf_size: usize, count: usize) -> Result<Self, MemError> {
        let invalid = || MemError::InvalidConfig(format!("{count} buffers of {buf_size} bytes"));
        if buf_size == 0 || count == 0 || buf_size > crate::config::MAX_CLASS_LIMIT {
            return Err(invalid());
        }
        let class = buf_size.next_power_of_two();
        let chunk = class
            .checked_mul(count)
            .and_then(|b| b.checked_next_multiple_of(PAGE))
            .ok_or_else(invalid)?;
        let cfg = PoolConfig {
            min_class: class,
            max_class: class,
            chunk_size: chunk,
            limit: chunk as u64,
            ..PoolConfig::default()
        };
        let pool = Pool::new(pd, cfg)?;
        let bufs = pool.reserve(buf_size, count)?;
        Ok(BufPool { pool, bufs })
    }

    /// A free buffer (length 0, capacity `buf_size`). Errors: [`MemError::ReserveEmpty`].
    pub fn alloc(&self) -> Result<PoolBuf, MemError> {
        self.bufs.take()
    }

    /// Bytes per buffer.
    pub fn buf_size(&self) -> usize {
        self.bufs.buf_size()
    }

    /// Buffers in the pool.
    pub fn count(&self) -> usize {
        self.bufs.count()
    }

    /// Free buffers right now.
    pub fn available(&self) -> usize {
        self.bufs.available()
    }

    /// True when `addr` lies inside this pool's memory.
    pub fn contains(&self, addr: *const u8) -> bool {
        self.pool.contains(addr)
    }

    /// Counters (the buffers show as reserved in their class).
    pub fn stats(&self) -> PoolStats {
        self.pool.stats()
    }
}
