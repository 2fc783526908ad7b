//! fds a peer process passed us, or shares with us, closed where their close cannot stall us.
//!
//! Closing the last reference to a file runs its release, and a peer chooses the files it passes
//! (`SCM_RIGHTS`): the release of a TCP socket with `SO_LINGER` and unsent data blocks for the
//! linger time the peer set; a Unix socket's release drops the files queued on it, which can be
//! such sockets again. Any fd a peer passed us, or any socket a peer can send files into (a
//! doorbell pair's end: [`super::bell`]), is therefore closed by one closer thread per process,
//! never by the application's threads or the device's progress thread ([`PeerFd`]). A memfd is
//! the exception: its release only frees shared memory, so it is closed in place.
//!
//! What a peer can still do: stall the closer thread, which delays only the closing of other
//! peers' fds (each held open that much longer).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::mpsc::{Sender, channel};

/// An fd a peer passed us or can send files into; its close goes to the closer thread unless it
/// is a memfd.
#[derive(Debug)]
pub(crate) struct PeerFd(Option<OwnedFd>);

impl PeerFd {
    pub(crate) fn new(fd: OwnedFd) -> PeerFd {
        PeerFd(Some(fd))
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// The fd itself if it is a memfd (closing it cannot block); `None` otherwise, and the fd
    /// goes to the closer thread.
    pub(crate) fn into_memfd(mut self) -> Option<OwnedFd> {
        if is_memfd(self.raw()) {
            self.0.take()
        } else {
            None
        }
    }
}

impl AsRawFd for PeerFd {
    fn as_raw_fd(&self) -> RawFd {
        self.raw()
    }
}

impl Drop for PeerFd {
    fn drop(&mut self) {
        if let Some(fd) = self.0.take() {
            close_later(fd);
        }
    }
}

/// The files of the `SCM_RIGHTS` messages in `msg`'s control data, each as a [`PeerFd`].
///
/// # Safety
/// `msg` was just filled by a successful `recvmsg` whose control buffer is still live: the fds
/// in it were installed in this process by that call and nothing owns them yet.
pub(crate) unsafe fn received_fds(msg: &libc::msghdr) -> Vec<PeerFd> {
    let mut fds = Vec::new();
    // SAFETY: the caller's contract; CMSG_FIRSTHDR/NXTHDR walk only inside the control data the
    // kernel filled, and each SCM_RIGHTS payload holds (cmsg_len - CMSG_LEN(0)) / 4 fds.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / 4 {
                    let fd = std::ptr::read_unaligned(data.add(i * 4).cast::<RawFd>());
                    fds.push(PeerFd::new(OwnedFd::from_raw_fd(fd)));
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    fds
}

/// A file whose seals can be read: a memfd (or another shmem file), whose release only frees
/// memory.
fn is_memfd(fd: RawFd) -> bool {
    // SAFETY: F_GET_SEALS only reads the file's seals; an fd of another kind fails EINVAL.
    fd >= 0 && unsafe { libc::fcntl(fd, libc::F_GET_SEALS) } >= 0
}

/// Closes `fd` on the closer thread (a memfd here and now).
pub(crate) fn close_later(fd: OwnedFd) {
    if is_memfd(fd.as_raw_fd()) {
        return; // dropped here
    }
    static CLOSER: OnceLock<Option<Mutex<Sender<OwnedFd>>>> = OnceLock::new();
    let closer = CLOSER.get_or_init(|| {
        let (tx, rx) = channel::<OwnedFd>();
        std::thread::Builder::new()
            .name("bx-soft-closer".into())
            .spawn(move || {
                for fd in rx {
                    drop(fd);
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    });
    let sent = match closer {
        Some(tx) => match tx.lock() {
            Ok(tx) => tx.send(fd).map_err(|e| e.0),
            Err(_) => Err(fd),
        },
        None => Err(fd),
    };
    if let Err(fd) = sent {
        // No closer thread (it could not be spawned): keeping the fd open is the only way
        // not to run a peer's release here.
        tracing::warn!("soft: no closer thread; an fd from a peer is kept open");
        std::mem::forget(fd);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Sends one byte with `fds` attached (`SCM_RIGHTS`) on the Unix socket `sock`, without
    /// waiting, as a peer passing files would.
    pub(crate) fn send_fds(sock: RawFd, fds: &[RawFd]) -> std::io::Result<()> {
        let mut byte = [1u8];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let bytes = std::mem::size_of_val(fds);
        let mut cbuf = vec![0u64; 4 + bytes / 8 + 1];
        // SAFETY: an all-zero msghdr is valid; `cbuf` holds CMSG_SPACE(bytes) for one cmsg.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &raw mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(bytes as u32) as _;
            let c = libc::CMSG_FIRSTHDR(&raw const msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), bytes);
            if libc::sendmsg(sock, &raw const msg, libc::MSG_DONTWAIT) < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// A TCP socket whose close lingers `secs` seconds: connected to a listener that never
    /// accepts nor reads, with more unsent data than the kernel buffers take.
    pub(crate) fn lingering_socket(secs: i32) -> (OwnedFd, std::net::TcpListener) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        s.set_nonblocking(true).unwrap();
        let junk = vec![0u8; 1 << 20];
        while std::io::Write::write(&mut &s, &junk).is_ok() {}
        let lg = libc::linger {
            l_onoff: 1,
            l_linger: secs,
        };
        let fd = OwnedFd::from(s);
        // SAFETY: a valid linger struct for SO_LINGER on an open socket.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const lg).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        // Blocking again, so that the close waits out the linger time.
        // SAFETY: F_SETFL on an open fd.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, 0) };
        (fd, l)
    }

    #[test]
    fn dropping_a_lingering_socket_a_peer_passed_returns_at_once() {
        // The premise: closing such a socket in place waits out its linger time.
        let (fd, _l) = lingering_socket(1);
        let t0 = Instant::now();
        drop(fd);
        assert!(
            t0.elapsed() >= Duration::from_millis(500),
            "no linger to test with"
        );
        let (fd, _l) = lingering_socket(3);
        let t0 = Instant::now();
        drop(PeerFd::new(fd));
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "the close ran here: {:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn a_memfd_is_kept_and_a_socket_is_not_taken_as_one() {
        // SAFETY: a valid name; the fd is owned below.
        let m = unsafe { libc::memfd_create(c"m".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: just created.
        let m = unsafe { OwnedFd::from_raw_fd(m) };
        assert!(PeerFd::new(m).into_memfd().is_some());
        let (fd, _l) = lingering_socket(0);
        assert!(PeerFd::new(fd).into_memfd().is_none());
    }
}
