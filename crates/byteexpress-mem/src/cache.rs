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

use std::cell::RefCell;
use std::sync::{Arc, Weak};

use crate::MemError;
use crate::backing::Slot;
use crate::shared::Shared;
use crate::stats::{CacheCounters, bump_owned, bump_shared};

struct ThreadCache {
    pool_id: u64,
    pool: Weak<Shared>,
    bins: Box<[Vec<Slot>]>,
    counters: Arc<CacheCounters>,
}

impl ThreadCache {
    fn new(shared: &Arc<Shared>) -> Self {
        let n = shared.bins.len();
        ThreadCache {
            pool_id: shared.id,
            pool: Arc::downgrade(shared),
            bins: (0..n).map(|_| Vec::new()).collect(),
            counters: shared.counters.register(n),
        }
    }

    fn flush_into(&mut self, shared: &Shared) {
        for (class, bin) in self.bins.iter_mut().enumerate() {
            if !bin.is_empty() {
                shared.put(class, bin.drain(..));
            }
        }
    }
}

impl Drop for ThreadCache {
    fn drop(&mut self) {
        if let Some(shared) = self.pool.upgrade() {
            self.flush_into(&shared);
            shared.counters.retire(&self.counters);
        }
    }
}

thread_local! {
    static CACHES: RefCell<Vec<ThreadCache>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's cache for `shared`; `None` when the thread's caches are gone
/// (thread exit) or busy (re-entered), and the caller takes the uncached path.
fn with_cache<R>(shared: &Arc<Shared>, f: impl FnOnce(&mut ThreadCache) -> R) -> Option<R> {
    CACHES
        .try_with(|caches| {
            let mut caches = caches.try_borrow_mut().ok()?;
            let i = match caches.iter().position(|c| c.pool_id == shared.id) {
                Some(i) => i,
                None => {
                    caches.retain(|c| c.pool.strong_count() > 0);
                    caches.push(ThreadCache::new(shared));
                    caches.len() - 1
                }
            };
            Some(f(&mut caches[i]))
        })
        .ok()
        .flatten()
}

/// One free buffer of `class`: from this thread's cache, else a batch from the pool's free list
/// (growing the pool if needed). Errors: [`MemError::Exhausted`], or the backend's.
pub(crate) fn alloc(shared: &Arc<Shared>, class: usize) -> Result<Slot, MemError> {
    let cached = with_cache(shared, |tc| {
        let bin = &mut tc.bins[class];
        if let Some(s) = bin.pop() {
            bump_owned(&tc.counters.hits);
            bump_owned(&tc.counters.allocs[class]);
            return Ok(s);
        }
        bump_owned(&tc.counters.misses);
        shared.take(class, shared.bins[class].batch, bin)?;
        let s = bin.pop().ok_or_else(|| shared.exhausted(class))?;
        bump_owned(&tc.counters.allocs[class]);
        Ok(s)
    });
    if let Some(r) = cached {
        return r;
    }
    let mut one = Vec::with_capacity(1);
    shared.take(class, 1, &mut one)?;
    let s = one.pop().ok_or_else(|| shared.exhausted(class))?;
    bump_shared(&shared.counters.uncached.allocs[class]);
    Ok(s)
}

/// Gives a buffer of `class` back: into this thread's cache (flushing a batch when it holds more
/// than two), or straight to the pool when someone waits for memory.
pub(crate) fn free(shared: &Arc<Shared>, class: usize, slot: Slot) {
    if shared.waiters.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        let cached = with_cache(shared, |tc| {
            let bin = &mut tc.bins[class];
            bin.push(slot);
            bump_owned(&tc.counters.frees[class]);
            let batch = shared.bins[class].batch;
            if bin.len() > 2 * batch {
                // The oldest entries go; the most recently freed (cache-hot) stay.
                shared.put(class, bin.drain(..batch));
            }
        });
        if cached.is_some() {
            return;
        }
    }
    bump_shared(&shared.counters.uncached.frees[class]);
    shared.put(class, [slot]);
}

/// Moves everything this thread caches for `shared` to the pool's free lists.
pub(crate) fn flush(shared: &Arc<Shared>) {
    with_cache(shared, |tc| tc.flush_into(shared));
}
