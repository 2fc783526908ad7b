//! A peer that stops reading its control channel must cost that peer only: announcements
//! of a PD's new MRs to it (sent while the PD's lock is held) wait on it once, for at most
//! the control timeout (5 s), so other registrations on the PD go on, and the peer is dropped
//! (its channel closed) rather than skipped silently (review of issue 22).
//!
//! The peer is this test binary started again (`child_entry`, role `stopped-listener`): it
//! listens on a socket of its own as a device would, probes ours, takes our QP's `Connect`,
//! answers it, and then reads nothing until told to.

mod common;

use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::time::Duration;

use byteexpress_verbs::{Access, ConnectAttr, Endpoint, QpCap};
use common::peer::{self, get, put};
use common::raw::{self, CONNECT_OK, abstract_addr, recv_msg, send_msg};
use common::*;

const T: Duration = Duration::from_secs(10);
/// Registrations made while the peer reads nothing: many times what its socket buffers.
const REGISTRATIONS: usize = 3000;

#[test]
fn child_entry() {
    let Some((role, mut s)) = peer::peer_role() else {
        return;
    };
    match role.as_str() {
        "stopped-listener" => child_stopped_listener(&mut s),
        other => panic!("unknown role {other}"),
    }
}

fn child_stopped_listener(s: &mut TcpStream) {
    let dev_name = get(s);
    let nonce = u64::from_le_bytes(get(s).try_into().unwrap());
    // Our "device" socket, which the victim's connect dials.
    let name = format!("bx-stopped-{}", std::process::id()).into_bytes();
    let l = raw::seqpacket();
    let (a, len) = abstract_addr(&name);
    // SAFETY: a valid address of `len` bytes; plain syscalls on an fd we own.
    unsafe {
        assert_eq!(libc::bind(l.as_raw_fd(), (&raw const a).cast(), len), 0);
        assert_eq!(libc::listen(l.as_raw_fd(), 4), 0);
    }
    // The probe: after it our process may be sent memfds.
    raw::probe(&dev_name, nonce);
    put(s, &name);
    // SAFETY: accept on our listener; the fd is checked and owned below.
    let c = unsafe { libc::accept(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
    assert!(c >= 0, "the victim dials us");
    // SAFETY: a fresh fd nothing else owns.
    let c = unsafe { OwnedFd::from_raw_fd(c) };
    let (m, _fds) = recv_msg(c.as_raw_fd());
    assert_eq!(m[0], 3, "a Connect");
    send_msg(c.as_raw_fd(), &CONNECT_OK, &[]);
    // Stopped: nothing read until the parent is done registering.
    assert_eq!(get(s), b"drain");
    let mut buf = [0u8; 2048];
    let mut n = 0u64;
    let end = loop {
        // SAFETY: `buf` is writable for its length (fds passed along are closed with the
        // process).
        let r = unsafe { libc::recv(c.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        match r {
            0 => break "eof",
            r if r > 0 => n += 1,
            _ => break "still open",
        }
    };
    put(s, format!("{end} after {n} records").as_bytes());
    assert_eq!(get(s), b"done");
}

#[test]
fn registrations_on_a_pd_wait_for_a_peer_that_stopped_reading_at_most_once_and_that_peer_is_dropped()
 {
    if peer::peer_role().is_some() {
        return;
    }
    let ctx = soft();
    let victim = soft_side(QpCap::default(), 4096);
    let nonce = 0x57_0990_u64 ^ u64::from(std::process::id());
    ctx.expect_probe(nonce);
    let (mut child, mut s) = peer::spawn_peer("child_entry", "stopped-listener", T);
    let info = ctx.device_info().to_bytes();
    put(&mut s, &info[3 + 8..]); // the device's socket name
    put(&mut s, &nonce.to_le_bytes());
    let name = get(&mut s);
    let mut ep = victim.qp.endpoint().to_bytes()[..31].to_vec();
    ep[1..5].copy_from_slice(&0x4444u32.to_le_bytes());
    ep.extend_from_slice(&(name.len() as u16).to_le_bytes());
    ep.extend_from_slice(&name);
    victim
        .qp
        .connect(&Endpoint::from_bytes(&ep).unwrap(), &ConnectAttr::default())
        .expect("the victim connects to the peer");
    // Registrations on the victim's PD, each announced to the stopped peer, in a thread: a
    // regression blocks them (5 s a send once the socket is full), which fails the bound
    // below instead of hanging the test.
    let (tx, rx) = mpsc::channel();
    let pd = victim.pd.clone();
    let mem = victim.mem.clone();
    std::thread::spawn(move || {
        let mrs: Vec<_> = (0..REGISTRATIONS)
            .map(|_| pd.reg_shared(&mem, 0, 4096, Access::ALL).unwrap())
            .collect();
        let _ = tx.send(mrs.len());
        drop(mrs);
        let _ = tx.send(0);
    });
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(60)),
        Ok(REGISTRATIONS),
        "every registration returned although the peer reads nothing"
    );
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(60)),
        Ok(0),
        "every deregistration returned too"
    );
    put(&mut s, b"drain");
    let seen = String::from_utf8(get(&mut s)).unwrap();
    assert!(
        seen.starts_with("eof"),
        "the stopped peer was dropped (its channel closed), not skipped: {seen}"
    );
    put(&mut s, b"done");
    assert!(child.wait().unwrap().success(), "the peer ran to the end");
}
