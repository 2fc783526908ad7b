//! The page size and [`AnonMap`], an anonymous private mapping (`mmap(2)`) owned by a handle:
//! the one helper for anonymous memory of this crate's providers (`Pd::alloc_shared` on
//! rdma-core devices) and of `byteexpress-mem` (which re-exports it). It can be the owner of a
//! [`crate::UserRegion`] and stays mapped while an MR holds it; unmapped (`munmap(2)`) when the
//! last holder drops it.

use std::io;

/// An anonymous, private, read-write mapping of whole pages, zero-filled, unmapped on drop.
#[derive(Debug)]
pub struct AnonMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is valid for the whole life of the handle and reachable only through it
// (`&self` gives shared reads, `&mut self` exclusive writes), like a `Box<[u8]>`.
unsafe impl Send for AnonMap {}
// SAFETY: as for Send.
unsafe impl Sync for AnonMap {}

/// The page size in bytes (`sysconf(_SC_PAGESIZE)`; 4096 if that fails).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

impl AnonMap {
    /// `len` bytes (rounded up to the page size, at least one page) where the kernel chooses.
    pub fn new(len: usize) -> io::Result<AnonMap> {
        Self::map(std::ptr::null_mut(), len, 0)
    }

    /// `len` bytes (rounded up to the page size) at exactly `addr`, which must be page-aligned
    /// and not mapped (`MAP_FIXED_NOREPLACE`, Linux ≥ 4.17): an existing mapping there is never
    /// replaced, the call fails with `EEXIST` instead (on older kernels, which ignore the flag,
    /// a mapping elsewhere is unmapped again and the call fails with `EEXIST` too).
    pub fn new_at(addr: usize, len: usize) -> io::Result<AnonMap> {
        if addr == 0 || !addr.is_multiple_of(page_size()) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let m = Self::map(addr as *mut u8, len, libc::MAP_FIXED_NOREPLACE)?;
        if m.ptr as usize != addr {
            drop(m);
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        Ok(m)
    }

    fn map(hint: *mut u8, len: usize, flags: libc::c_int) -> io::Result<AnonMap> {
        let len = len
            .max(1)
            .checked_next_multiple_of(page_size())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: an anonymous private mapping; with MAP_FIXED_NOREPLACE the kernel never
        // replaces an existing mapping, so no memory this process uses is affected.
        let ptr = unsafe {
            libc::mmap(
                hint.cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(AnonMap {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Start address.
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// Length in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a mapping has at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl AsRef<[u8]> for AnonMap {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` readable bytes mapped at `ptr` for the life of `self`; writes need
        // `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AsMut<[u8]> for AnonMap {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_ref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        // SAFETY: mapped in `map` with this length, unmapped once; nothing borrows it any more.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
