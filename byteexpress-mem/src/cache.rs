//! Thread-local caches: each thread keeps, per pool and class, a small stack of free buffers,
//! refilled from and flushed to the pool's free list in batches ([`crate::PoolConfig::batch`]).
//!
//! A buffer freed on another thread than the one that allocated it goes into the *freeing*
//! thread's cache for the buffer's own pool (the buffer knows its pool); from there it moves to
//! the pool's free list with the next flush. It never enters another pool and never needs the
//! allocating thread to be alive. While a task waits for memory ([`crate::Pool::alloc`]), frees
//! skip the caches and go straight to the free list, waking the waiter. When a thread ends, its
//! caches flush. A thread that stays idle keeps at most about `2 × batch` buffers (and
//! `2 × batch_bytes` bytes) per class; [`crate::Pool::flush_thread_cache`] hands them back.
//!
//! Cached slots carry leases that keep their pool alive (`crate::shared`). When a pool's last
//! handle drops it is orphaned: the dropping thread flushes its cache of it at once, every other
//! thread at its next free, cache refill or switch to another pool's cache (a global count of
//! orphanings, compared there, tells it to look) or at its exit, and frees of the orphan's
//! buffers bypass caches.
//!
//! The hot path: one thread-local access, a check that the most recently used cache is this
//! pool's (and, on free, that no pool was orphaned since the thread last looked), then a pop or
//! push on the class's stack. No atomic read-modify-write, no search.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::MemError;
use crate::backing::Slot;
use crate::shared::Shared;
use crate::stats::{CacheCounters, bump_owned, bump_shared};

/// Pools orphaned in this process so far; a thread whose last look is older sweeps its caches.
static ORPHANINGS: AtomicU64 = AtomicU64::new(0);

/// The free buffers of one class in one thread cache.
struct CacheBin {
    /// Each slot holds a lease of the pool.
    slots: Vec<Slot>,
    /// Buffers moved per refill or flush.
    batch: usize,
}

struct ThreadCache {
    pool_id: u64,
    /// Weak: the cache itself does not keep its pool alive; its slots' leases do.
    pool: Weak<Shared>,
    bins: Box<[CacheBin]>,
    counters: Arc<CacheCounters>,
}

impl ThreadCache {
    fn new(shared: &Arc<Shared>) -> Self {
        let n = shared.bins.len();
        ThreadCache {
            pool_id: shared.id,
            pool: Arc::downgrade(shared),
            bins: shared
                .bins
                .iter()
                .map(|b| CacheBin {
                    slots: Vec::new(),
                    batch: b.batch,
                })
                .collect(),
            counters: shared.counters.register(n),
        }
    }

    /// Moves every cached slot to the pool's free lists and gives their leases back. `shared` is
    /// this cache's pool, held strongly by the caller.
    fn flush_into(&mut self, shared: &Arc<Shared>) {
        let mut n = 0;
        for (class, bin) in self.bins.iter_mut().enumerate() {
            if !bin.slots.is_empty() {
                n += bin.slots.len();
                shared.put(class, bin.slots.drain(..));
            }
        }
        // SAFETY: the `n` slots just put back each held a lease, now owned by nobody else; the
        // caller's strong reference keeps the pool alive across the release.
        unsafe { Shared::release(Shared::raw(shared), n) };
    }

    /// Flushes and folds the counters into the pool's totals, when the pool is still alive
    /// (otherwise the cache holds no slot: each would have kept the pool alive).
    fn retire(&mut self) {
        if let Some(shared) = self.pool.upgrade() {
            self.flush_into(&shared);
            shared.counters.retire(&self.counters);
        }
    }
}

impl Drop for ThreadCache {
    fn drop(&mut self) {
        self.retire();
    }
}

/// This thread's caches, the most recently used first.
struct Caches {
    list: Vec<ThreadCache>,
    /// [`ORPHANINGS`] when this thread last swept its caches.
    seen: u64,
}

impl Caches {
    /// Hands back the slots of orphaned pools and forgets caches of dead pools.
    fn sweep(&mut self) {
        self.seen = ORPHANINGS.load(Ordering::Acquire);
        let mut i = 0;
        while i < self.list.len() {
            let keep = self
                .list
                .get(i)
                .and_then(|c| c.pool.upgrade())
                .is_some_and(|s| !s.orphaned.load(Ordering::Relaxed));
            if keep {
                i += 1;
            } else {
                // Flushes into the pool if it is still alive (ThreadCache::drop).
                drop(self.list.remove(i));
            }
        }
    }

    /// The cache of `shared` moved to the front, created if missing, after a sweep; `None` when
    /// the pool is orphaned (its buffers then go straight home).
    #[cold]
    #[inline(never)]
    fn find_slow(&mut self, shared: &Arc<Shared>) -> Option<&mut ThreadCache> {
        if self.seen != ORPHANINGS.load(Ordering::Relaxed) {
            self.sweep();
        }
        if shared.orphaned.load(Ordering::Relaxed) {
            return None;
        }
        match self.list.iter().position(|c| c.pool_id == shared.id) {
            Some(i) => self.list[..=i].rotate_right(1),
            None => self.list.insert(0, ThreadCache::new(shared)),
        }
        self.list.first_mut()
    }
}

thread_local! {
    static CACHES: RefCell<Caches> = const {
        RefCell::new(Caches {
            list: Vec::new(),
            seen: 0,
        })
    };
}

/// Runs `f` on this thread's cache for `shared`; `None` when the thread's caches are gone
/// (thread exit) or busy (re-entered), or the pool is orphaned, and the caller takes the
/// uncached path. `LOOK` compares [`ORPHANINGS`] even when the cache in front is this pool's: a
/// cache hit on allocation skips it (it cannot concern an orphaned pool), frees and every slow
/// path do it, so a thread sweeps at its next free or refill.
#[inline(always)]
fn with_cache<const LOOK: bool, R>(
    shared: &Arc<Shared>,
    f: impl FnOnce(&mut ThreadCache) -> R,
) -> Option<R> {
    CACHES
        .try_with(|caches| {
            let mut caches = caches.try_borrow_mut().ok()?;
            let caches = &mut *caches;
            let fresh = !LOOK || caches.seen == ORPHANINGS.load(Ordering::Relaxed);
            let tc = match caches.list.first_mut() {
                Some(tc) if fresh && tc.pool_id == shared.id => tc,
                _ => caches.find_slow(shared)?,
            };
            Some(f(tc))
        })
        .ok()
        .flatten()
}

/// One free buffer of `class` from this thread's cache, with its lease; `None` when the cache
/// has none (or cannot be used): then [`alloc`]. The whole hot path of an allocation.
#[inline(always)]
pub(crate) fn pop(shared: &Arc<Shared>, class: usize) -> Option<Slot> {
    with_cache::<false, _>(shared, |tc| {
        let s = tc.bins.get_mut(class)?.slots.pop()?;
        if let Some(c) = tc.counters.allocs.get(class) {
            bump_owned(c);
        }
        Some(s)
    })
    .flatten()
}

/// One free buffer of `class`, with its lease: from this thread's cache, else a batch from the
/// pool's free list (growing the pool if needed). Errors: [`MemError::Exhausted`], or the
/// backend's.
#[inline]
pub(crate) fn alloc(shared: &Arc<Shared>, class: usize) -> Result<Slot, MemError> {
    match pop(shared, class) {
        Some(s) => Ok(s),
        None => alloc_slow(shared, class),
    }
}

/// A miss: refills the cache with a batch from the pool's free list (leasing it) and takes one;
/// without a usable cache, takes one buffer straight from the pool.
#[cold]
#[inline(never)]
fn alloc_slow(shared: &Arc<Shared>, class: usize) -> Result<Slot, MemError> {
    match with_cache::<true, _>(shared, |tc| refill(shared, tc, class)) {
        Some(r) => r,
        None => alloc_uncached(shared, class),
    }
}

fn refill(shared: &Arc<Shared>, tc: &mut ThreadCache, class: usize) -> Result<Slot, MemError> {
    let bin = tc
        .bins
        .get_mut(class)
        .ok_or_else(|| shared.exhausted(class))?;
    if let Some(s) = bin.slots.pop() {
        // Not a miss after all (a cache created or re-entered since the fast path looked).
        if let Some(c) = tc.counters.allocs.get(class) {
            bump_owned(c);
        }
        return Ok(s);
    }
    bump_owned(&tc.counters.misses);
    let n = shared.take(class, bin.batch, &mut bin.slots)?;
    shared.lease(n);
    let s = bin.slots.pop().ok_or_else(|| shared.exhausted(class))?;
    if let Some(c) = tc.counters.allocs.get(class) {
        bump_owned(c);
    }
    Ok(s)
}

#[cold]
#[inline(never)]
fn alloc_uncached(shared: &Arc<Shared>, class: usize) -> Result<Slot, MemError> {
    let mut one = Vec::with_capacity(1);
    let n = shared.take(class, 1, &mut one)?;
    shared.lease(n);
    let Some(s) = one.pop() else {
        return Err(shared.exhausted(class));
    };
    bump_shared(&shared.counters.uncached.allocs[class]);
    Ok(s)
}

/// Gives a buffer of `class` back: into this thread's cache (flushing a batch when it holds more
/// than two), or straight to the pool when someone waits for memory or the pool is orphaned.
///
/// # Safety
/// `pool` comes from [`Arc::as_ptr`] of the buffer's pool, and `slot` holds one lease of it,
/// which the caller hands over with the slot.
#[inline(always)]
pub(crate) unsafe fn free(pool: NonNull<Shared>, class: usize, slot: Slot) {
    {
        // SAFETY: the slot's lease keeps the pool alive until it is given back below (or it
        // moves with the slot into a cache, which then owns it); `shared` dies before that.
        let shared = unsafe { Shared::leased(pool) };
        let shared: &Arc<Shared> = &shared;
        if shared.waiters.load(Ordering::Relaxed) == 0 {
            let cached = with_cache::<true, _>(shared, |tc| {
                let Some(bin) = tc.bins.get_mut(class) else {
                    return false;
                };
                bin.slots.push(slot);
                if let Some(c) = tc.counters.frees.get(class) {
                    bump_owned(c);
                }
                if bin.slots.len() > 2 * bin.batch {
                    flush_batch(shared, class, bin);
                }
                true
            });
            if cached == Some(true) {
                return;
            }
        }
        free_uncached(shared, class, slot);
    }
    // SAFETY: the slot's lease is ours (it went into no cache) and its slot is back on the free
    // list; nothing touches the pool after this.
    unsafe { Shared::release(pool, 1) };
}

#[cold]
#[inline(never)]
fn free_uncached(shared: &Shared, class: usize, slot: Slot) {
    if let Some(c) = shared.counters.uncached.frees.get(class) {
        bump_shared(c);
    }
    shared.put(class, [slot]);
}

/// The oldest `batch` entries of a full bin go back to the pool; the most recently freed
/// (cache-hot) stay.
#[cold]
#[inline(never)]
fn flush_batch(shared: &Arc<Shared>, class: usize, bin: &mut CacheBin) {
    let n = bin.batch.min(bin.slots.len());
    shared.put(class, bin.slots.drain(..n));
    // SAFETY: the `n` slots just put back each held a lease owned by this cache; the cache still
    // holds more than `n` leased slots, so the count cannot reach zero here.
    unsafe { Shared::release(Shared::raw(shared), n) };
}

/// Moves everything this thread caches for `shared` to the pool's free lists.
pub(crate) fn flush(shared: &Arc<Shared>) {
    with_cache::<true, _>(shared, |tc| tc.flush_into(shared));
}

/// Called when the last handle of a pool dropped (`shared.orphaned` set): makes every thread
/// sweep its caches, this one now.
pub(crate) fn orphaned() {
    ORPHANINGS.fetch_add(1, Ordering::Release);
    let _ = CACHES.try_with(|caches| {
        if let Ok(mut caches) = caches.try_borrow_mut() {
            caches.sweep();
        }
    });
}
