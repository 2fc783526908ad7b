//! [`LargePool`]: registered buffers of any size, one mapping and one MR each, for messages
//! larger than a [`crate::Pool`] class: a rendezvous message a peer READs from us, or the
//! buffer we READ a peer's message into (DESIGN.md 3.2 and 3.5, "Rendezvous").
//!
//! A [`LargeBuf`] is one region of its own: `alloc_shared_for` memory rounded up to
//! [`REGION_ALIGN`], registered once as one MR with the pool's access. When it drops, the
//! region goes back to the pool's free list while the list holds less than its byte limit,
//! so the next message of about that size reuses memory already mapped, faulted in and
//! registered (a fresh 16 MiB mapping costs 4,096 page faults on first touch); beyond the
//! limit it is deregistered and unmapped. A region is reused for a request of at least half
//! its size (any request for a region of the smallest size, 2 MiB), so a small message never
//! holds a huge region.

use std::sync::Arc;

use byteexpress_verbs::{Access, Mr, Pd, Sge, SharedMem};
use bytes::Bytes;
use parking_lot::Mutex;

use crate::MemError;

/// Region sizes are multiples of this (2 MiB: a transparent huge page).
pub const REGION_ALIGN: usize = 2 << 20;

/// The span (bytes, a page) within which a copy's destination is kept in step with its
/// source: [`LargeBuf::offset_in_step`].
pub const IN_STEP: usize = 4096;

/// A source of large registered buffers on one PD, with a bounded free list.
#[derive(Debug, Clone)]
pub struct LargePool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pd: Pd,
    access: Access,
    hint: Access,
    cache_limit: u64,
    free: Mutex<Free>,
}

#[derive(Debug, Default)]
struct Free {
    regions: Vec<Region>,
    bytes: u64,
}

/// One mapping and its MR over all of it.
#[derive(Debug)]
struct Region {
    mem: SharedMem,
    mr: Mr,
}

impl Region {
    fn cap(&self) -> usize {
        self.mem.len()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        crate::registry::remove(self.mem.as_ptr() as usize);
    }
}

impl LargePool {
    /// Buffers on `pd` whose MRs grant `access` (LOCAL_WRITE for a READ's destination;
    /// `LOCAL_WRITE | MW_BIND` for memory lent through memory windows; nothing for memory lent
    /// through a per-message MR, [`LargeBuf::lend`]). `readable_by_peer`: the memory may be lent
    /// for a peer's READ, so it is allocated readable-class (`Pd::alloc_shared_for` with
    /// REMOTE_READ as the hint: on the soft provider the peer of the PD may map it read-only,
    /// never writable; a NIC ignores the hint); otherwise it is allocated as registered, local
    /// only. At most `cache_bytes` of freed regions are kept for reuse.
    pub fn new(pd: &Pd, access: Access, readable_by_peer: bool, cache_bytes: u64) -> Self {
        let hint = if readable_by_peer {
            access | Access::REMOTE_READ
        } else {
            access
        };
        LargePool {
            inner: Arc::new(Inner {
                pd: pd.clone(),
                access,
                hint,
                cache_limit: cache_bytes,
                free: Mutex::new(Free::default()),
            }),
        }
    }

    /// A buffer of at least `len` bytes (`len > 0`), empty (length 0): a free region of
    /// `len ..= max(2 × len, REGION_ALIGN)` bytes when one is kept (the smallest), else a new
    /// one of `len` rounded up to [`REGION_ALIGN`]. Errors: [`MemError::InvalidConfig`] for 0 bytes;
    /// [`MemError::Verbs`] / [`MemError::Memlock`] when the provider refuses the mapping or
    /// the registration.
    pub fn alloc(&self, len: usize) -> Result<LargeBuf, MemError> {
        if len == 0 {
            return Err(MemError::InvalidConfig("a large buffer of 0 bytes".into()));
        }
        let reused = {
            let mut free = self.inner.free.lock();
            let best = free
                .regions
                .iter()
                .enumerate()
                .filter(|(_, r)| r.cap() >= len && r.cap() <= (2 * len).max(REGION_ALIGN))
                .min_by_key(|(_, r)| r.cap())
                .map(|(i, _)| i);
            best.map(|i| {
                let r = free.regions.swap_remove(i);
                free.bytes -= r.cap() as u64;
                r
            })
        };
        let region = match reused {
            Some(r) => r,
            None => self.new_region(len)?,
        };
        Ok(LargeBuf {
            region: Some(region),
            len: 0,
            home: self.inner.clone(),
        })
    }

    fn new_region(&self, len: usize) -> Result<Region, MemError> {
        let cap = len
            .checked_next_multiple_of(REGION_ALIGN)
            .ok_or_else(|| MemError::InvalidConfig(format!("{len} bytes cannot be mapped")))?;
        let mem = self.inner.pd.alloc_shared_for(cap, self.inner.hint)?;
        // SAFETY: the range is the whole live mapping we just got; MADV_HUGEPAGE only changes
        // how the kernel backs it. A refusal (THP off) is ignored on purpose.
        unsafe { libc::madvise(mem.as_ptr().cast(), mem.len(), libc::MADV_HUGEPAGE) };
        let mr = self
            .inner
            .pd
            .reg_shared(&mem, 0, cap, self.inner.access)
            .map_err(|e| crate::error::registration_error(e, 0, cap as u64))?;
        crate::registry::add(mem.as_ptr() as usize, cap);
        Ok(Region { mem, mr })
    }

    /// Bytes of freed regions kept for reuse now.
    pub fn cached_bytes(&self) -> u64 {
        self.inner.free.lock().bytes
    }
}

/// A registered buffer from a [`LargePool`]: `len` bytes filled of its region's capacity. The
/// region goes back to its pool when the buffer (or the last clone of what
/// [`LargeBuf::freeze`] made) drops.
#[derive(Debug)]
pub struct LargeBuf {
    region: Option<Region>,
    len: usize,
    home: Arc<Inner>,
}

impl LargeBuf {
    fn region(&self) -> &Region {
        self.region.as_ref().expect("present until drop")
    }

    /// Address of the first byte in this process.
    pub fn addr(&self) -> u64 {
        self.region().mem.as_ptr() as u64
    }

    /// Local key of the region's MR.
    pub fn lkey(&self) -> u32 {
        self.region().mr.lkey()
    }

    /// The region's MR (to bind a memory window over part of it).
    pub fn mr(&self) -> &Mr {
        &self.region().mr
    }

    /// Bytes filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the region holds.
    pub fn capacity(&self) -> usize {
        self.region().cap()
    }

    /// Sets the filled length (bytes written by the device, e.g. a READ's destination).
    /// Panics if `len` exceeds the capacity. The region's bytes are always initialised
    /// (zero-filled when mapped, or left from an earlier use), so any length is sound.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity(), "length beyond the region");
        self.len = len;
    }

    /// The SGE of `[off, off + len)` of the region (`len` ≤ u32::MAX), or `None` when the
    /// range is outside it.
    pub fn sge(&self, off: usize, len: u32) -> Option<Sge> {
        let end = off.checked_add(len as usize)?;
        (end <= self.capacity()).then(|| Sge {
            addr: self.addr() + off as u64,
            len,
            lkey: self.lkey(),
        })
    }

    /// Copies the concatenation of `parts` to the start of the buffer and sets the length to
    /// its size (as [`LargeBuf::fill_at`] at 0). Errors: [`MemError::NoRoom`] when it exceeds
    /// the capacity (nothing copied).
    pub fn fill(&mut self, parts: &[&[u8]]) -> Result<(), MemError> {
        self.fill_at(0, parts)
    }

    /// Copies the concatenation of `parts` to offset `start` and sets the length to
    /// `start` + its size (the bytes before `start` are whatever the region held). Parts of
    /// 64 KiB or more are written with streaming stores, past the cache
    /// (`byteexpress_verbs::dma_copy`): lent memory is read next by the peer, not by us.
    /// Errors: [`MemError::NoRoom`] when `start` + the size exceeds the capacity (nothing
    /// copied).
    pub fn fill_at(&mut self, start: usize, parts: &[&[u8]]) -> Result<(), MemError> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let cap = self.capacity();
        let end = match start.checked_add(total) {
            Some(e) if e <= cap => e,
            _ => {
                return Err(MemError::NoRoom {
                    len: total,
                    free: cap.saturating_sub(start),
                });
            }
        };
        let base = self.region().mem.as_ptr();
        let mut at = start;
        for p in parts {
            // SAFETY: `[at, at + p.len())` lies inside `[start, end)`, checked against the
            // capacity above, in memory this buffer owns exclusively while `&mut self` is
            // held (no WR names it: callers post only after filling); `p` is a live slice of
            // other memory.
            unsafe {
                byteexpress_verbs::dma_copy(base.add(at), p.as_ptr(), p.len());
            }
            at += p.len();
        }
        self.len = end;
        Ok(())
    }

    /// Where to place `len` bytes whose last `len - prefix` are a copy of the bytes at
    /// address `src`, so that the copy's destination keeps its source's offset within a page
    /// ([`IN_STEP`]): with the two 20 bytes out of step, glibc's `memcpy` of a large message
    /// runs at a third of its speed on this project's AMD EPYC (DESIGN.md 6.24). The offset
    /// is below [`IN_STEP`]; 0 when the bytes would not fit so (the buffer is not made
    /// larger for it: the copy then merely runs out of step).
    pub fn offset_in_step(&self, src: u64, prefix: usize, len: usize) -> usize {
        let want = src.wrapping_sub(prefix as u64);
        let start = (want.wrapping_sub(self.addr()) % IN_STEP as u64) as usize;
        match start.checked_add(len) {
            Some(end) if end <= self.capacity() => start,
            _ => 0,
        }
    }

    /// The filled bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` ≤ capacity of the live mapping, whose bytes are initialised; a device
        // writes the region only through WRs its owner posted and completed before reading.
        unsafe { std::slice::from_raw_parts(self.region().mem.as_ptr(), self.len) }
    }

    /// A per-message MR over `[off, off + len)` of the region with `access` (e.g. REMOTE_READ
    /// for one peer's READ, where no memory window bounds a range): its own rkey, which stops
    /// working when the MR drops (`ibv_dereg_mr(3)`); drop it before the buffer is reused.
    /// Errors: the registration's ([`MemError::Verbs`], [`MemError::Memlock`]).
    pub fn lend(&self, off: usize, len: usize, access: Access) -> Result<Mr, MemError> {
        let r = self.region();
        self.home
            .pd
            .reg_shared(&r.mem, off, len, access)
            .map_err(|e| crate::error::registration_error(e, 0, len as u64))
    }

    /// Turns the filled bytes into [`Bytes`] without copying; the region returns to its pool
    /// when the last clone or slice drops.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for LargeBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for LargeBuf {
    fn drop(&mut self) {
        let Some(r) = self.region.take() else { return };
        let mut free = self.home.free.lock();
        if free.bytes + r.cap() as u64 <= self.home.cache_limit {
            free.bytes += r.cap() as u64;
            free.regions.push(r);
        }
        // else: `r` drops here (outside nothing else: the lock only guards the list).
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pd() -> Pd {
        crate::tests::soft_pd()
    }

    #[test]
    fn a_freed_region_is_reused_for_a_request_of_at_least_half_its_size() {
        let pool = LargePool::new(&pd(), Access::LOCAL_WRITE, false, 64 << 20);
        let mut a = pool.alloc(5 << 20).unwrap();
        assert_eq!(a.capacity(), 6 << 20, "rounded up to 2 MiB");
        a.fill(&[b"abc", b"def"]).unwrap();
        assert_eq!(a.as_slice(), b"abcdef");
        let addr = a.addr();
        drop(a);
        assert_eq!(pool.cached_bytes(), 6 << 20);
        let b = pool.alloc((3 << 20) + 1).unwrap();
        assert_eq!(b.addr(), addr, "reused");
        assert_eq!(pool.cached_bytes(), 0);
        let c = pool.alloc(1 << 20).unwrap();
        assert_ne!(
            c.addr(),
            addr,
            "a small request does not take a large region"
        );
        // Regression: a 2 MiB region was never reused for a message under 1 MiB, so every
        // 256 KiB rendezvous mapped, faulted in and registered a region of its own.
        let small = c.addr();
        drop(c);
        assert_eq!(
            pool.alloc(256 << 10).unwrap().addr(),
            small,
            "the smallest region serves any size"
        );
    }

    #[test]
    fn bytes_placed_in_step_keep_their_sources_page_offset_unless_they_would_not_fit() {
        let pool = LargePool::new(&pd(), Access::LOCAL_WRITE, false, 64 << 20);
        let mut a = pool.alloc(3 * IN_STEP).unwrap();
        let src: Vec<u8> = (0..100u8).collect();
        let start = a.offset_in_step(src.as_ptr() as u64 + 5, 3, 98);
        assert!(start < IN_STEP);
        a.fill_at(start, &[b"abc", &src[5..]]).unwrap();
        assert_eq!(
            (a.addr() as usize + start + 3) % IN_STEP,
            (src.as_ptr() as usize + 5) % IN_STEP,
            "the copy's destination is in step with its source"
        );
        let s = a.as_slice();
        assert_eq!(s.len(), start + 98);
        assert_eq!(&s[start..start + 3], b"abc");
        assert_eq!(&s[start + 3..], &src[5..]);
        let cap = a.capacity();
        let odd = src.as_ptr() as u64 | 1;
        assert_eq!(
            a.offset_in_step(odd, 0, cap),
            0,
            "a message filling the region goes at its start"
        );
        assert!(matches!(
            a.fill_at(cap - 2, &[b"abc"]),
            Err(MemError::NoRoom { .. })
        ));
    }

    #[test]
    fn regions_beyond_the_cache_limit_are_unmapped_and_frozen_bytes_are_pool_memory() {
        let pool = LargePool::new(&pd(), Access::LOCAL_WRITE, false, 2 << 20);
        let mut a = pool.alloc(100).unwrap();
        let mut b = pool.alloc(100).unwrap();
        a.fill(&[b"hello"]).unwrap();
        b.fill(&[b"x"]).unwrap();
        let bytes = a.freeze();
        assert!(crate::is_pool_memory(bytes.as_ptr()));
        assert_eq!(&bytes[..], b"hello");
        drop(bytes);
        drop(b);
        assert_eq!(
            pool.cached_bytes(),
            2 << 20,
            "one region kept, the other unmapped"
        );
        assert!(pool.alloc(0).is_err());
    }
}
