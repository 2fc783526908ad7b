//! [`RecvReserve`]: buffers set aside for receives, out of reach of ordinary allocations.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use crate::MemError;
use crate::backing::Slot;
use crate::buf::{Home, RegisteredBuf};
use crate::shared::Shared;
use crate::stats::bump_shared;

pub(crate) struct ReserveInner {
    shared: Arc<Shared>,
    class: usize,
    buf_len: usize,
    count: usize,
    free: Mutex<Vec<Slot>>,
}

impl fmt::Debug for ReserveInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvReserve")
            .field("buf_len", &self.buf_len)
            .field("count", &self.count)
            .field("available", &self.free.lock().len())
            .finish()
    }
}

impl ReserveInner {
    pub(crate) fn give_back(&self, slot: Slot) {
        self.free.lock().push(slot);
        self.shared.counters.reserved_out[self.class].fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for ReserveInner {
    fn drop(&mut self) {
        // Every buffer is back (each holds an Arc of this reserve): all return to the pool.
        let slots = std::mem::take(&mut *self.free.lock());
        self.shared.counters.reserved[self.class].fetch_sub(self.count as u64, Ordering::Relaxed);
        self.shared.put(self.class, slots);
    }
}

/// `count` buffers of `buf_size` bytes set aside from a pool ([`crate::Pool::reserve`]) for
/// receive WRs: allocations from the pool itself can never take them, so however full the send
/// side runs, a receive can always be re-posted. A buffer taken from a reserve returns to the
/// reserve when dropped; the reserve's buffers return to the pool when the reserve and all its
/// buffers are gone. Cloning shares the reserve.
#[derive(Debug, Clone)]
pub struct RecvReserve {
    inner: Arc<ReserveInner>,
}

impl RecvReserve {
    pub(crate) fn new(shared: Arc<Shared>, class: usize, buf_len: usize, slots: Vec<Slot>) -> Self {
        let count = slots.len();
        shared.counters.reserved[class].fetch_add(count as u64, Ordering::Relaxed);
        RecvReserve {
            inner: Arc::new(ReserveInner {
                shared,
                class,
                buf_len,
                count,
                free: Mutex::new(slots),
            }),
        }
    }

    /// A free buffer of the reserve (length 0, capacity [`RecvReserve::buf_size`]). Errors:
    /// [`MemError::ReserveEmpty`] when all are out.
    pub fn take(&self) -> Result<RegisteredBuf, MemError> {
        let r = &self.inner;
        let Some(slot) = r.free.lock().pop() else {
            bump_shared(&r.shared.counters.exhaustions);
            return Err(MemError::ReserveEmpty {
                count: r.count,
                buf_size: r.buf_len,
            });
        };
        bump_shared(&r.shared.counters.reserved_out[r.class]);
        Ok(RegisteredBuf::new(
            slot,
            r.buf_len,
            r.class,
            Home::Reserve(self.inner.clone()),
        ))
    }

    /// Bytes per buffer (the length asked for at reservation).
    pub fn buf_size(&self) -> usize {
        self.inner.buf_len
    }

    /// Buffers in the reserve.
    pub fn count(&self) -> usize {
        self.inner.count
    }

    /// Buffers free right now.
    pub fn available(&self) -> usize {
        self.inner.free.lock().len()
    }

    /// True when `ptr` lies in the memory of the pool this reserve belongs to.
    pub fn contains(&self, ptr: *const u8) -> bool {
        self.inner.shared.contains(ptr)
    }

    /// The pool's counters.
    pub fn stats(&self) -> crate::PoolStats {
        crate::PoolStats::snapshot(&self.inner.shared)
    }
}
