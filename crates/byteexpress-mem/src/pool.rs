//! A pool of fixed-size registered buffers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use byteexpress_verbs::{Access, Mr, Pd, Sge, SharedMem};
use bytes::{Bytes, buf::UninitSlice};
use parking_lot::Mutex;

/// Errors of the pool.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// Every buffer is in use; free one (drop a [`PoolBuf`] or the `Bytes` frozen from it) and
    /// retry. Backpressure, never an abort.
    #[error("buffer pool exhausted ({count} buffers of {buf_size} bytes in use)")]
    Exhausted {
        /// Buffers in the pool.
        count: usize,
        /// Bytes per buffer.
        buf_size: usize,
    },
    /// Allocating or registering the pool's memory failed.
    #[error("registering pool memory: {0}")]
    Verbs(#[from] byteexpress_verbs::Error),
    /// `buf_size × count` is zero or overflows.
    #[error("invalid pool size: {0}")]
    InvalidSize(String),
}

/// Counters of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Bytes registered with the device.
    pub bytes_registered: u64,
    /// Buffers handed out and not yet returned.
    pub in_use: u64,
    /// Allocations refused because the pool was empty.
    pub exhausted: u64,
}

#[derive(Debug)]
struct Inner {
    mr: Mr,
    base: *mut u8,
    buf_size: usize,
    count: usize,
    free: Mutex<Vec<u32>>,
    exhausted: AtomicU64,
}

// SAFETY: `base` points into `mr`'s shared mapping, which lives as long as `Inner`; every buffer
// index is owned by at most one `PoolBuf` at a time (the free list hands each out once), so
// threads never share a buffer's bytes through the pool.
unsafe impl Send for Inner {}
// SAFETY: see `Send`; the only shared mutable state is the free list behind a mutex.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        crate::registry::remove(self.base as usize);
    }
}

/// A pool of `count` buffers of `buf_size` bytes each, registered once as one MR with
/// LOCAL_WRITE, REMOTE_READ and REMOTE_WRITE access. Cloning shares the pool.
#[derive(Debug, Clone)]
pub struct BufPool {
    inner: Arc<Inner>,
}

impl BufPool {
    /// Allocates `buf_size × count` bytes with [`Pd::alloc_shared`] and registers them.
    /// Errors: [`MemError::InvalidSize`], [`MemError::Verbs`].
    pub fn new(pd: &Pd, buf_size: usize, count: usize) -> Result<Self, MemError> {
        let total = buf_size
            .checked_mul(count)
            .filter(|&t| t > 0 && count <= u32::MAX as usize && buf_size <= u32::MAX as usize)
            .ok_or_else(|| MemError::InvalidSize(format!("{count} × {buf_size} bytes")))?;
        let mem: SharedMem = pd.alloc_shared(total)?;
        let mr = pd.reg_shared(&mem, 0, total, Access::ALL)?;
        let base = mem.as_ptr();
        crate::registry::add(base as usize, total);
        let free = (0..count as u32).rev().collect();
        Ok(BufPool {
            inner: Arc::new(Inner {
                mr,
                base,
                buf_size,
                count,
                free: Mutex::new(free),
                exhausted: AtomicU64::new(0),
            }),
        })
    }

    /// Takes a free buffer (length 0, capacity `buf_size`). Errors: [`MemError::Exhausted`].
    pub fn alloc(&self) -> Result<PoolBuf, MemError> {
        let idx = self.inner.free.lock().pop();
        match idx {
            Some(idx) => Ok(PoolBuf {
                pool: self.inner.clone(),
                idx,
                len: 0,
            }),
            None => {
                self.inner.exhausted.fetch_add(1, Ordering::Relaxed);
                Err(MemError::Exhausted {
                    count: self.inner.count,
                    buf_size: self.inner.buf_size,
                })
            }
        }
    }

    /// Bytes per buffer.
    pub fn buf_size(&self) -> usize {
        self.inner.buf_size
    }

    /// Buffers in the pool.
    pub fn count(&self) -> usize {
        self.inner.count
    }

    /// Free buffers right now.
    pub fn available(&self) -> usize {
        self.inner.free.lock().len()
    }

    /// True when `addr` lies inside this pool's memory.
    pub fn contains(&self, addr: *const u8) -> bool {
        let start = self.inner.base as usize;
        (start..start + self.inner.buf_size * self.inner.count).contains(&(addr as usize))
    }

    /// Counters.
    pub fn stats(&self) -> PoolStats {
        let free = self.available() as u64;
        PoolStats {
            bytes_registered: (self.inner.buf_size * self.inner.count) as u64,
            in_use: self.inner.count as u64 - free,
            exhausted: self.inner.exhausted.load(Ordering::Relaxed),
        }
    }
}

/// One buffer of a [`BufPool`], owned exclusively; returns to the pool on drop. Its first
/// [`PoolBuf::len`] bytes are filled (through [`bytes::BufMut`] or [`PoolBuf::set_len`] after the
/// device wrote them).
#[derive(Debug)]
pub struct PoolBuf {
    pool: Arc<Inner>,
    idx: u32,
    len: usize,
}

impl PoolBuf {
    /// Address of the buffer's first byte in this process.
    pub fn addr(&self) -> u64 {
        self.ptr() as u64
    }

    fn ptr(&self) -> *mut u8 {
        // SAFETY: idx < count, so the offset stays inside the pool's mapping.
        unsafe { self.pool.base.add(self.idx as usize * self.pool.buf_size) }
    }

    /// Local key of the pool's MR.
    pub fn lkey(&self) -> u32 {
        self.pool.mr.lkey()
    }

    /// Remote key of the pool's MR.
    pub fn rkey(&self) -> u32 {
        self.pool.mr.rkey()
    }

    /// Bytes filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size of the buffer in bytes.
    pub fn capacity(&self) -> usize {
        self.pool.buf_size
    }

    /// Declares the first `len` bytes filled, after the device wrote them (a receive completion's
    /// `byte_len`). `len` is clamped to the capacity.
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }

    /// The SGE naming the filled bytes (for a send WR).
    pub fn sge(&self) -> Sge {
        Sge {
            addr: self.addr(),
            len: self.len as u32,
            lkey: self.lkey(),
        }
    }

    /// The SGE naming the whole buffer (for a receive WR).
    pub fn recv_sge(&self) -> Sge {
        Sge {
            addr: self.addr(),
            len: self.capacity() as u32,
            lkey: self.lkey(),
        }
    }

    /// The filled bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the buffer's bytes are inside the mapping, owned by this PoolBuf alone, and
        // `len ≤ capacity`. Memory is initialised (zero-filled at allocation or written since).
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    /// Appends `data`. Errors when it does not fit (nothing is written then).
    pub fn extend_from_slice(&mut self, data: &[u8]) -> Result<(), MemError> {
        if data.len() > self.capacity() - self.len {
            return Err(MemError::InvalidSize(format!(
                "{} bytes do not fit in {} free",
                data.len(),
                self.capacity() - self.len
            )));
        }
        // SAFETY: the destination range lies inside this buffer (checked just above) and does not
        // overlap `data`, which the caller borrows from elsewhere.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr().add(self.len), data.len())
        };
        self.len += data.len();
        Ok(())
    }

    /// Turns the filled bytes into [`Bytes`] without copying; the buffer returns to the pool when
    /// the last clone (or slice) drops. Note: `BytesMut::from(bytes)` on the result copies and
    /// releases the buffer at once.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for PoolBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        self.pool.free.lock().push(self.idx);
    }
}

// SAFETY: `remaining_mut` is the free space of this buffer; `advance_mut` only moves `len` within
// it; `chunk_mut` hands out exactly that free space, which this PoolBuf owns exclusively.
unsafe impl bytes::BufMut for PoolBuf {
    fn remaining_mut(&self) -> usize {
        self.capacity() - self.len
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        assert!(
            cnt <= self.remaining_mut(),
            "advance_mut past the end of a PoolBuf"
        );
        self.len += cnt;
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        let free = self.remaining_mut();
        // SAFETY: `[ptr + len, ptr + capacity)` lies inside this buffer, which no one else can
        // reach while this &mut self borrow lives.
        unsafe { UninitSlice::from_raw_parts_mut(self.ptr().add(self.len), free) }
    }
}
