//! Review of issue 22 (hostile peer): a peer's `Connect` carries its ring as a memfd. The
//! device maps it read-only when the fd is `O_RDONLY` (soft/shm.rs `Mapping::open` follows the
//! fd's access mode) and `Ring::new` / `SoftDevice::attach` never check that the mapping is
//! writable, though our sender stores into the peer's ring (claims `recv_cons`, writes
//! completion slots, clears `armed`). A peer that passes its ring `O_RDONLY` and posts one
//! receive kills our process with SIGSEGV at our next SEND to it.
//!
//! The victim runs in a child process (this binary again, `BX_REVIEW_VICTIM=1`) so that its
//! death is observed; the hostile peer is a grandchild (`child_entry`, role `ro-ring`).

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use byteexpress_verbs::{ConnectAttr, QpCap, WrOp};
use common::peer::{self, get, put};
use common::raw::{self, CAP, CONNECT_OK, SGE, STAGE, connect_msg, dial, recv_msg, send_msg};
use common::*;

const VICTIM: &str = "BX_REVIEW_VICTIM";

#[test]
fn child_entry() {
    let Some((role, mut s)) = peer::peer_role() else {
        return;
    };
    assert!(role == "ro-ring" || role == "rw-ring", "role {role}");
    ro_ring_peer(&mut s, role == "ro-ring");
}

/// As `common::raw::attach`, but our ring goes to the victim as an `O_RDONLY` fd; one
/// receive WQE is then posted in it (our own writable mapping).
fn ro_ring_peer(s: &mut TcpStream, read_only: bool) {
    let dev_name = get(s);
    let nonce = u64::from_le_bytes(get(s).try_into().unwrap());
    let victim_qpn = u32::from_le_bytes(get(s).try_into().unwrap());
    let my_name = format!("bx-ro-ring-{}", std::process::id()).into_bytes();
    raw::probe(&dev_name, nonce);
    let ring = raw::memfd(c"ro-ring", raw::ring_bytes(CAP, SGE));
    let stage = raw::memfd(c"ro-ring-stage", STAGE);
    let (_bell_rx, bell) = raw::doorbell();
    // SAFETY: open of our own /proc fd path; owned below.
    let ring_ro = unsafe {
        let path = std::ffi::CString::new(format!("/proc/self/fd/{}", ring.as_raw_fd())).unwrap();
        let mode = if read_only {
            libc::O_RDONLY
        } else {
            libc::O_RDWR
        };
        let ro = libc::open(path.as_ptr(), mode | libc::O_CLOEXEC);
        assert!(ro >= 0);
        OwnedFd::from_raw_fd(ro)
    };
    let my_ring = raw::map(ring.as_raw_fd(), raw::ring_bytes(CAP, SGE), true);
    let c = dial(&dev_name);
    send_msg(
        c.as_raw_fd(),
        &connect_msg(0x4242, victim_qpn, &my_name, 0),
        &[ring_ro.as_raw_fd(), bell.as_raw_fd(), stage.as_raw_fd()],
    );
    let (reply, _) = recv_msg(c.as_raw_fd());
    let accepted = reply[..2] == [4, 1];
    put(s, &my_name);
    if accepted {
        let (m, _fds) = recv_msg(c.as_raw_fd());
        assert_eq!(m[0], 3, "a Connect");
        send_msg(c.as_raw_fd(), &CONNECT_OK, &[]);
        // One receive WQE of ours (1 SGE of 64 bytes): the victim may send to us.
        // SAFETY: offsets inside our own ring mapping, aligned.
        unsafe {
            raw::put32(my_ring, 512, 1);
            raw::put64(my_ring, 512 + 16, 0x1000);
            raw::put32(my_ring, 512 + 24, 64);
            raw::put64(my_ring, raw::OFF_RECV_PROD, 1);
        }
    }
    put(s, if accepted { b"accepted" } else { b"refused!" });
    let _ = get(s); // until the victim is done or dead
    drop((c, ring, stage, bell, ring_ro));
}

/// The victim's side (in the child process).
fn victim(role: &str) {
    let ctx = soft();
    let v = soft_side(QpCap::default(), 4096);
    let nonce = 0x0D0_u64 ^ u64::from(std::process::id());
    let (mut child, mut s, connected) = raw::raw_peer_connecting(
        &ctx,
        &v,
        "child_entry",
        role,
        nonce,
        &ConnectAttr::default(),
    );
    let verdict = get(&mut s);
    eprintln!(
        "victim: the peer's {role} was {}; our connect back: {connected:?}",
        String::from_utf8_lossy(&verdict)
    );
    // The peer's Connect with a read-only ring is refused (that QP only); a read-write one
    // is accepted.
    if role == "ro-ring" {
        assert_eq!(verdict, b"refused!", "a read-only ring is refused");
        assert!(connected.is_err(), "no connection to a peer we refused");
    } else {
        assert_eq!(verdict, b"accepted", "a read-write ring is accepted");
        assert!(connected.is_ok(), "connected: {connected:?}");
    }
    v.write(0, b"hello");
    // If this store into the peer's read-only ring faults, the process dies here.
    let posted = v.send(1, WrOp::Send, 0, 5, true);
    let wc = poll_for(&v.send_cq, Duration::from_millis(500));
    eprintln!("victim: post_send {posted:?}, completions {wc:?}; still alive");
    put(&mut s, b"done");
    let _ = child.wait();
    std::io::stderr().flush().unwrap();
}

#[test]
fn a_peer_passing_its_ring_read_only_cannot_crash_us() {
    if peer::peer_role().is_some() {
        return;
    }
    run(
        "ro-ring",
        "a_peer_passing_its_ring_read_only_cannot_crash_us",
    );
}

/// Control: the same peer passing its ring read-write; the victim survives its SEND.
#[test]
fn control_the_same_peer_with_a_read_write_ring_leaves_us_alive() {
    if peer::peer_role().is_some() {
        return;
    }
    run(
        "rw-ring",
        "control_the_same_peer_with_a_read_write_ring_leaves_us_alive",
    );
}

fn run(role: &str, me: &str) {
    if let Ok(r) = std::env::var(VICTIM) {
        victim(&r);
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([me, "--exact", "--nocapture", "--test-threads=1"])
        .env(VICTIM, role)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("victim process: {:?}\n{err}", out.status);
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.success(),
        "the victim process died (signal {:?}) after one SEND to a peer ({role})",
        out.status.signal()
    );
}
