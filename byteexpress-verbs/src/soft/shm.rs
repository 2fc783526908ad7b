//! Shared memory: sealed memfd mappings (doorbells are in [`super::bell`]).
//!
//! A memfd is sealed against shrinking before it leaves this process, and a peer's memfd is
//! mapped only if it carries that seal, so no peer can truncate a mapping under us (SIGBUS).
//!
//! fds are a server's scarcest resource per link, so a mapping keeps its memfd open only while
//! it may still have to be passed to a peer: a peer's memfd is closed as soon as it is mapped
//! (the mapping keeps the memory), and a QP's ring memfd once the QP has sent it
//! ([`Mapping::close_fd`]). The regions of a PD share one memfd, its [`Arena`], which stays open
//! only until every QP of the PD has been passed it ([`Arena::close`], decided by the PD): from
//! then on the mappings alone hold its memory, regions made later go to a new arena, and a PD
//! whose QPs are all connected holds no memfd at all.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::{Error, Result};

const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

pub(crate) use crate::anon::page_size;

/// A `MAP_SHARED` mapping of a memfd, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
    /// Where the mapping starts in its memfd (bytes, a multiple of the page size).
    offset: u64,
    /// The memfd, while it may still be passed to a peer (not for arena regions).
    fd: parking_lot::Mutex<Option<OwnedFd>>,
    /// The arena the mapping was carved from, whose memfd it shares.
    arena: Option<Arc<Arena>>,
    /// Mapped `PROT_WRITE` too (false for a peer's read-only grant).
    writable: bool,
}

/// One growable memfd that holds several regions at page-aligned offsets (a PD's shared
/// memory), sealed against shrinking only, so a peer's mapping can never be truncated.
#[derive(Debug)]
pub(crate) struct Arena {
    /// The memfd, until closed ([`Arena::close`]): then the arena is retired too.
    fd: parking_lot::Mutex<Option<OwnedFd>>,
    /// Its fd went to a peer.
    passed: AtomicBool,
    /// Bytes handed out so far (the file's size).
    end: parking_lot::Mutex<u64>,
    /// No more regions are carved from it (a peer that was sent its fd is gone, or it was
    /// sealed read-only).
    retired: AtomicBool,
    /// A read-only grant: passed to peers sealed `F_SEAL_FUTURE_WRITE` as an `O_RDONLY` fd.
    read_only: bool,
}

impl Arena {
    /// A fresh, empty arena. A `read_only` one is passed to peers as a read-only grant
    /// ([`Arena::pass`]): sealed against writes through any new mapping or fd the first time,
    /// which also ends its carving (a region carved later could not be mapped writable here).
    pub(crate) fn create(name: &CStr, read_only: bool) -> Result<Arc<Arena>> {
        let fd = new_memfd(name)?;
        // A read-only arena keeps F_SEAL_SEAL off until it is sealed for good in `pass`.
        let seals = if read_only {
            libc::F_SEAL_SHRINK
        } else {
            libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL
        };
        // SAFETY: `fd` is an open memfd created with MFD_ALLOW_SEALING.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(Error::last_os("fcntl(F_ADD_SEALS)"));
        }
        Ok(Arc::new(Arena {
            fd: parking_lot::Mutex::new(Some(fd)),
            passed: AtomicBool::new(false),
            end: parking_lot::Mutex::new(0),
            retired: AtomicBool::new(false),
            read_only,
        }))
    }

    /// A zero-filled region of `len` bytes rounded up to the page size, at the end of the
    /// arena (which grows by that much), mapped. Fails with `InvalidState` once the arena's
    /// fd is closed, or when a peer it was passed to resized it (the arena is then retired);
    /// its owner then makes a new arena.
    pub(crate) fn alloc(self: &Arc<Self>, len: usize) -> Result<Mapping> {
        let len = page_round(len)?;
        let fd = self.fd.lock();
        let fd = fd
            .as_ref()
            .ok_or_else(|| Error::InvalidState("the arena's memfd is closed".into()))?;
        if self.read_only && self.is_retired() {
            // Sealed (under this lock, in `pass`): no new writable mapping of it is possible.
            return Err(Error::InvalidState("the arena is sealed read-only".into()));
        }
        let mut end = self.end.lock();
        let offset = *end;
        let size = offset
            .checked_add(len as u64)
            .and_then(|s| libc::off_t::try_from(s).ok())
            .ok_or_else(|| Error::InvalidArgument("shared memory too large".into()))?;
        // A writable arena went to a peer `O_RDWR`, which can grow the file (only shrinking is
        // sealed) and write past our end: then our `ftruncate` would shrink it (refused), or
        // the new region would hold the peer's bytes. Such an arena is retired (the PD carves
        // from a new one) as soon as its size is not the one we set.
        let passed = self.is_passed();
        if passed && file_size(fd.as_raw_fd())? != offset {
            return Err(self.tampered());
        }
        // SAFETY: `fd` is an open memfd; growing it is allowed by its seals.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            if passed && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) {
                // The peer grew it past `size` since the check: shrinking is sealed.
                return Err(self.tampered());
            }
            return Err(Error::last_os("ftruncate"));
        }
        *end = size as u64;
        if passed {
            if file_size(fd.as_raw_fd())? != size as u64 {
                return Err(self.tampered());
            }
            // The peer may have grown the file less than we did between the check and our
            // `ftruncate` and written there: the new range is made holes (zeros) again, so
            // the region starts with no byte the peer wrote before it was carved.
            // SAFETY: `fd` is an open memfd; punching a hole only frees the range's pages
            // (allowed by its seals: no write seal on a writable arena).
            let punched = unsafe {
                libc::fallocate(
                    fd.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            };
            if punched != 0 {
                return Err(Error::last_os("fallocate(FALLOC_FL_PUNCH_HOLE)"));
            }
        }
        drop(end);
        let mut map = Mapping::map_at(fd.as_raw_fd(), offset, len)?;
        map.arena = Some(self.clone());
        Ok(map)
    }

    /// Retires an arena a peer resized behind our back; the error makes the PD carve the
    /// region from a new arena.
    fn tampered(&self) -> Error {
        tracing::warn!("soft: a peer resized a PD arena it was passed; the arena is retired");
        self.retire();
        Error::InvalidState("the arena was resized by a peer".into())
    }

    /// Stops carving regions from this arena: later ones go to a new arena.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Runs `send` with the fd to pass while the memfd is open (it cannot be closed
    /// meanwhile) and marks the arena as passed; `None` once closed. A read-only arena is
    /// first sealed `F_SEAL_FUTURE_WRITE | F_SEAL_GROW | F_SEAL_SEAL` (memfd_create(2), Linux
    /// ≥ 5.1: no new writable mapping, no `write`, through any fd, while the owner's existing
    /// mappings stay writable) and retired; `send` then gets a fresh `O_RDONLY` fd of it,
    /// closed after the call, so the grant cannot be upgraded by the peer.
    pub(crate) fn pass<R>(&self, send: impl FnOnce(RawFd) -> R) -> Option<Result<R>> {
        let fd = self.fd.lock();
        let raw = fd.as_ref()?.as_raw_fd();
        if !self.read_only {
            self.passed.store(true, Ordering::Release);
            return Some(Ok(send(raw)));
        }
        if !self.is_retired() {
            const RO_SEALS: libc::c_int =
                libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            self.retire();
            // SAFETY: `raw` is our open memfd (under its lock), created with
            // MFD_ALLOW_SEALING and without F_SEAL_SEAL so far.
            if unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, RO_SEALS) } != 0 {
                return Some(Err(Error::last_os(
                    "fcntl(F_ADD_SEALS, F_SEAL_FUTURE_WRITE)",
                )));
            }
        }
        let ro = match reopen_read_only(raw) {
            Ok(fd) => fd,
            Err(e) => return Some(Err(e)),
        };
        self.passed.store(true, Ordering::Release);
        Some(Ok(send(ro.as_raw_fd())))
    }

    /// Whether its fd went to a peer.
    pub(crate) fn is_passed(&self) -> bool {
        self.passed.load(Ordering::Acquire)
    }

    /// Whether its memfd is still open.
    pub(crate) fn is_open(&self) -> bool {
        self.fd.lock().is_some()
    }

    /// Retires the arena and closes its memfd. Its regions stay mapped (a mapping outlives its
    /// fd), here and at the peers that mapped them, but can no longer be passed to a peer.
    pub(crate) fn close(&self) {
        self.retire();
        self.fd.lock().take();
    }
}

/// A new `O_RDONLY` open file description of our memfd `fd` (through `/proc/self/fd`, as
/// memfds have no other name), to grant a peer read access only.
fn reopen_read_only(fd: RawFd) -> Result<OwnedFd> {
    let path =
        std::ffi::CString::new(format!("/proc/self/fd/{fd}")).expect("a path of digits has no NUL");
    // SAFETY: a valid NUL-terminated path; the flags are valid.
    let ro = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if ro < 0 {
        return Err(Error::last_os("open(/proc/self/fd, O_RDONLY)"));
    }
    // SAFETY: `open` just returned this fd, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ro) })
}

/// The size of the file `fd` (bytes).
fn file_size(fd: RawFd) -> Result<u64> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is a valid, writable `stat`.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(Error::last_os("fstat"));
    }
    Ok(u64::try_from(st.st_size).unwrap_or(0))
}

/// `len` (at least 1) rounded up to the page size.
fn page_round(len: usize) -> Result<usize> {
    len.max(1)
        .checked_next_multiple_of(page_size())
        .ok_or_else(|| Error::InvalidArgument("shared memory length overflows".into()))
}

/// A new memfd (close-on-exec, sealable).
fn new_memfd(name: &CStr) -> Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string; the flags are valid.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(Error::last_os("memfd_create"));
    }
    // SAFETY: memfd_create just returned this fd, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
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
        let len = page_round(len)?;
        let fd = new_memfd(name)?;
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

    /// Maps `len` bytes at `offset` of a peer's memfd, which must be sealed against shrinking
    /// and at least `offset + len` bytes long; `offset` must be a multiple of the page size.
    /// The fd is closed once mapped. An `O_RDONLY` fd (a read-only grant) is mapped
    /// read-only, an `O_RDWR` one writable.
    pub(crate) fn open(fd: OwnedFd, offset: u64, len: usize) -> Result<Mapping> {
        Self::open_checked(fd, offset, len, false)
    }

    /// As [`Mapping::open`], for peer memory we store into (a peer's QP ring: we claim its
    /// receive WQEs, write its completion slots, clear its `armed` flag): the fd must be
    /// `O_RDWR`, else `Error::Peer` and nothing is mapped. A read-only mapping of it would
    /// fault (SIGSEGV) at our first store.
    pub(crate) fn open_writable(fd: OwnedFd, offset: u64, len: usize) -> Result<Mapping> {
        Self::open_checked(fd, offset, len, true)
    }

    fn open_checked(fd: OwnedFd, offset: u64, len: usize, need_write: bool) -> Result<Mapping> {
        if len == 0 {
            return Err(Error::Peer("zero-length region".into()));
        }
        if !offset.is_multiple_of(page_size() as u64) {
            return Err(Error::Peer("region offset not page-aligned".into()));
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
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|e| u64::try_from(st.st_size).unwrap_or(0) < e) {
            return Err(Error::Peer("peer memory shorter than announced".into()));
        }
        // A read-only grant (an `O_RDONLY` fd) is mapped read-only; anything else (an
        // `O_RDWR` fd) writable.
        // SAFETY: `fd` is open; F_GETFL only reads its status flags.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 {
            return Err(Error::last_os("fcntl(F_GETFL)"));
        }
        let writable = flags & libc::O_ACCMODE == libc::O_RDWR;
        if need_write && !writable {
            return Err(Error::Peer(
                "peer memory we must write into was passed without write access".into(),
            ));
        }
        // never passed on: the mapping alone keeps the memory, and `fd` closes here
        Self::map_prot(fd.as_raw_fd(), offset, len, writable)
    }

    fn map(fd: OwnedFd, len: usize) -> Result<Mapping> {
        Self::map_at(fd.as_raw_fd(), 0, len).map(|mut m| {
            m.fd = parking_lot::Mutex::new(Some(fd));
            m
        })
    }

    /// Maps `len` bytes at `offset` of `fd` (which the mapping does not keep), writable.
    fn map_at(fd: RawFd, offset: u64, len: usize) -> Result<Mapping> {
        Self::map_prot(fd, offset, len, true)
    }

    /// As [`Mapping::map_at`], read-only unless `writable`.
    fn map_prot(fd: RawFd, offset: u64, len: usize, writable: bool) -> Result<Mapping> {
        let off = libc::off_t::try_from(offset)
            .map_err(|_| Error::InvalidArgument("offset too large".into()))?;
        // SAFETY: a fresh shared mapping of an open fd; the kernel picks the address, so no
        // existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                if writable {
                    libc::PROT_READ | libc::PROT_WRITE
                } else {
                    libc::PROT_READ
                },
                libc::MAP_SHARED,
                fd,
                off,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::last_os("mmap"));
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
            offset,
            fd: parking_lot::Mutex::new(None),
            arena: None,
            writable,
        })
    }

    /// Whether the mapping may be written (false for a peer's read-only grant).
    #[inline]
    pub(crate) fn writable(&self) -> bool {
        self.writable
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
        if let Some(a) = &self.arena {
            return a.fd.lock().as_ref().map(AsRawFd::as_raw_fd);
        }
        self.fd.lock().as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Where the mapping starts in its memfd (bytes).
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// The arena the mapping was carved from, if any.
    pub(crate) fn arena(&self) -> Option<&Arc<Arena>> {
        self.arena.as_ref()
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
        if self.arena.is_some() {
            // Give the region's pages back, whether or not the arena's fd is still open:
            // MADV_REMOVE on a shared memfd mapping punches a hole in the file (madvise(2)),
            // so its range of the arena reads as zeros from now on (peers' own mappings
            // included) and is never handed out again.
            // SAFETY: `ptr`/`len` are this live mapping; MADV_REMOVE only frees its backing
            // pages, and nothing in this process reads them after this drop.
            unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_REMOVE) };
        }
        // SAFETY: `ptr`/`len` are the mapping created in `map`, unmapped only here.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second mapping of the arena's fd at `m`'s offset, as a peer makes it (the fd is
    /// duplicated, as `SCM_RIGHTS` would).
    fn peer_view(m: &Mapping) -> Mapping {
        let fd = m.fd().expect("arena fd");
        // SAFETY: `fd` is open for the duration of the call; dup returns a new fd or -1.
        let dup = unsafe { libc::dup(fd) };
        assert!(dup >= 0);
        // SAFETY: dup just returned this fd, which nothing else owns.
        let dup = unsafe { OwnedFd::from_raw_fd(dup) };
        Mapping::open(dup, m.offset(), m.len()).expect("peer maps the region")
    }

    #[test]
    fn arena_regions_share_one_fd_at_page_offsets_and_free_their_pages_on_drop() {
        let arena = Arena::create(c"t", false).unwrap();
        let a = arena.alloc(100).unwrap();
        let b = arena.alloc(3 * page_size()).unwrap();
        assert_eq!(a.fd(), b.fd(), "one memfd for both");
        assert_eq!((a.offset(), a.len()), (0, page_size()));
        assert_eq!(b.offset(), page_size() as u64);
        let view = peer_view(&b);
        assert!(view.fd().is_none(), "a peer's fd is closed once mapped");
        // SAFETY: both pointers are inside their live mappings.
        unsafe {
            b.ptr().add(5).write(0xAB);
            assert_eq!(view.ptr().add(5).read(), 0xAB, "the peer sees the region");
        }
        drop(b);
        // SAFETY: `view` is still mapped.
        let after = unsafe { view.ptr().add(5).read() };
        assert_eq!(after, 0, "pages punched out on drop");
        assert!(
            Mapping::open(
                {
                    // SAFETY: as in `peer_view`.
                    let d = unsafe { libc::dup(a.fd().unwrap()) };
                    // SAFETY: dup just returned it.
                    unsafe { OwnedFd::from_raw_fd(d) }
                },
                1,
                10
            )
            .is_err(),
            "unaligned offsets are refused"
        );
        assert!(!arena.is_retired());
        arena.retire();
        assert!(arena.is_retired());
    }

    #[test]
    fn a_closed_arena_keeps_its_regions_mapped_frees_their_pages_on_drop_and_carves_no_more() {
        let arena = Arena::create(c"t", false).unwrap();
        let a = arena.alloc(page_size()).unwrap();
        let view = peer_view(&a);
        assert!(arena.pass(|_| ()).is_some() && arena.is_passed());
        arena.close();
        assert!(!arena.is_open() && arena.is_retired());
        assert!(a.fd().is_none(), "no fd once closed");
        assert!(arena.pass(|_| ()).is_none(), "nothing to pass once closed");
        assert!(
            matches!(arena.alloc(10), Err(Error::InvalidState(_))),
            "no region carved from a closed arena"
        );
        // SAFETY: both pointers are inside their live mappings.
        unsafe {
            a.ptr().add(7).write(0xCD);
            assert_eq!(
                view.ptr().add(7).read(),
                0xCD,
                "still shared after the close"
            );
        }
        drop(a);
        // SAFETY: `view` is still mapped.
        let after = unsafe { view.ptr().add(7).read() };
        assert_eq!(after, 0, "pages punched out on drop without the arena's fd");
    }

    #[test]
    fn a_passed_arena_a_peer_grew_is_retired_and_carves_nothing_more() {
        let arena = Arena::create(c"t", false).unwrap();
        let _a = arena.alloc(page_size()).unwrap();
        let peer = arena
            .pass(|fd| {
                // SAFETY: `fd` is open for the duration of the call; dup returns a new fd or -1.
                let dup = unsafe { libc::dup(fd) };
                assert!(dup >= 0);
                // SAFETY: dup just returned this fd, which nothing else owns.
                unsafe { OwnedFd::from_raw_fd(dup) }
            })
            .expect("open")
            .expect("passed");
        // The peer grows the file by one page and writes there.
        let grown = 2 * page_size() as libc::off_t;
        // SAFETY: ftruncate and pwrite on the peer's own fd of the memfd, from a valid buffer.
        unsafe {
            assert_eq!(libc::ftruncate(peer.as_raw_fd(), grown), 0);
            assert_eq!(
                libc::pwrite(
                    peer.as_raw_fd(),
                    b"x".as_ptr().cast(),
                    1,
                    page_size() as i64
                ),
                1
            );
        }
        assert!(
            matches!(arena.alloc(10), Err(Error::InvalidState(_))),
            "no region from an arena the peer resized"
        );
        assert!(arena.is_retired(), "the resized arena is retired");
    }

    #[test]
    fn a_read_only_arena_is_passed_sealed_as_an_o_rdonly_fd_and_carves_no_more() {
        let arena = Arena::create(c"t", true).unwrap();
        let mine = arena.alloc(100).unwrap();
        let (offset, len) = (mine.offset(), mine.len());
        let got = arena
            .pass(|fd| {
                // SAFETY: `fd` is open for the duration of the call; dup returns a new fd or -1.
                let dup = unsafe { libc::dup(fd) };
                assert!(dup >= 0);
                // SAFETY: dup just returned this fd, which nothing else owns.
                unsafe { OwnedFd::from_raw_fd(dup) }
            })
            .expect("open")
            .expect("sealed and reopened");
        // SAFETY: F_GETFL/F_GET_SEALS only read the fd's flags.
        let (flags, seals) = unsafe {
            (
                libc::fcntl(got.as_raw_fd(), libc::F_GETFL),
                libc::fcntl(got.as_raw_fd(), libc::F_GET_SEALS),
            )
        };
        assert_eq!(flags & libc::O_ACCMODE, libc::O_RDONLY, "an O_RDONLY grant");
        assert_ne!(
            seals & libc::F_SEAL_FUTURE_WRITE,
            0,
            "sealed against new writers"
        );
        let view = Mapping::open(got, offset, len).expect("the peer maps it");
        assert!(!view.writable(), "mapped read-only by the peer");
        // SAFETY: both pointers are inside their live mappings.
        unsafe {
            mine.ptr().add(7).write(0x5A);
            assert_eq!(
                view.ptr().add(7).read(),
                0x5A,
                "the owner still writes; the peer reads"
            );
        }
        assert!(
            matches!(arena.alloc(100), Err(Error::InvalidState(_))),
            "a sealed arena carves no more (no new writable mapping is possible)"
        );
    }
}
