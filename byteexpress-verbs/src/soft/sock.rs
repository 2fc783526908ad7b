//! `SOCK_SEQPACKET` Unix sockets in the Linux abstract namespace, with fd passing
//! (`SCM_RIGHTS`). Record boundaries keep each control message and its fds together.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use super::peer_fd::PeerFd;

/// Most fds one control message carries.
pub(crate) const MAX_FDS: usize = 5;
/// 8-byte words of a control buffer that holds SCM_MAX_FD (253) fds: CMSG_SPACE(253 × 4).
pub(crate) const CMSG_WORDS: usize = (16 + 253 * 4_usize).div_ceil(8);
/// Largest control message.
pub(crate) const MAX_MSG: usize = 2048;
/// Longest abstract socket name (sun_path minus the leading NUL).
pub(crate) const MAX_NAME: usize = 107;

/// A seqpacket socket.
#[derive(Debug)]
pub(crate) struct Sock {
    fd: OwnedFd,
}

/// What one `recv` returned.
#[derive(Debug)]
pub(crate) enum Recv {
    /// A record of `n` bytes and the fds that came with it.
    Msg(usize, Vec<PeerFd>),
    /// The peer closed its end.
    Eof,
    /// Nothing queued (non-blocking receive).
    Empty,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn abstract_addr(name: &[u8]) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "bad socket name length",
        ));
    }
    // SAFETY: an all-zero sockaddr_un is a valid value of this plain C struct.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path[1..].iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    Ok((addr, len as libc::socklen_t))
}

fn new_socket(extra: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket has no memory-safety preconditions.
    let raw = cvt(unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | extra,
            0,
        )
    })?;
    // SAFETY: socket just returned this fd, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

impl Sock {
    /// A non-blocking listener bound to the abstract name `name`.
    pub(crate) fn listen(name: &[u8]) -> io::Result<Sock> {
        let fd = new_socket(libc::SOCK_NONBLOCK)?;
        let (addr, len) = abstract_addr(name)?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        cvt(unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) })?;
        // SAFETY: `fd` is a bound socket.
        cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
        Ok(Sock { fd })
    }

    /// Accepts one pending connection (non-blocking), if any.
    pub(crate) fn accept(&self) -> io::Result<Option<Sock>> {
        // SAFETY: NULL address arguments are allowed; `self.fd` is a listening socket.
        let r = unsafe {
            libc::accept4(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: accept4 just returned this fd, which nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(r) };
        Ok(Some(Sock { fd }))
    }

    /// A blocking connection to the abstract name `name`; `timeout` bounds connect, send and
    /// receive.
    pub(crate) fn connect(name: &[u8], timeout: Duration) -> io::Result<Sock> {
        let s = Sock { fd: new_socket(0)? };
        s.set_timeouts(timeout)?;
        let (addr, len) = abstract_addr(name)?;
        loop {
            // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
            let r = unsafe { libc::connect(s.fd.as_raw_fd(), (&raw const addr).cast(), len) };
            if r == 0 {
                return Ok(s);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    pub(crate) fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        let tv = libc::timeval {
            tv_sec: t.as_secs() as libc::time_t,
            tv_usec: t.subsec_micros() as libc::suseconds_t,
        };
        for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
            // SAFETY: `tv` is a valid timeval of the given size.
            cvt(unsafe {
                libc::setsockopt(
                    self.fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&raw const tv).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                )
            })?;
        }
        Ok(())
    }
    /// The credentials of the process at the other end, as the kernel recorded them
    /// (`SO_PEERCRED`, unix(7)): for an accepted socket, the connecting process's at
    /// `connect`; for a connected one, the listening process's at `listen`. A peer cannot
    /// forge them.
    pub(crate) fn peer_cred(&self) -> io::Result<libc::ucred> {
        let mut cred = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: `cred` and `len` are valid and writable, and `len` is the size of `cred`.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(cred)
    }

    /// The pid of the process at the other end ([`Sock::peer_cred`]).
    pub(crate) fn peer_pid(&self) -> io::Result<libc::pid_t> {
        self.peer_cred().map(|c| c.pid)
    }

    /// Ends the connection both ways (`shutdown(2)`, `SHUT_RDWR`): the other end reads EOF,
    /// and so does a poll of this end, while the fd stays open for whoever holds it.
    pub(crate) fn shutdown(&self) {
        // SAFETY: plain syscall on an fd we own; failure (already shut down) is harmless.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Sends one record with `fds` attached.
    pub(crate) fn send(&self, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
        self.send_flags(data, fds, libc::MSG_NOSIGNAL)
    }

    /// Sends one record with `fds` attached unless that would block (`WouldBlock`).
    pub(crate) fn send_nowait(&self, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
        self.send_flags(data, fds, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
    }

    /// Waits up to `timeout` for room to send; false when there is none by then.
    pub(crate) fn wait_writable(&self, timeout: Duration) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        // Interrupted: the caller tries again (and waits again, for what is left).
        (r > 0 && pfd.revents & libc::POLLOUT != 0)
            || (r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted)
    }

    /// Sends one record without fds unless that would block (a peer that reads nothing
    /// cannot stall the caller).
    pub(crate) fn try_send(&self, data: &[u8]) -> io::Result<()> {
        self.send_flags(data, &[], libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
    }

    fn send_flags(&self, data: &[u8], fds: &[RawFd], flags: libc::c_int) -> io::Result<()> {
        if fds.len() > MAX_FDS {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds"));
        }
        let mut iov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let mut cbuf = [0u64; 8];
        // SAFETY: an all-zero msghdr is a valid value of this plain C struct.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let bytes = std::mem::size_of_val(fds) as u32;
            // SAFETY: CMSG_SPACE only computes a size.
            let space = unsafe { libc::CMSG_SPACE(bytes) } as usize;
            debug_assert!(space <= std::mem::size_of_val(&cbuf));
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: msg_control points to `space` bytes of aligned, zeroed memory, enough for
            // one header plus `fds` (MAX_FDS fit in `cbuf`); CMSG_FIRSTHDR/CMSG_DATA stay
            // inside it.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&raw const msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(bytes) as _;
                std::ptr::copy_nonoverlapping(
                    fds.as_ptr().cast::<u8>(),
                    libc::CMSG_DATA(c),
                    bytes as usize,
                );
            }
        }
        loop {
            // SAFETY: `msg` points to live iovec and control buffers set up above.
            let r = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &raw const msg, flags) };
            if r >= 0 {
                return if r as usize == data.len() {
                    Ok(())
                } else {
                    Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "short seqpacket send",
                    ))
                };
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Receives one record into `buf`; `wait` = block (up to the socket's timeout).
    /// A truncated record is an error (its fds are closed).
    pub(crate) fn recv(&self, buf: &mut [u8], wait: bool) -> io::Result<Recv> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // Room for the most fds one message can carry (SCM_MAX_FD, 253): fds that did not fit
        // would be closed by the kernel in this thread ([`super::peer_fd`]).
        let mut cbuf = [0u64; CMSG_WORDS];
        // SAFETY: an all-zero msghdr is a valid value of this plain C struct.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        let flags = libc::MSG_CMSG_CLOEXEC | if wait { 0 } else { libc::MSG_DONTWAIT };
        let n = loop {
            // SAFETY: `msg` points to live, writable iovec and control buffers.
            let r = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &raw mut msg, flags) };
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock if !wait => return Ok(Recv::Empty),
                _ if e.raw_os_error() == Some(libc::ECONNRESET) => return Ok(Recv::Eof),
                _ => return Err(e),
            }
        };
        // SAFETY: `msg` was just filled by this successful recvmsg; `cbuf` is live.
        let fds = unsafe { super::peer_fd::received_fds(&msg) };
        if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "truncated control message",
            ));
        }
        if n == 0 && fds.is_empty() {
            return Ok(Recv::Eof);
        }
        Ok(Recv::Msg(n, fds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::peer_fd::tests::lingering_socket;
    use std::time::Instant;

    /// Regression (review of issue 22): the control buffer held 12 fds; a peer's record with
    /// more had the rest closed by the kernel in the receiving thread (the device's progress
    /// thread), where a lingering socket's close waited out its linger time.
    #[test]
    fn a_record_with_many_lingering_sockets_is_received_without_closing_any_in_place() {
        let name = format!("bx-sock-test-{}", std::process::id());
        let l = Sock::listen(name.as_bytes()).unwrap();
        let c = Sock::connect(name.as_bytes(), Duration::from_secs(5)).unwrap();
        let s = (0..50)
            .find_map(|_| {
                std::thread::sleep(Duration::from_millis(10));
                l.accept().unwrap()
            })
            .expect("accepted");
        let (file, _l) = lingering_socket(3);
        // 20 copies of one lingering socket: more than the old buffer's 12.
        let fds = [file.as_raw_fd(); 20];
        crate::soft::peer_fd::tests::send_fds(c.raw(), &fds).unwrap();
        drop(file); // the copies in flight are the last ones
        let mut buf = [0u8; 16];
        let t0 = Instant::now();
        let got = s.recv(&mut buf, true).unwrap();
        let took = t0.elapsed();
        match got {
            Recv::Msg(1, fds) => assert_eq!(fds.len(), 20),
            other => panic!("{other:?}"),
        }
        assert!(
            took < Duration::from_secs(2),
            "a close ran in place: {took:?}"
        );
    }
}
