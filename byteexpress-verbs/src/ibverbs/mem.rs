//! Memory for `Pd::alloc_shared` on a NIC: a private anonymous mapping, page-aligned and
//! zero-filled (`mmap(2)`), registered later with `ibv_reg_mr(3)`. Any registered memory may be
//! accessed remotely on a NIC, so nothing here is shared with other processes.

use crate::provider::SharedMemImpl;
use crate::{Error, Result};

/// A page-aligned anonymous mapping, unmapped on drop.
#[derive(Debug)]
pub(crate) struct AnonMem {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is valid for the whole life of `AnonMem` and is accessed only through raw
// pointers (by the user and by the device's DMA), never through Rust references, so moving or
// sharing the handle between threads is sound.
unsafe impl Send for AnonMem {}
// SAFETY: as for Send.
unsafe impl Sync for AnonMem {}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

impl AnonMem {
    /// `len` bytes (at least one page, rounded up to the page size), zero-filled.
    pub(crate) fn new(len: usize) -> Result<AnonMem> {
        let len = len
            .max(1)
            .checked_next_multiple_of(page_size())
            .ok_or_else(|| Error::InvalidArgument("memory length overflows".into()))?;
        // SAFETY: anonymous private mapping at an address of the kernel's choosing; no fd.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::last_os("mmap"));
        }
        Ok(AnonMem {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for AnonMem {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length and unmapped once; every MR over it holds an
        // Arc of it, so none is registered any more.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl SharedMemImpl for AnonMem {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn len(&self) -> usize {
        self.len
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
