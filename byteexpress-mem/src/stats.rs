//! Counters of a pool and the snapshot [`PoolStats`] built from them.
//!
//! Hot-path counters live in each thread's cache and are written by that thread alone (a plain
//! load and store, no locked instruction); a snapshot adds them up. Under concurrent use a
//! snapshot is approximate; once every thread is quiet it is exact. A cache hit bumps one
//! counter only: hits are the cache's allocations minus its misses (every allocation through a
//! cache is one or the other).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::shared::Shared;

/// Counters of one thread cache (or of the uncached paths, then updated with atomic adds).
#[derive(Debug)]
pub(crate) struct CacheCounters {
    /// Allocations that refilled the cache (the others of `allocs` were hits).
    pub misses: AtomicU64,
    /// Buffers handed out per class.
    pub allocs: Box<[AtomicU64]>,
    /// Buffers given back per class.
    pub frees: Box<[AtomicU64]>,
}

impl CacheCounters {
    pub(crate) fn new(classes: usize) -> Self {
        CacheCounters {
            misses: AtomicU64::new(0),
            allocs: (0..classes).map(|_| AtomicU64::new(0)).collect(),
            frees: (0..classes).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

/// Adds one to a counter only the current thread writes (readers may see the old value).
#[inline]
pub(crate) fn bump_owned(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

/// Adds one to a counter several threads write.
#[inline]
pub(crate) fn bump_shared(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[derive(Debug, Default)]
struct Totals {
    hits: u64,
    misses: u64,
    allocs: Vec<u64>,
    frees: Vec<u64>,
}

impl Totals {
    /// Adds the counters of a thread cache (`cached`: its allocations are hits or misses) or of
    /// the uncached paths.
    fn add(&mut self, c: &CacheCounters, cached: bool) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let misses = get(&c.misses);
        let mut allocs = 0u64;
        self.misses += misses;
        for (t, a) in self.allocs.iter_mut().zip(c.allocs.iter()) {
            let n = get(a);
            allocs = allocs.wrapping_add(n);
            *t += n;
        }
        if cached {
            // Read apart from `misses`, so only approximate while the cache's thread runs.
            self.hits += allocs.saturating_sub(misses);
        }
        for (t, a) in self.frees.iter_mut().zip(c.frees.iter()) {
            *t += get(a);
        }
    }
}

#[derive(Debug)]
struct CacheRegistry {
    live: Vec<Arc<CacheCounters>>,
    /// Counters of thread caches whose thread ended.
    retired: Totals,
}

/// The pool-wide counters.
#[derive(Debug)]
pub(crate) struct Counters {
    pub waits: AtomicU64,
    pub exhaustions: AtomicU64,
    /// Allocations and frees that bypassed thread caches (atomic adds).
    pub uncached: CacheCounters,
    /// Buffers per class held by receive reserves.
    pub reserved: Box<[AtomicU64]>,
    /// Of those, buffers handed out right now.
    pub reserved_out: Box<[AtomicU64]>,
    caches: Mutex<CacheRegistry>,
}

impl Counters {
    pub(crate) fn new(classes: usize) -> Self {
        Counters {
            waits: AtomicU64::new(0),
            exhaustions: AtomicU64::new(0),
            uncached: CacheCounters::new(classes),
            reserved: (0..classes).map(|_| AtomicU64::new(0)).collect(),
            reserved_out: (0..classes).map(|_| AtomicU64::new(0)).collect(),
            caches: Mutex::new(CacheRegistry {
                live: Vec::new(),
                retired: Totals {
                    allocs: vec![0; classes],
                    frees: vec![0; classes],
                    ..Totals::default()
                },
            }),
        }
    }

    /// A new thread cache's counters, counted from now on.
    pub(crate) fn register(&self, classes: usize) -> Arc<CacheCounters> {
        let c = Arc::new(CacheCounters::new(classes));
        self.caches.lock().live.push(c.clone());
        c
    }

    /// Folds the counters of an ending thread cache into the totals.
    pub(crate) fn retire(&self, c: &Arc<CacheCounters>) {
        let mut reg = self.caches.lock();
        reg.retired.add(c, true);
        reg.live.retain(|x| !Arc::ptr_eq(x, c));
    }

    fn totals(&self) -> Totals {
        let reg = self.caches.lock();
        let mut t = Totals {
            hits: reg.retired.hits,
            misses: reg.retired.misses,
            allocs: reg.retired.allocs.clone(),
            frees: reg.retired.frees.clone(),
        };
        for c in &reg.live {
            t.add(c, true);
        }
        t.add(&self.uncached, false);
        t
    }
}

/// Buffers of one size class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassStats {
    /// Bytes per buffer.
    pub size: usize,
    /// Buffers handed out and not yet returned (from the pool and from reserves).
    pub in_use: u64,
    /// Buffers set aside in receive reserves (in use or not).
    pub reserved: u64,
    /// Chunks carved into this class right now.
    pub chunks: usize,
}

/// A snapshot of a pool's counters ([`crate::Pool::stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes registered with the device (reserves included).
    pub bytes_registered: u64,
    /// The configured limit in bytes.
    pub limit: u64,
    /// Chunks allocated.
    pub chunks: usize,
    /// MRs registered (more than `chunks` when chunks exceed `max_mr_size`).
    pub mrs: usize,
    /// Per size class, smallest first.
    pub classes: Vec<ClassStats>,
    /// Allocations served from a thread cache.
    pub cache_hits: u64,
    /// Allocations that refilled a thread cache from the pool's free lists.
    pub cache_misses: u64,
    /// Calls of [`crate::Pool::alloc`] that had to wait.
    pub waits: u64,
    /// Allocations refused for exhaustion (including waits that hit their deadline) and reserve
    /// takes that found the reserve empty.
    pub exhaustions: u64,
}

impl PoolStats {
    /// Buffers in use over all classes.
    pub fn in_use(&self) -> u64 {
        self.classes.iter().map(|c| c.in_use).sum()
    }

    /// Bytes of the buffers in use (class sizes, not requested lengths).
    pub fn in_use_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.in_use * c.size as u64).sum()
    }

    pub(crate) fn snapshot(shared: &Shared) -> Self {
        let t = shared.counters.totals();
        let (chunks, mrs, per_class) = shared.chunk_counts();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let classes = (0..shared.bins.len())
            .map(|c| ClassStats {
                size: shared.bins[c].size,
                in_use: t.allocs[c].saturating_sub(t.frees[c])
                    + load(&shared.counters.reserved_out[c]),
                reserved: load(&shared.counters.reserved[c]),
                chunks: per_class[c],
            })
            .collect();
        PoolStats {
            bytes_registered: shared.registered(),
            limit: shared.cfg.limit,
            chunks,
            mrs,
            classes,
            cache_hits: t.hits,
            cache_misses: t.misses,
            waits: load(&shared.counters.waits),
            exhaustions: load(&shared.counters.exhaustions),
        }
    }
}
