//! [`RegisteredBuf`]: one buffer of registered memory, owned exclusively until dropped.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use byteexpress_verbs::Sge;
use bytes::{Bytes, buf::UninitSlice};

use crate::MemError;
use crate::backing::Slot;
use crate::reserve::ReserveInner;
use crate::shared::Shared;

/// Where a buffer goes when dropped.
pub(crate) enum Home {
    /// Back to its pool (through the dropping thread's cache). Not an owning reference: the
    /// buffer's slot holds a lease of the pool (`crate::shared`), which keeps it alive until the
    /// slot goes back; the pointer comes from `Arc::as_ptr`.
    Pool(NonNull<Shared>),
    /// Back to the receive reserve it came from.
    Reserve(Arc<ReserveInner>),
}

/// A buffer of registered memory from a [`crate::Pool`] or a [`crate::RecvReserve`]: it knows
/// its address, lkey and rkey, fills through [`bytes::BufMut`] (prost encodes straight into it),
/// and [`RegisteredBuf::freeze`]s into [`Bytes`] without copying. Dropping it (or the last clone
/// of the frozen `Bytes`) returns the memory to where it came from.
///
/// Its first [`RegisteredBuf::len`] bytes are filled; its [`RegisteredBuf::capacity`] is the
/// length asked for (the size class may be larger; the rest stays unused).
///
/// DESIGN.md's invariant: memory named in a posted WR belongs to that WR until its completion.
/// Keep the buffer in the record of the posted WR and take it back from the completion.
pub struct RegisteredBuf {
    slot: Slot,
    cap: usize,
    len: usize,
    class: usize,
    home: Home,
}

impl fmt::Debug for RegisteredBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredBuf")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("capacity", &self.cap)
            .field("lkey", &self.lkey())
            .finish()
    }
}

// SAFETY: the buffer's bytes are reachable only through this value (the pool hands each slot to
// one holder at a time). Its home is an `Arc` of a Send + Sync reserve, or a pointer to a pool
// (`Shared`, Send + Sync) kept alive by the slot's lease, which any thread may give back.
unsafe impl Send for RegisteredBuf {}
// SAFETY: `&RegisteredBuf` only reads (`as_slice`, keys); writing needs `&mut`.
unsafe impl Sync for RegisteredBuf {}

impl RegisteredBuf {
    /// `cap <= size of class` (callers check it). With `Home::Pool`, `slot` holds a lease of that
    /// pool, which the buffer gives back when dropped.
    #[inline]
    pub(crate) fn new(slot: Slot, cap: usize, class: usize, home: Home) -> Self {
        RegisteredBuf {
            slot,
            cap,
            len: 0,
            class,
            home,
        }
    }

    /// Address of the first byte in this process (what an SGE or a peer's RDMA READ names).
    pub fn addr(&self) -> u64 {
        self.slot.ptr.as_ptr() as u64
    }

    /// Local key of the MR that holds the whole buffer.
    pub fn lkey(&self) -> u32 {
        self.slot.keys.lkey
    }

    /// Remote key of that MR, for a peer's RDMA READ or WRITE.
    pub fn rkey(&self) -> u32 {
        self.slot.keys.rkey
    }

    /// Bytes filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Usable bytes: the length asked for at allocation.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Declares the first `len` bytes filled, after the device wrote them (a receive completion's
    /// `byte_len`). `len` is clamped to the capacity.
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.cap);
    }

    /// Forgets the filled bytes (length 0), keeping the buffer.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The SGE naming the filled bytes (for a send WR).
    pub fn sge(&self) -> Sge {
        Sge {
            addr: self.addr(),
            len: self.len as u32,
            lkey: self.lkey(),
        }
    }

    /// The SGE naming the whole capacity (for a receive WR).
    pub fn recv_sge(&self) -> Sge {
        Sge {
            addr: self.addr(),
            len: self.cap as u32,
            lkey: self.lkey(),
        }
    }

    /// The filled bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `[ptr, ptr + len)` lies inside this buffer (len <= cap <= class size), in a
        // live chunk (the home handle or the slot's lease keeps the pool alive), reachable only
        // through `self`.
        // Chunks are zero-filled at allocation, so every byte is initialised.
        unsafe { std::slice::from_raw_parts(self.slot.ptr.as_ptr(), self.len) }
    }

    /// The filled bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.slot.ptr.as_ptr(), self.len) }
    }

    /// Appends `data`. Errors: [`MemError::NoRoom`] when it does not fit (nothing is written).
    pub fn extend_from_slice(&mut self, data: &[u8]) -> Result<(), MemError> {
        let free = self.cap - self.len;
        if data.len() > free {
            return Err(MemError::NoRoom {
                len: data.len(),
                free,
            });
        }
        // SAFETY: the destination `[ptr + len, ptr + len + data.len())` lies inside this buffer
        // (checked above) and cannot overlap `data`, which `&mut self` excludes from borrowing it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.slot.ptr.as_ptr().add(self.len),
                data.len(),
            )
        };
        self.len += data.len();
        Ok(())
    }

    /// Turns the filled bytes into [`Bytes`] without copying (`Bytes::from_owner`); the buffer
    /// returns home when the last clone or slice drops. `BytesMut::from(bytes)` and
    /// `Bytes::try_into_mut` on the result copy the bytes and release the buffer at once.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for RegisteredBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for RegisteredBuf {
    #[inline(always)]
    fn drop(&mut self) {
        match &self.home {
            // SAFETY: `p` came from `Arc::as_ptr` of the pool (`Pool::try_alloc`, `alloc`) and the slot
            // holds a lease of it, handed over here: the slot is never used again by this value.
            Home::Pool(p) => unsafe { crate::cache::free(*p, self.class, self.slot) },
            Home::Reserve(r) => r.give_back(self.slot),
        }
    }
}

// SAFETY: `remaining_mut` is the free space of this buffer; `advance_mut` only moves `len`
// within it; `chunk_mut` hands out exactly that free space, which this value owns exclusively.
unsafe impl bytes::BufMut for RegisteredBuf {
    fn remaining_mut(&self) -> usize {
        self.cap - self.len
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        debug_assert!(cnt <= self.remaining_mut(), "advance_mut past the capacity");
        self.len = self.len.saturating_add(cnt).min(self.cap);
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        let free = self.remaining_mut();
        // SAFETY: `[ptr + len, ptr + cap)` lies inside this buffer, which no one else can reach
        // while this `&mut self` borrow lives.
        unsafe { UninitSlice::from_raw_parts_mut(self.slot.ptr.as_ptr().add(self.len), free) }
    }
}
