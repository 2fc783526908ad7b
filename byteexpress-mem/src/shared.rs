//! The state every handle of one pool shares: per-class free lists, the chunks, the limit, the
//! waiters of exhausted allocations, the counters, and the leases that keep it alive.
//!
//! # Leases
//! A buffer of the pool does not hold an `Arc<Shared>` (a reference-count increment and decrement
//! per buffer would be most of the cost of a cached allocation). Instead every slot that is off
//! the pool's free lists and outside receive reserves — in a thread cache or held by a
//! [`crate::RegisteredBuf`] — carries one *lease*, and the leases together hold one strong count
//! of the `Arc<Shared>` while there is at least one. A slot moving between a thread cache and a
//! buffer carries its lease along without touching any counter, so the cached path is free of
//! atomic read-modify-writes; leases are taken and given back in batches, on refill and flush.
//! Whoever holds a lease may use a raw pointer to the `Shared` until it gives the lease back.
//!
//! Cached slots would keep a pool alive after its last handle: when the last [`crate::Pool`]
//! handle drops, the pool is marked orphaned and every thread flushes its cache of it at its next
//! free or cache refill in any pool, or at its exit (`crate::cache`).

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::backing::{Backend, Chunk, Slot};
use crate::class::Classes;
use crate::stats::Counters;
use crate::{MemError, PoolConfig};

/// The pool-wide free list of one class.
#[derive(Debug)]
pub(crate) struct Bin {
    /// Bytes per buffer.
    pub size: usize,
    /// Buffers moved per refill or flush of a thread cache.
    pub batch: usize,
    free: Mutex<Vec<Slot>>,
}

#[derive(Debug)]
struct ChunkEntry {
    chunk: Chunk,
    /// The class whose buffers the chunk is carved into right now.
    class: usize,
}

/// What [`crate::Pool`] handles, buffers and reserves of one pool point to.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Unique per pool in this process (thread caches are keyed by it).
    pub id: u64,
    pub cfg: PoolConfig,
    pub classes: Classes,
    pub bins: Box<[Bin]>,
    backend: Box<dyn Backend>,
    /// Taken to grow or re-carve; lock order: `chunks` before any bin.
    chunks: Mutex<Vec<ChunkEntry>>,
    registered: AtomicU64,
    /// Tasks waiting in [`crate::Pool::alloc`]: while non-zero, frees skip thread caches so the
    /// memory reaches the free lists (and the waiters) at once.
    pub waiters: AtomicUsize,
    pub notify: Notify,
    pub counters: Counters,
    /// Slots off the free lists and outside reserves (module docs); while non-zero they hold one
    /// strong count of the `Arc<Shared>`.
    leases: AtomicUsize,
    /// [`crate::Pool`] handles alive; the pool is orphaned when it reaches 0.
    pub handles: AtomicUsize,
    /// Set when the last [`crate::Pool`] handle dropped: no allocation can come through a thread
    /// cache any more, so caches hand their slots back and frees bypass them.
    pub orphaned: AtomicBool,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Shared {
    pub(crate) fn new(backend: Box<dyn Backend>, cfg: PoolConfig) -> Result<Self, MemError> {
        cfg.validate()?;
        let classes = Classes::new(cfg.min_class, cfg.max_class);
        let bins = (0..classes.count())
            .map(|c| Bin {
                size: classes.size(c),
                batch: cfg.batch_for(classes.size(c)),
                free: Mutex::new(Vec::new()),
            })
            .collect();
        Ok(Shared {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            classes,
            bins,
            backend,
            chunks: Mutex::new(Vec::new()),
            registered: AtomicU64::new(0),
            waiters: AtomicUsize::new(0),
            notify: Notify::new(),
            counters: Counters::new(classes.count()),
            cfg,
            leases: AtomicUsize::new(0),
            handles: AtomicUsize::new(1),
            orphaned: AtomicBool::new(false),
        })
    }

    /// The pointer buffers hold (from [`Arc::as_ptr`], so it can name the `Arc` again).
    #[inline]
    pub(crate) fn raw(self: &Arc<Self>) -> NonNull<Shared> {
        // SAFETY: `Arc::as_ptr` never returns null.
        unsafe { NonNull::new_unchecked(Arc::as_ptr(self).cast_mut()) }
    }

    /// Takes `n` leases, one per slot just taken off the free lists by the caller, before any of
    /// those slots is handed on. The caller holds a strong reference (or a lease), so `self`
    /// stays alive meanwhile.
    pub(crate) fn lease(self: &Arc<Self>, n: usize) {
        if n > 0 && self.leases.fetch_add(n, Ordering::Relaxed) == 0 {
            // SAFETY: the pointer comes from a live `Arc` (the caller's), so the strong count is
            // at least one. This increment belongs to the lease count leaving zero; the matching
            // decrement in `release` runs when it returns to zero, which needs these `n` leases
            // back, and they are handed on only after this call returns, so the increment always
            // precedes its decrement.
            unsafe { Arc::increment_strong_count(Arc::as_ptr(self)) };
        }
    }

    /// Gives back `n` leases of the pool at `ptr`, whose slots the caller has just put back on
    /// the free lists.
    ///
    /// # Safety
    /// The caller owns `n` leases of this pool. Unless it also holds a strong reference of its
    /// own, it must not touch `*ptr` afterwards: this may free the pool.
    pub(crate) unsafe fn release(ptr: NonNull<Shared>, n: usize) {
        if n == 0 {
            return;
        }
        // SAFETY: the caller's leases keep the pool alive up to this decrement. The place
        // expression borrows only the atomic (interior-mutable, as `Arc::drop` does), not the
        // whole `Shared`. AcqRel orders every use of the pool before a possible free below.
        let before = unsafe { (*ptr.as_ptr()).leases.fetch_sub(n, Ordering::AcqRel) };
        debug_assert!(before >= n, "more leases given back than taken");
        if before == n {
            // SAFETY: the lease count went back to zero: this drops the strong count that the
            // leases held since it left zero (`lease`), on the pointer `lease` took it from.
            unsafe { Arc::decrement_strong_count(ptr.as_ptr().cast_const()) };
        }
    }

    /// The `Arc` a lease keeps alive, borrowed without touching the reference count.
    ///
    /// # Safety
    /// The caller owns a lease of the pool at `ptr` (which came from [`Arc::as_ptr`]) for as long
    /// as it uses the result.
    #[inline(always)]
    pub(crate) unsafe fn leased(ptr: NonNull<Shared>) -> ManuallyDrop<Arc<Shared>> {
        // SAFETY: the leases hold a strong count of this very `Arc` (`lease`), so it is live;
        // `ManuallyDrop` keeps this borrowed `Arc` from decrementing the count it does not own.
        ManuallyDrop::new(unsafe { Arc::from_raw(ptr.as_ptr().cast_const()) })
    }

    /// Slots leased right now (in thread caches or buffers).
    #[cfg(test)]
    pub(crate) fn leases(&self) -> usize {
        self.leases.load(Ordering::Relaxed)
    }

    /// Bytes registered so far.
    pub(crate) fn registered(&self) -> u64 {
        self.registered.load(Ordering::Relaxed)
    }

    /// `(chunks, MRs, chunks per class)` right now.
    pub(crate) fn chunk_counts(&self) -> (usize, usize, Vec<usize>) {
        let chunks = self.chunks.lock();
        let mut per_class = vec![0; self.bins.len()];
        for e in chunks.iter() {
            per_class[e.class] += 1;
        }
        (
            chunks.len(),
            chunks.iter().map(|e| e.chunk.mrs()).sum(),
            per_class,
        )
    }

    /// Registers `[addr, addr + len)`, which must lie in one chunk of this pool, once more as its
    /// own MR with `access` ([`crate::ReadLoan`]). The registration runs without the pool's
    /// lock. Errors: [`MemError::NotPoolMemory`], registration errors.
    pub(crate) fn register_range(
        &self,
        addr: u64,
        len: usize,
        access: byteexpress_verbs::Access,
    ) -> Result<crate::backing::Extra, MemError> {
        let outside = MemError::NotPoolMemory { addr, len };
        let (hold, off) = {
            let chunks = self.chunks.lock();
            let e = chunks
                .iter()
                .find(|e| {
                    let base = e.chunk.base() as u64;
                    addr >= base
                        && addr
                            .checked_add(len as u64)
                            .is_some_and(|end| end <= base + e.chunk.len() as u64)
                })
                .ok_or(outside)?;
            (e.chunk.hold(), (addr - e.chunk.base() as u64) as usize)
        };
        self.backend
            .register(&*hold, off, len, access, self.registered())
    }

    /// True when `ptr` lies in one of this pool's chunks.
    pub(crate) fn contains(&self, ptr: *const u8) -> bool {
        let Some(p) = std::ptr::NonNull::new(ptr.cast_mut()) else {
            return false;
        };
        self.chunks.lock().iter().any(|e| e.chunk.contains(p))
    }

    pub(crate) fn exhausted(&self, class: usize) -> MemError {
        MemError::Exhausted {
            class_size: self.bins[class].size,
            registered: self.registered(),
            limit: self.cfg.limit,
        }
    }

    /// Moves up to `want` (at least one) free buffers of `class` into `out`, growing the pool when
    /// its free list is empty. Errors: [`MemError::Exhausted`] at the limit, or the backend's.
    pub(crate) fn take(
        &self,
        class: usize,
        want: usize,
        out: &mut Vec<Slot>,
    ) -> Result<usize, MemError> {
        loop {
            {
                let mut free = self.bins[class].free.lock();
                let n = want.max(1).min(free.len());
                if n > 0 {
                    let at = free.len() - n;
                    out.extend(free.drain(at..));
                    return Ok(n);
                }
            }
            self.grow(class)?;
        }
    }

    /// Returns buffers of `class` to its free list and wakes waiting allocations.
    pub(crate) fn put(&self, class: usize, slots: impl IntoIterator<Item = Slot>) {
        self.bins[class].free.lock().extend(slots);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }

    /// Gives `class` fresh buffers: a new chunk within the limit, else a chunk of another class
    /// whose buffers are all on that class's free list. Ok also when another thread refilled the
    /// list meanwhile.
    fn grow(&self, class: usize) -> Result<(), MemError> {
        let mut chunks = self.chunks.lock();
        if !self.bins[class].free.lock().is_empty() {
            return Ok(());
        }
        let len = self.cfg.chunk_size;
        let registered = self.registered();
        if registered + len as u64 <= self.cfg.limit {
            let chunk = self.backend.grow(len, self.cfg.mr_span(), registered)?;
            self.registered
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            self.bins[class]
                .free
                .lock()
                .extend(chunk.carve(self.bins[class].size));
            chunks.push(ChunkEntry { chunk, class });
            return Ok(());
        }
        if self.recarve_idle_chunk(&mut chunks, class) {
            return Ok(());
        }
        Err(self.exhausted(class))
    }

    /// Finds a chunk of another class none of whose buffers is out (all on the free list, none in
    /// a thread cache or a reserve), takes them off that list and carves the chunk for `class`.
    /// The chunk stays registered: no MR is created or destroyed.
    fn recarve_idle_chunk(&self, chunks: &mut [ChunkEntry], class: usize) -> bool {
        for other in (0..self.bins.len()).filter(|&c| c != class) {
            let mut owned: Vec<usize> = (0..chunks.len())
                .filter(|&i| chunks[i].class == other)
                .collect();
            if owned.is_empty() {
                continue;
            }
            let per_chunk = self.cfg.chunk_size / self.bins[other].size;
            let mut free = self.bins[other].free.lock();
            if free.len() < per_chunk {
                continue;
            }
            owned.sort_by_key(|&i| chunks[i].chunk.base());
            let mut counts = vec![0usize; owned.len()];
            for s in free.iter() {
                let p = s.ptr.as_ptr() as usize;
                let j = owned.partition_point(|&i| chunks[i].chunk.base() <= p);
                if j > 0 && chunks[owned[j - 1]].chunk.contains(s.ptr) {
                    counts[j - 1] += 1;
                }
            }
            let Some(j) = counts.iter().position(|&n| n == per_chunk) else {
                continue;
            };
            let idle = &mut chunks[owned[j]];
            free.retain(|s| !idle.chunk.contains(s.ptr));
            drop(free);
            idle.class = class;
            self.bins[class]
                .free
                .lock()
                .extend(idle.chunk.carve(self.bins[class].size));
            return true;
        }
        false
    }
}
