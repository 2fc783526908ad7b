//! A process that passed a probe attaches a QP of its own to one of our QPs still in RESET
//! (it guessed the QP number) before our `connect` names the QP's rightful peer. Our QP must
//! still connect to that peer, deliver its SENDs there, and give the intruder nothing: the
//! intruder's channel is closed and it never gets our ring (review of issue 22).
//!
//! The intruder is this test binary started again (`child_entry`, role `intruder`), speaking
//! the control protocol on raw sockets.

mod common;

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Duration;

use byteexpress_verbs::{ConnectAttr, QpCap, WcStatus, WrOp};
use common::peer::{self, get, put};
use common::raw::{self, CAP, SGE, STAGE, connect_msg, dial, map, memfd, recv_msg, send_msg};
use common::*;

const T: Duration = Duration::from_secs(10);

#[test]
fn child_entry() {
    let Some((role, mut s)) = peer::peer_role() else {
        return;
    };
    match role.as_str() {
        "intruder" => child_intruder(&mut s),
        other => panic!("unknown role {other}"),
    }
}

/// Probes the device (as link set-up would), attaches a QP of its own to the victim QP by
/// number, then reports what its channel brings once the victim connected elsewhere: `eof`
/// (closed by the victim's device), `message <tag>`, or `nothing` (10 s read timeout).
fn child_intruder(s: &mut TcpStream) {
    let dev_name = get(s);
    let nonce = u64::from_le_bytes(get(s).try_into().unwrap());
    let victim_qpn = u32::from_le_bytes(get(s).try_into().unwrap());
    raw::probe(&dev_name, nonce);
    let ring = memfd(c"intruder-ring", raw::ring_bytes(CAP, SGE));
    let stage = memfd(c"intruder-stage", STAGE);
    let (_bell_rx, bell) = raw::doorbell();
    let _ring_map = map(ring.as_raw_fd(), raw::ring_bytes(CAP, SGE), true);
    let c = dial(&dev_name);
    let name = format!("bx-intruder-{}", std::process::id()).into_bytes();
    send_msg(
        c.as_raw_fd(),
        &connect_msg(0x4343, victim_qpn, &name, 0),
        &[ring.as_raw_fd(), bell.as_raw_fd(), stage.as_raw_fd()],
    );
    let (reply, _) = recv_msg(c.as_raw_fd());
    put(s, &reply[..2]);
    assert_eq!(get(s), b"check");
    let mut buf = [0u8; 2048];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { libc::recv(c.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    let seen = match n {
        0 => "eof".to_string(),
        n if n > 0 => format!("message {}", buf[0]),
        _ => "nothing".to_string(),
    };
    put(s, seen.as_bytes());
    assert_eq!(get(s), b"done");
}

#[test]
fn an_intruder_attached_before_connect_is_evicted_and_the_rightful_peer_connects() {
    if peer::peer_role().is_some() {
        return;
    }
    let ctx = soft();
    let victim = soft_side(QpCap::default(), 4096);
    let rightful = soft_side(QpCap::default(), 4096);
    let nonce = 0x1A7E_u64 ^ u64::from(std::process::id());
    ctx.expect_probe(nonce);
    let (mut child, mut s) = peer::spawn_peer("child_entry", "intruder", T);
    let info = ctx.device_info().to_bytes();
    put(&mut s, &info[3 + 8..]); // the device's socket name
    put(&mut s, &nonce.to_le_bytes());
    put(&mut s, &victim.qp.qp_num().to_le_bytes());
    let attached = get(&mut s);
    // A QP in RESET cannot tell an intruder from its rightful peer connecting first, so the
    // intruder's Connect may be accepted (pending); what follows is the point.
    let attr = ConnectAttr::default();
    victim
        .qp
        .connect(&rightful.qp.endpoint(), &attr)
        .expect("the victim connects to its rightful peer although an intruder attached first");
    rightful
        .qp
        .connect(&victim.qp.endpoint(), &attr)
        .expect("the rightful peer connects back");
    put(&mut s, b"check");
    let seen = String::from_utf8(get(&mut s)).unwrap();
    for i in 0..4u64 {
        rightful.post_recv(i, 0, 64);
        victim.write(0, &i.to_le_bytes());
        victim.send(i, WrOp::Send, 0, 8, true).unwrap();
        let rx = poll_n(&rightful.recv_cq, 1, T);
        assert_eq!((rx[0].wr_id, rx[0].status), (i, WcStatus::Success));
        assert_eq!(rightful.read(0, 8), i.to_le_bytes());
        assert_eq!(poll_n(&victim.send_cq, 1, T)[0].status, WcStatus::Success);
    }
    assert!(
        attached == [4, 0] || seen == "eof",
        "the intruder, accepted while the QP was in RESET, is cut off once the QP connects \
         elsewhere (its channel saw: {seen})"
    );
    put(&mut s, b"done");
    assert!(
        child.wait().unwrap().success(),
        "the intruder ran to the end"
    );
}
