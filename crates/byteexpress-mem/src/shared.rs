//! The state every handle of one pool shares: per-class free lists, the chunks, the limit, the
//! waiters of exhausted allocations and the counters.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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
        })
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
