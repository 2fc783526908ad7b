//! [`Pool`]: the allocator of registered memory.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use byteexpress_verbs::Pd;
use tokio::time::Instant;

use crate::backing::{Backend, VerbsBackend};
use crate::buf::{Home, RegisteredBuf};
use crate::shared::Shared;
use crate::stats::bump_shared;
use crate::{MemError, PoolConfig, PoolStats, ReadLoan, RecvReserve};

/// Registered memory in power-of-two size classes, carved from chunks registered once and grown
/// on demand up to [`PoolConfig::limit`] bytes, with thread-local caches in front (see the crate
/// docs). Cloning shares the pool; the memory is deregistered when the last handle, reserve and
/// buffer are gone (buffers other threads cache for it go back at those threads' next free or
/// cache refill in any pool, or at their exit).
#[derive(Debug)]
pub struct Pool {
    pub(crate) shared: Arc<Shared>,
}

impl Clone for Pool {
    fn clone(&self) -> Self {
        self.shared.handles.fetch_add(1, Ordering::Relaxed);
        Pool {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.shared.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            // No allocation can come through a thread cache any more: caches hand back what
            // they hold, so the pool goes once its buffers and reserves are gone.
            self.shared.orphaned.store(true, Ordering::Release);
            crate::cache::orphaned();
        }
    }
}

/// Counts a waiting task for as long as it waits (also when its future is dropped).
struct Waiting<'a>(&'a Shared);

impl<'a> Waiting<'a> {
    fn new(shared: &'a Shared) -> Self {
        shared.waiters.fetch_add(1, Ordering::SeqCst);
        Waiting(shared)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Pool {
    /// A pool whose chunks come from `pd` ([`Pd::alloc_shared`], registered with
    /// [`Pd::reg_shared`] and `cfg.access`). Nothing is allocated before the first request.
    /// Errors: [`MemError::InvalidConfig`].
    pub fn new(pd: &Pd, cfg: PoolConfig) -> Result<Self, MemError> {
        let backend = VerbsBackend {
            pd: pd.clone(),
            access: cfg.access,
            huge_pages: cfg.huge_pages,
            lends_for_read: cfg.lends_for_read,
        };
        Self::with_backend(Box::new(backend), cfg)
    }

    pub(crate) fn with_backend(
        backend: Box<dyn Backend>,
        cfg: PoolConfig,
    ) -> Result<Self, MemError> {
        Ok(Pool {
            shared: Arc::new(Shared::new(backend, cfg)?),
        })
    }

    /// A buffer of capacity `len` bytes, now or never. Errors: [`MemError::TooLarge`],
    /// [`MemError::Exhausted`] (counted in [`PoolStats::exhaustions`]), [`MemError::Memlock`]
    /// or [`MemError::Verbs`] when growing fails.
    #[inline(always)]
    pub fn try_alloc(&self, len: usize) -> Result<RegisteredBuf, MemError> {
        // The hot path: a buffer this thread caches, handed over with its lease.
        if let Some(class) = self.shared.classes.index(len)
            && let Some(slot) = crate::cache::pop(&self.shared, class)
        {
            return Ok(RegisteredBuf::new(
                slot,
                len,
                class,
                Home::Pool(Shared::raw(&self.shared)),
            ));
        }
        self.try_alloc_slow(len)
    }

    #[cold]
    #[inline(never)]
    fn try_alloc_slow(&self, len: usize) -> Result<RegisteredBuf, MemError> {
        let r = self.alloc_now(len);
        if let Err(MemError::Exhausted { .. }) = r {
            bump_shared(&self.shared.counters.exhaustions);
        }
        r
    }

    fn alloc_now(&self, len: usize) -> Result<RegisteredBuf, MemError> {
        let Some(class) = self.shared.classes.index(len) else {
            return Err(self.too_large(len));
        };
        let slot = crate::cache::alloc(&self.shared, class)?;
        // The slot carries a lease of the pool (`cache::alloc`), which the buffer now holds.
        Ok(RegisteredBuf::new(
            slot,
            len,
            class,
            Home::Pool(Shared::raw(&self.shared)),
        ))
    }

    #[cold]
    #[inline(never)]
    fn too_large(&self, len: usize) -> MemError {
        MemError::TooLarge {
            len,
            max: self.shared.classes.max_size(),
        }
    }

    /// A buffer of capacity `len` bytes, waiting while the pool is exhausted until memory comes
    /// back (a buffer or frozen `Bytes` dropped anywhere) or `deadline` passes. Errors as
    /// [`Pool::try_alloc`], plus [`MemError::DeadlineExceeded`]. A deadline needs a tokio runtime
    /// with its timer enabled. Cancel-safe: dropping the future leaves nothing behind.
    pub async fn alloc(
        &self,
        len: usize,
        deadline: Option<Instant>,
    ) -> Result<RegisteredBuf, MemError> {
        match self.alloc_now(len) {
            Err(MemError::Exhausted { .. }) => {}
            other => return other,
        }
        bump_shared(&self.shared.counters.waits);
        let _waiting = Waiting::new(&self.shared);
        // Buffers this thread cached may be all that is missing (or block re-carving a chunk).
        crate::cache::flush(&self.shared);
        loop {
            let notified = self.shared.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.alloc_now(len) {
                Err(MemError::Exhausted { .. }) => {}
                other => return other,
            }
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d, notified).await.is_err() {
                        bump_shared(&self.shared.counters.exhaustions);
                        return Err(MemError::DeadlineExceeded { len });
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Sets aside `count` buffers of capacity `len` bytes for receives ([`RecvReserve`]),
    /// growing the pool within its limit. Errors: [`MemError::InvalidConfig`] for `count == 0`,
    /// [`MemError::TooLarge`], [`MemError::Exhausted`] (nothing is kept then), growth errors.
    pub fn reserve(&self, len: usize, count: usize) -> Result<RecvReserve, MemError> {
        if count == 0 {
            return Err(MemError::InvalidConfig(
                "a reserve needs at least one buffer".into(),
            ));
        }
        let class = self.shared.classes.index(len).ok_or(MemError::TooLarge {
            len,
            max: self.shared.classes.max_size(),
        })?;
        let mut slots = Vec::with_capacity(count);
        while slots.len() < count {
            if let Err(e) = self.shared.take(class, count - slots.len(), &mut slots) {
                self.shared.put(class, slots);
                return Err(e);
            }
        }
        Ok(RecvReserve::new(self.shared.clone(), class, len, slots))
    }

    /// Counters right now.
    pub fn stats(&self) -> PoolStats {
        PoolStats::snapshot(&self.shared)
    }

    /// The configuration the pool runs with.
    pub fn config(&self) -> &PoolConfig {
        &self.shared.cfg
    }

    /// Bytes per buffer of the class that serves `len`, or `None` when too large.
    #[inline]
    pub fn class_size(&self, len: usize) -> Option<usize> {
        self.shared
            .classes
            .index(len)
            .map(|c| self.shared.classes.size(c))
    }

    /// Hands the free buffers this thread caches for this pool back to the pool's free lists
    /// (for a thread about to idle; thread exit does it anyway).
    pub fn flush_thread_cache(&self) {
        crate::cache::flush(&self.shared);
    }

    /// Lends the filled bytes of `buf` (a buffer of this pool) to a peer for RDMA READs of one
    /// message: registers exactly `[buf.addr(), buf.addr() + buf.len())` as an MR of its own with
    /// REMOTE_READ only, whatever the pool's [`PoolConfig::access`]; the [`ReadLoan`] carries its
    /// rkey and deregisters it when dropped, before the buffer returns (module `loan`; the base
    /// of the rendezvous issue). Errors: [`MemError::InvalidConfig`] for an empty buffer, or a
    /// pool whose MRs grant a write made without [`PoolConfig::lends_for_read`] (its memory is
    /// not allocated readable by peers), [`MemError::NotPoolMemory`] for a buffer of another pool, [`MemError::Memlock`] /
    /// [`MemError::Verbs`] when the device refuses the registration.
    pub fn lend_for_read(&self, buf: RegisteredBuf) -> Result<ReadLoan, MemError> {
        if buf.is_empty() {
            return Err(MemError::InvalidConfig(
                "nothing to lend: the buffer is empty".into(),
            ));
        }
        let writes =
            byteexpress_verbs::Access::LOCAL_WRITE | byteexpress_verbs::Access::REMOTE_WRITE;
        let cfg = self.config();
        if !cfg.lends_for_read && cfg.access.0 & writes.0 != 0 {
            return Err(MemError::InvalidConfig(
                "the pool was not made to lend for READ (PoolConfig::lends_for_read)".into(),
            ));
        }
        let mr = self.shared.register_range(
            buf.addr(),
            buf.len(),
            byteexpress_verbs::Access::REMOTE_READ,
        )?;
        Ok(ReadLoan::new(mr, buf))
    }

    /// True when `ptr` lies in this pool's memory.
    pub fn contains(&self, ptr: *const u8) -> bool {
        self.shared.contains(ptr)
    }
}
