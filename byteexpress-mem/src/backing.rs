//! Where chunks come from: registered memory of a PD, or (tests under miri) the heap.

use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use byteexpress_verbs::{Access, Mr, Pd, SharedMem};

use crate::MemError;

/// Local and remote key of the MR that covers a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Keys {
    pub lkey: u32,
    pub rkey: u32,
}

impl Keys {
    /// The keys of `mr`.
    pub(crate) fn of(mr: &Mr) -> Keys {
        Keys {
            lkey: mr.lkey(),
            rkey: mr.rkey(),
        }
    }
}

/// One free buffer: its first byte and the keys of the MR around it. A token, not an owner:
/// whoever holds a slot (a free list, a thread cache, a buffer) is the only one to use it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    pub ptr: NonNull<u8>,
    pub keys: Keys,
}

// SAFETY: a slot is an address plus keys; moving it between threads moves the exclusive right
// to the buffer, which the pool hands to one holder at a time.
unsafe impl Send for Slot {}
// SAFETY: sharing `&Slot` only reveals the address and keys, never the bytes.
unsafe impl Sync for Slot {}

/// A registered chunk: `len` bytes at `base`, registered as MRs of `span` bytes each (the last
/// one may be shorter). Dropping it deregisters and frees the memory (through `_hold`).
pub(crate) struct Chunk {
    base: NonNull<u8>,
    len: usize,
    span: usize,
    keys: Vec<Keys>,
    /// The memory and its MRs (what the backend made); shared so that a registration of part of
    /// the chunk ([`Backend::register`]) can run without the pool's lock.
    hold: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the chunk owns its mapping through `_hold` (Send + Sync); `base` only names it.
unsafe impl Send for Chunk {}
// SAFETY: as for Send; the chunk itself never reads or writes the bytes.
unsafe impl Sync for Chunk {}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunk")
            .field("base", &self.base)
            .field("len", &self.len)
            .field("mrs", &self.keys.len())
            .finish()
    }
}

impl Chunk {
    fn new(
        base: NonNull<u8>,
        len: usize,
        span: usize,
        keys: Vec<Keys>,
        hold: Arc<dyn Any + Send + Sync>,
    ) -> Self {
        crate::registry::add(base.as_ptr() as usize, len);
        Chunk {
            base,
            len,
            span,
            keys,
            hold,
        }
    }

    /// What the backend keeps the memory alive with (for [`Backend::register`]).
    pub(crate) fn hold(&self) -> Arc<dyn Any + Send + Sync> {
        self.hold.clone()
    }

    /// Address of the first byte.
    pub(crate) fn base(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// Bytes in the chunk.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Number of MRs covering the chunk.
    pub(crate) fn mrs(&self) -> usize {
        self.keys.len()
    }

    /// True when `ptr` lies inside the chunk.
    pub(crate) fn contains(&self, ptr: NonNull<u8>) -> bool {
        let (p, b) = (ptr.as_ptr() as usize, self.base.as_ptr() as usize);
        p >= b && p - b < self.len
    }

    /// Every buffer of `size` bytes (a power of two no larger than the span) the chunk holds,
    /// lowest address last, so a `Vec` used as a stack hands out low addresses first.
    pub(crate) fn carve(&self, size: usize) -> impl Iterator<Item = Slot> + '_ {
        (0..self.len / size).rev().map(move |i| {
            let off = i * size;
            Slot {
                // SAFETY: `off + size <= len`, so the pointer stays inside the chunk's memory.
                ptr: unsafe { self.base.add(off) },
                keys: self.keys[off / self.span],
            }
        })
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        crate::registry::remove(self.base.as_ptr() as usize);
    }
}

/// An extra registration of part of a chunk ([`crate::ReadLoan`]): its keys, and the MR that is
/// deregistered when this is dropped.
pub(crate) struct Extra {
    pub keys: Keys,
    pub _mr: Box<dyn Any + Send + Sync>,
}

impl fmt::Debug for Extra {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Extra").field("keys", &self.keys).finish()
    }
}

/// A source of registered chunks.
pub(crate) trait Backend: Send + Sync + fmt::Debug {
    /// Allocates `len` bytes and registers them in MRs of `span` bytes. `registered` is what the
    /// pool holds already (for the RLIMIT_MEMLOCK diagnosis).
    fn grow(&self, len: usize, span: usize, registered: u64) -> Result<Chunk, MemError>;

    /// Registers `[off, off + len)` of the chunk held by `hold` ([`Chunk::hold`]) once more, as
    /// its own MR with `access` (`ibv_reg_mr(3)` allows overlapping MRs). `registered` as for
    /// `grow`.
    fn register(
        &self,
        hold: &(dyn Any + Send + Sync),
        off: usize,
        len: usize,
        access: Access,
        registered: u64,
    ) -> Result<Extra, MemError>;
}

/// Chunks from [`Pd::alloc_shared_for`] (the pool's access as the hint), registered with
/// [`Pd::reg_shared`].
#[derive(Debug)]
pub(crate) struct VerbsBackend {
    pub pd: Pd,
    pub access: Access,
    pub huge_pages: bool,
    /// The pool lends messages for READ (`PoolConfig::lends_for_read`).
    pub lends_for_read: bool,
}

impl Backend for VerbsBackend {
    fn grow(&self, len: usize, span: usize, registered: u64) -> Result<Chunk, MemError> {
        // The provider's exposure hint (the soft provider maps memory to a peer by it). Memory
        // the pool's MRs never let anyone write is a SEND source the peer reads in place and
        // may be lent for an RDMA READ of one message (an MR of its own, REMOTE_READ): hint
        // REMOTE_READ for it, so a peer may at most read it; so for a pool that lends. Other
        // memory is hinted as registered (LOCAL_WRITE only: no peer maps it).
        let writes = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let hint = if self.access.0 & writes.0 == 0 || self.lends_for_read {
            self.access | Access::REMOTE_READ
        } else {
            self.access
        };
        let mem = self.pd.alloc_shared_for(len, hint)?;
        if self.huge_pages {
            // SAFETY: the range is the whole live mapping we just got; MADV_HUGEPAGE only changes
            // how the kernel backs it. Refusals (EINVAL where THP is off) are ignored on purpose.
            unsafe { libc::madvise(mem.as_ptr().cast(), mem.len(), libc::MADV_HUGEPAGE) };
        }
        let mut mrs = Vec::with_capacity(len.div_ceil(span));
        let mut off = 0;
        while off < len {
            let piece = span.min(len - off);
            let mr = self
                .pd
                .reg_shared(&mem, off, piece, self.access)
                .map_err(|e| {
                    crate::error::registration_error(e, registered + off as u64, piece as u64)
                })?;
            mrs.push(mr);
            off += piece;
        }
        let keys = mrs.iter().map(Keys::of).collect();
        let base = NonNull::new(mem.as_ptr()).ok_or_else(|| {
            MemError::InvalidConfig("alloc_shared returned a null mapping".into())
        })?;
        Ok(Chunk::new(base, len, span, keys, Arc::new((mem, mrs))))
    }

    fn register(
        &self,
        hold: &(dyn Any + Send + Sync),
        off: usize,
        len: usize,
        access: Access,
        registered: u64,
    ) -> Result<Extra, MemError> {
        let (mem, _) = hold
            .downcast_ref::<(SharedMem, Vec<Mr>)>()
            .expect("VerbsBackend chunks hold (SharedMem, Vec<Mr>)");
        let mr = self
            .pd
            .reg_shared(mem, off, len, access)
            .map_err(|e| crate::error::registration_error(e, registered, len as u64))?;
        Ok(Extra {
            keys: Keys::of(&mr),
            _mr: Box::new(mr),
        })
    }
}

/// Heap chunks with made-up keys: lets the allocator's logic run under miri, which cannot call
/// into the verbs providers.
#[cfg(test)]
#[cfg_attr(not(miri), allow(dead_code))]
#[derive(Debug, Default)]
pub(crate) struct HeapBackend {
    next_key: std::sync::atomic::AtomicU32,
}

#[cfg(test)]
#[cfg_attr(not(miri), allow(dead_code))]
struct HeapMem {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: HeapMem owns its allocation exclusively; it only frees it.
#[cfg(test)]
unsafe impl Send for HeapMem {}
// SAFETY: as for Send.
#[cfg(test)]
unsafe impl Sync for HeapMem {}

#[cfg(test)]
impl Drop for HeapMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `HeapBackend::grow` with this very layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
impl Backend for HeapBackend {
    fn grow(&self, len: usize, span: usize, _registered: u64) -> Result<Chunk, MemError> {
        use std::sync::atomic::Ordering;
        let layout = std::alloc::Layout::from_size_align(len, crate::config::PAGE)
            .map_err(|e| MemError::InvalidConfig(e.to_string()))?;
        // SAFETY: the layout has a non-zero size (chunk_size is validated positive).
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| MemError::InvalidConfig("heap exhausted".into()))?;
        let keys = (0..len.div_ceil(span))
            .map(|_| {
                let k = self.next_key.fetch_add(1, Ordering::Relaxed);
                Keys { lkey: k, rkey: k }
            })
            .collect();
        Ok(Chunk::new(
            ptr,
            len,
            span,
            keys,
            Arc::new(HeapMem { ptr, layout }),
        ))
    }

    fn register(
        &self,
        _hold: &(dyn Any + Send + Sync),
        _off: usize,
        _len: usize,
        _access: Access,
        _registered: u64,
    ) -> Result<Extra, MemError> {
        use std::sync::atomic::Ordering;
        let k = self.next_key.fetch_add(1, Ordering::Relaxed);
        Ok(Extra {
            keys: Keys { lkey: k, rkey: k },
            _mr: Box::new(()),
        })
    }
}
