//! Shared memory: sealed memfd mappings and eventfds.
//!
//! A memfd is sealed against shrinking before it leaves this process, and a peer's memfd is
//! mapped only if it carries that seal, so no peer can truncate a mapping under us (SIGBUS).
//!
//! fds are a server's scarcest resource per link, so a mapping keeps its memfd open only while
//! it may still have to be passed to a peer: a peer's memfd is closed as soon as it is mapped
//! (the mapping keeps the memory), and a QP's ring memfd once the QP has sent it
//! ([`Mapping::close_fd`]). Only the regions of a PD, which may be announced to peers that
//! connect later, keep theirs.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::{Error, Result};

const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// The page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// A `MAP_SHARED` mapping of a memfd, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
    /// The memfd, while it may still be passed to a peer.
    fd: parking_lot::Mutex<Option<OwnedFd>>,
}

// SAFETY: the mapping is valid for the whole life of `Mapping`; this crate reads and writes it
// only through raw pointers and atomics, never through references to non-atomic data, so sharing
// it between threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as for Send.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// A fresh zero-filled memfd of `len` bytes rounded up to the page size, sealed, mapped.
    pub(crate) fn create(len: usize, name: &CStr) -> Result<Mapping> {
        let page = page_size();
        let len = len
            .max(1)
            .checked_next_multiple_of(page)
            .ok_or_else(|| Error::InvalidArgument("shared memory length overflows".into()))?;
        // SAFETY: `name` is a valid NUL-terminated string; the flags are valid.
        let raw = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(Error::last_os("memfd_create"));
        }
        // SAFETY: memfd_create just returned this fd, which nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len)
            .map_err(|_| Error::InvalidArgument("shared memory too large".into()))?;
        // SAFETY: `fd` is an open memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(Error::last_os("ftruncate"));
        }
        // SAFETY: `fd` is an open memfd created with MFD_ALLOW_SEALING.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
            return Err(Error::last_os("fcntl(F_ADD_SEALS)"));
        }
        Self::map(fd, len)
    }

    /// Maps the first `len` bytes of a peer's memfd, which must be sealed against shrinking and
    /// at least `len` bytes long.
    pub(crate) fn open(fd: OwnedFd, len: usize) -> Result<Mapping> {
        if len == 0 {
            return Err(Error::Peer("zero-length region".into()));
        }
        // SAFETY: `fd` is an open fd; F_GET_SEALS only reads its seals.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(Error::Peer(
                "peer memory is not a memfd sealed against shrinking".into(),
            ));
        }
        // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` is a valid, writable `stat`.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(Error::last_os("fstat"));
        }
        if u64::try_from(st.st_size).unwrap_or(0) < len as u64 {
            return Err(Error::Peer("peer memory shorter than announced".into()));
        }
        let map = Self::map(fd, len)?;
        // never passed on: the mapping alone keeps the memory
        map.close_fd();
        Ok(map)
    }

    fn map(fd: OwnedFd, len: usize) -> Result<Mapping> {
        // SAFETY: a fresh shared mapping of an open fd; the kernel picks the address, so no
        // existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::last_os("mmap"));
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
            fd: parking_lot::Mutex::new(Some(fd)),
        })
    }

    /// Closes the memfd; the mapping stays valid. Later [`Mapping::fd`] calls return `None`.
    pub(crate) fn close_fd(&self) {
        self.fd.lock().take();
    }

    #[inline]
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The memfd, to pass to a peer; `None` once closed ([`Mapping::close_fd`]). The fd stays
    /// open until `close_fd`, which only the mapping's owner calls once it has passed it on.
    pub(crate) fn fd(&self) -> Option<RawFd> {
        self.fd.lock().as_ref().map(AsRawFd::as_raw_fd)
    }

    /// The 8-byte word at `off`, unchecked: for offsets of a layout checked against this
    /// mapping once (`Ring::new`), never for offsets a peer wrote.
    ///
    /// # Safety
    /// `off` must be a multiple of 8 and `off + 8 <= self.len()`.
    #[inline]
    pub(crate) unsafe fn u64_at_unchecked(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= self.len);
        // SAFETY: in bounds and aligned (the caller's contract; the mapping is page-aligned);
        // the memory lives as long as `self` and is only ever accessed atomically or as bytes.
        unsafe { AtomicU64::from_ptr(self.ptr.add(off).cast()) }
    }

    /// The 4-byte word at `off`, as [`Mapping::u64_at_unchecked`].
    ///
    /// # Safety
    /// `off` must be a multiple of 4 and `off + 4 <= self.len()`.
    #[inline]
    pub(crate) unsafe fn u32_at_unchecked(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= self.len);
        // SAFETY: as in `u64_at_unchecked`.
        unsafe { AtomicU32::from_ptr(self.ptr.add(off).cast()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are the mapping created in `map`, unmapped only here.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A non-blocking eventfd: a CQ's completion channel, and the doorbell peers ring.
#[derive(Debug)]
pub(crate) struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub(crate) fn new() -> Result<EventFd> {
        // SAFETY: eventfd has no memory-safety preconditions.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(Error::last_os("eventfd"));
        }
        // SAFETY: eventfd just returned this fd, which nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(EventFd { fd })
    }

    /// Wraps a peer's doorbell and makes it non-blocking, so ringing it never stalls us.
    pub(crate) fn from_peer(fd: OwnedFd) -> EventFd {
        // SAFETY: `fd` is open; F_GETFL/F_SETFL only change its status flags.
        unsafe {
            let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            if fl >= 0 {
                libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
            }
        }
        EventFd { fd }
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Adds 1 (wakes the reader). Errors (a full counter, a peer's odd fd) are ignored: the
    /// reader polls anyway once woken.
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to an open fd.
        unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Resets the counter (non-blocking).
    pub(crate) fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a valid u64.
        unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut v).cast(), 8) };
    }
}
