//! [`BufPool`]: a fixed number of equal buffers, as the RPC engine uses for its receive and send
//! rings. A thin layer: one [`Pool`] sized to exactly one reserve.

use byteexpress_verbs::{Access, Pd};

use crate::config::PAGE;
use crate::{MemError, Pool, PoolConfig, PoolStats, RecvReserve, RegisteredBuf};

/// A buffer of a [`BufPool`]: the same type as every pool buffer.
pub type PoolBuf = RegisteredBuf;

/// `count` buffers of `buf_size` bytes, registered once (one chunk, split into several MRs only
/// beyond the device's `max_mr_size`) with the access of their role, and never more (DESIGN.md
/// 3.2): [`BufPool::for_receives`] LOCAL_WRITE, [`BufPool::for_sends`] none. No peer may read or
/// write them by address; memory a peer must READ is lent per message ([`crate::ReadLoan`]).
/// [`BufPool::alloc`] never grows it: when all are out it fails ([`MemError::ReserveEmpty`]).
/// Cloning shares the pool.
#[derive(Debug, Clone)]
pub struct BufPool {
    pool: Pool,
    bufs: RecvReserve,
}

impl BufPool {
    /// Access of receive buffers ([`BufPool::for_receives`]): LOCAL_WRITE, for the device to
    /// write incoming SENDs; no REMOTE_WRITE, so a peer holding a buffer's address and rkey
    /// cannot RDMA WRITE into it (the WRITE fails with `IBV_WC_REM_ACCESS_ERR`), and no
    /// REMOTE_READ.
    pub const RECV_ACCESS: Access = Access::LOCAL_WRITE;

    /// Access of send buffers ([`BufPool::for_sends`]): none. The CPU fills them and the device
    /// only reads them as SEND sources, which needs no flag (`ibv_reg_mr(3)`: local read is
    /// always allowed).
    pub const SEND_ACCESS: Access = Access(0);

    /// A link's receive ring: `count` buffers of `buf_size` bytes with [`BufPool::RECV_ACCESS`].
    /// Errors as [`BufPool::new`].
    pub fn for_receives(pd: &Pd, buf_size: usize, count: usize) -> Result<Self, MemError> {
        Self::new(pd, buf_size, count, Self::RECV_ACCESS)
    }

    /// A link's send ring: `count` buffers of `buf_size` bytes with [`BufPool::SEND_ACCESS`].
    /// Errors as [`BufPool::new`].
    pub fn for_sends(pd: &Pd, buf_size: usize, count: usize) -> Result<Self, MemError> {
        Self::new(pd, buf_size, count, Self::SEND_ACCESS)
    }

    /// Allocates and registers `count` buffers of `buf_size` bytes (each rounded up to a power of
    /// two in memory; [`PoolBuf::capacity`] stays `buf_size`) with `access`. Errors:
    /// [`MemError::InvalidConfig`] for a zero or oversized request or REMOTE_WRITE without
    /// LOCAL_WRITE, [`MemError::Verbs`], [`MemError::Memlock`].
    pub fn new(pd: &Pd, buf_size: usize, count: usize, access: Access) -> Result<Self, MemError> {
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
            access,
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

    /// The access flags every buffer of the pool is registered with.
    pub fn access(&self) -> Access {
        self.pool.config().access
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
