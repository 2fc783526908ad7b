//! The kernel mechanism a read-only memory grant of the soft provider rests on (issue 22, item 1;
//! DESIGN.md 3.1), checked on this host's kernel: a memfd its owner mapped writable and then
//! sealed with `F_SEAL_FUTURE_WRITE` (Linux ≥ 5.1), passed as an `O_RDONLY` fd, cannot be
//! written by the process that receives it: no writable shared mapping (not even after reopening
//! it read-write through `/proc/self/fd`, which root or the same uid may do), no `write(2)`, no
//! `mprotect(2)` upgrade of its read-only mapping; a private writable mapping is copy-on-write
//! and never reaches the owner. The owner's own writable mapping keeps working. Without the
//! seal, the reopened fd does write the owner's memory (the control case).

use std::ffi::CString;

const LEN: usize = 4096;

fn memfd() -> libc::c_int {
    // SAFETY: a valid NUL-terminated name; valid flags.
    let fd = unsafe {
        libc::memfd_create(
            c"bx-seal-test".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: `fd` is an open memfd.
    assert_eq!(unsafe { libc::ftruncate(fd, LEN as libc::off_t) }, 0);
    fd
}

fn map(fd: libc::c_int, prot: libc::c_int, flags: libc::c_int) -> Result<*mut u8, i32> {
    // SAFETY: a fresh mapping where the kernel chooses; nothing existing is affected.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), LEN, prot, flags, fd, 0) };
    if p == libc::MAP_FAILED {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(p.cast())
    }
}

/// Reopens `fd` through `/proc/self/fd` with `flags`, as a receiving process could.
fn reopen(fd: libc::c_int, flags: libc::c_int) -> libc::c_int {
    let path = CString::new(format!("/proc/self/fd/{fd}")).unwrap();
    // SAFETY: a valid path; the result is checked by the caller.
    unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) }
}

/// The owner's setup: a writable shared mapping, then (when `seal`) the seals, and the
/// read-only fd it would pass to a peer.
fn owner(seal: bool) -> (libc::c_int, *mut u8, libc::c_int) {
    let fd = memfd();
    let own = map(fd, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED).expect("owner maps");
    if seal {
        let seals =
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;
        // SAFETY: `fd` is a sealable memfd.
        let rc = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) };
        assert_eq!(rc, 0, "F_ADD_SEALS");
    }
    let ro = reopen(fd, libc::O_RDONLY);
    assert!(ro >= 0, "read-only reopen");
    // SAFETY: `own` maps LEN writable bytes.
    unsafe { own.write(7) };
    (fd, own, ro)
}

#[test]
fn a_future_write_sealed_memfd_passed_read_only_cannot_be_written_by_its_receiver() {
    let (fd, own, ro) = owner(true);
    // A read-only shared mapping works and shows the owner's data.
    let view = map(ro, libc::PROT_READ, libc::MAP_SHARED).expect("read-only mapping");
    // SAFETY: `view` maps LEN readable bytes.
    assert_eq!(unsafe { view.read() }, 7);
    // No writable shared mapping through the read-only fd.
    assert_eq!(
        map(ro, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED).err(),
        Some(libc::EACCES)
    );
    // No upgrade of the read-only mapping.
    // SAFETY: `view` is a mapping of LEN bytes; mprotect only changes its protection.
    let rc = unsafe { libc::mprotect(view.cast(), LEN, libc::PROT_READ | libc::PROT_WRITE) };
    assert_ne!(rc, 0, "mprotect upgrade of a read-only grant must fail");
    // No write(2) through it.
    // SAFETY: writes one byte from a valid buffer.
    assert!(unsafe { libc::pwrite(ro, [1u8].as_ptr().cast(), 1, 0) } < 0);
    // Reopened read-write (allowed to root / the same uid): still no write and no writable
    // shared mapping, because of the seal.
    let rw = reopen(ro, libc::O_RDWR);
    assert!(rw >= 0, "the reopen itself is allowed");
    // SAFETY: as above.
    let written = unsafe { libc::pwrite(rw, [1u8].as_ptr().cast(), 1, 0) };
    assert!(written < 0, "write after reopen");
    assert_eq!(
        map(rw, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED).err(),
        Some(libc::EPERM),
        "writable shared mapping after reopen"
    );
    // A private writable mapping is copy-on-write: the owner never sees it.
    let private = map(rw, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE).expect("private");
    // SAFETY: `private` and `own` map LEN bytes each.
    unsafe {
        private.write(99);
        assert_eq!(own.read(), 7, "a private mapping reached the owner");
        // The owner's writable mapping made before the seal still writes.
        own.write(8);
        assert_eq!(view.read(), 8);
        for (p, _) in [(view, 0), (private, 0), (own, 0)] {
            libc::munmap(p.cast(), LEN);
        }
        libc::close(rw);
        libc::close(ro);
        libc::close(fd);
    }
}

#[test]
fn without_the_seal_a_read_only_fd_reopened_read_write_writes_the_owners_memory() {
    let (fd, own, ro) = owner(false);
    let rw = reopen(ro, libc::O_RDWR);
    assert!(rw >= 0);
    let w = map(rw, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED)
        .expect("unsealed: writable shared mapping after reopen");
    // SAFETY: `w` and `own` map LEN bytes each.
    unsafe {
        w.write(42);
        assert_eq!(
            own.read(),
            42,
            "an O_RDONLY fd alone does not protect the memory"
        );
        libc::munmap(w.cast(), LEN);
        libc::munmap(own.cast(), LEN);
        libc::close(rw);
        libc::close(ro);
        libc::close(fd);
    }
}
