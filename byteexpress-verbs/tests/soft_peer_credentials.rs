//! Who may talk to the soft device (issue 22, item 3), tried by forked children that speak the
//! device's control protocol on raw sockets (not through the verbs API):
//! - a process of another uid (a child that dropped to `nobody` with setuid) gets no answer
//!   from the device's socket, while the same child logic at our uid does;
//! - a QP `connect` sends no memfd to a socket whose listener runs as another uid, nor to one of
//!   our uid whose process never took part in a nonce probe with our device.
//!
//! Needs root (to setuid); tests run as root here and in CI. Not root: the tests fail unless
//! `BX_ALLOW_SKIP` contains `uid`.

mod common;

use byteexpress_verbs::{ConnectAttr, Endpoint, QpCap};
use common::*;

/// `nobody` on Debian.
const NOBODY: libc::uid_t = 65534;

/// Exit codes of the children.
const REFUSED: i32 = 0;
const ANSWERED: i32 = 10;
const GOT_FDS: i32 = 11;
const SETUP_FAILED: i32 = 20;

/// True when the uid tests can run; panics when they cannot and no skip was allowed.
fn root_or_skip() -> bool {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    let allowed =
        std::env::var("BX_ALLOW_SKIP").is_ok_and(|v| v.split(',').any(|t| t.trim() == "uid"));
    assert!(
        allowed,
        "these tests drop privileges with setuid and must run as root \
         (BX_ALLOW_SKIP=uid skips them)"
    );
    eprintln!("SKIPPED: not root (BX_ALLOW_SKIP=uid)");
    false
}

/// An abstract-namespace address for `name`.
fn addr(name: &[u8]) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in a.sun_path[1..].iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    (a, len as libc::socklen_t)
}

/// Drops to `uid` (group too); false on failure. Only async-signal-safe calls: runs in a
/// forked child of a threaded process.
fn drop_to(uid: libc::uid_t) -> bool {
    // SAFETY: plain syscalls.
    unsafe {
        libc::setgroups(0, std::ptr::null()) == 0
            && libc::setgid(uid) == 0
            && libc::setuid(uid) == 0
            && libc::getuid() == uid
    }
}

/// Runs `child` in a forked process (which exits with its return value) and returns that
/// exit code. The child must only make syscalls on memory prepared before the fork.
fn in_child(child: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child runs only `child` (syscalls on pre-built data) and `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let code = child();
        // SAFETY: ends the child without running the parent's atexit handlers or destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
    libc::WEXITSTATUS(status)
}

/// A child that connects to `name`, sends `msg` and reports whether a reply came
/// (ANSWERED) or the device closed the connection (REFUSED).
fn probe_child(name: &[u8], msg: &[u8], uid: Option<libc::uid_t>) -> i32 {
    let (a, alen) = addr(name);
    let mut buf = [0u8; 256];
    in_child(|| {
        if let Some(u) = uid
            && !drop_to(u)
        {
            return SETUP_FAILED;
        }
        // SAFETY: syscalls on the stack data above.
        unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
            if fd < 0 {
                return SETUP_FAILED;
            }
            let tv = libc::timeval {
                tv_sec: 5,
                tv_usec: 0,
            };
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
            if libc::connect(fd, (&raw const a).cast(), alen) != 0 {
                return REFUSED;
            }
            if libc::send(fd, msg.as_ptr().cast(), msg.len(), libc::MSG_NOSIGNAL) < 0 {
                return REFUSED;
            }
            let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            if n > 0 { ANSWERED } else { REFUSED }
        }
    })
}

/// `Probe { nonce }` as the wire puts it (tag 1, u64 LE).
fn probe_msg(nonce: u64) -> Vec<u8> {
    let mut m = vec![1u8];
    m.extend_from_slice(&nonce.to_le_bytes());
    m
}

#[test]
fn a_process_of_another_uid_gets_no_answer_from_the_soft_device_socket() {
    if !root_or_skip() {
        return;
    }
    let ctx = soft();
    let name = info_name(&ctx.device_info());
    for (i, uid) in [(1u64, None), (2, Some(NOBODY))] {
        let nonce = 0xC0DE_0000 + i;
        ctx.expect_probe(nonce);
        let got = probe_child(&name, &probe_msg(nonce), uid);
        match uid {
            None => assert_eq!(got, ANSWERED, "a process of our uid is answered"),
            Some(_) => assert_eq!(got, REFUSED, "uid nobody must get no answer"),
        }
    }
}

/// The socket name inside a soft `DeviceInfo` (wire form: provider u8, len u16, then the
/// device id u64 and the name).
fn info_name(info: &byteexpress_verbs::DeviceInfo) -> Vec<u8> {
    info.to_bytes()[3 + 8..].to_vec()
}

/// A child that listens on `name` as `uid` (None: ours), signals readiness through `ready`
/// (a pipe), accepts one connection and reports GOT_FDS when a message with fds arrives.
fn listener_child(name: &[u8], uid: Option<libc::uid_t>, ready: libc::c_int) -> i32 {
    let (a, alen) = addr(name);
    let mut buf = [0u8; 2048];
    let mut cbuf = [0u64; 16];
    if let Some(u) = uid
        && !drop_to(u)
    {
        return SETUP_FAILED;
    }
    // SAFETY: syscalls on the stack data above.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
        if fd < 0 || libc::bind(fd, (&raw const a).cast(), alen) != 0 || libc::listen(fd, 4) != 0 {
            return SETUP_FAILED;
        }
        let one = 1u8;
        libc::write(ready, (&raw const one).cast(), 1);
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut p, 1, 8000) <= 0 {
            return REFUSED; // nobody came
        }
        let c = libc::accept(fd, std::ptr::null_mut(), std::ptr::null_mut());
        if c < 0 {
            return REFUSED;
        }
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        let tv = libc::timeval {
            tv_sec: 8,
            tv_usec: 0,
        };
        libc::setsockopt(
            c,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
        let n = libc::recvmsg(c, &raw mut msg, 0);
        if n > 0 && msg.msg_controllen > 0 {
            GOT_FDS
        } else if n > 0 {
            ANSWERED
        } else {
            REFUSED
        }
    }
}

/// Our QP connects to an endpoint whose address is a socket `uid` listens on in a child:
/// returns the connect's result and what the child received.
fn connect_to_listener(uid: Option<libc::uid_t>, tag: &str) -> (bool, i32) {
    let s = soft_side(QpCap::default(), 4096);
    let name = format!("bx-test-listener-{}-{tag}", std::process::id()).into_bytes();
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for two fds.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: as in `in_child`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = listener_child(&name, uid, fds[1]);
        // SAFETY: ends the child.
        unsafe { libc::_exit(code) };
    }
    let mut one = 0u8;
    // SAFETY: reads one byte into `one`.
    let r = unsafe { libc::read(fds[0], (&raw mut one).cast(), 1) };
    assert_eq!(r, 1, "the listener child is ready");
    // Our own endpoint with the child's socket name as its address (wire form: 31 bytes of
    // fields, u16 length, address).
    let mut ep = s.qp.endpoint().to_bytes()[..31].to_vec();
    ep.extend_from_slice(&(name.len() as u16).to_le_bytes());
    ep.extend_from_slice(&name);
    let ep = Endpoint::from_bytes(&ep).unwrap();
    let res = s.qp.connect(&ep, &ConnectAttr::default());
    if let Err(e) = &res {
        eprintln!("connect refused: {e}");
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status));
    // SAFETY: closes our pipe ends.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    (res.is_ok(), libc::WEXITSTATUS(status))
}

#[test]
fn a_qp_connect_sends_no_memfd_to_a_listener_of_another_uid() {
    if !root_or_skip() {
        return;
    }
    let (ok, child) = connect_to_listener(Some(NOBODY), "nobody");
    assert!(!ok, "connect to another uid's socket must fail");
    assert_ne!(child, SETUP_FAILED);
    assert_ne!(child, GOT_FDS, "another uid's listener was sent memfds");
    assert_ne!(child, ANSWERED, "another uid's listener was sent a Connect");
}

#[test]
fn a_qp_connect_sends_no_memfd_to_a_process_that_never_probed() {
    let (ok, child) = connect_to_listener(None, "unprobed");
    assert!(!ok, "connect to a process that never probed must fail");
    assert_ne!(child, SETUP_FAILED);
    assert_ne!(child, GOT_FDS, "an unprobed process was sent memfds");
}
