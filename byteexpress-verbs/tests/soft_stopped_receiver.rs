//! A receiver that makes no progress (a raw peer process that posts a receive and then never
//! polls, delivers or acknowledges anything) holds the sender's SEND: the send does not
//! complete, its descriptor keeps naming the sender's buffer, and at the QP's retry timeout
//! (timeout × (retry_cnt + 1)) it completes RETRY_EXC_ERR (issue 22, item 2: a SEND completes
//! on the receiver's ACK, as on a NIC).
//!
//! The peer is this test binary started again (`child_entry`, role `stopped`).

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use byteexpress_verbs::{ConnectAttr, QpCap, WcStatus, WrOp};
use common::peer::{self, get, put};
use common::raw::{self, OFF_COMP_CONS, OFF_COMP_PROD, OFF_RECV_PROD};
use common::*;

const T: Duration = Duration::from_secs(10);

#[test]
fn child_entry() {
    let Some((role, mut s)) = peer::peer_role() else {
        return;
    };
    assert_eq!(role, "stopped");
    child_stopped(&mut s);
}

/// Posts one receive WQE in its own ring, then only reports what the sender left there.
fn child_stopped(s: &mut TcpStream) {
    let at = raw::attach(s);
    // SAFETY: WQE 0 and the header lie inside our own ring, mapped read-write.
    unsafe {
        raw::put32(at.my_ring, 512, 1);
        raw::put64(at.my_ring, 512 + 16, 0x1000);
        raw::put32(at.my_ring, 512 + 24, 4096);
        raw::put32(at.my_ring, 512 + 28, 1);
        raw::put64(at.my_ring, OFF_RECV_PROD, 1);
    }
    put(s, b"posted");
    assert_eq!(get(s), b"look");
    let slot = raw::comp_off(raw::CAP, raw::SGE, 0);
    // SAFETY: as above.
    let seen = unsafe {
        format!(
            "prod {} cons {} src {} len {} key {:#x} addr {:#x}",
            raw::get64(at.my_ring, OFF_COMP_PROD),
            raw::get64(at.my_ring, OFF_COMP_CONS),
            raw::get32(at.my_ring, slot + 20),
            raw::get32(at.my_ring, slot + 8),
            raw::get32(at.my_ring, slot + 32),
            raw::get64(at.my_ring, slot + 40),
        )
    };
    put(s, seen.as_bytes());
    assert_eq!(get(s), b"done");
    s.flush().unwrap();
    drop(at);
}

#[test]
fn a_send_to_a_receiver_that_never_acknowledges_is_held_then_fails_retry_exc_err() {
    if peer::peer_role().is_some() {
        return;
    }
    let ctx = soft();
    let sender = soft_side(QpCap::default(), 4096);
    // 4.096 µs · 2^17 ≈ 0.54 s per try, two tries: the send is given up after ≈ 1.07 s.
    let attr = ConnectAttr {
        timeout: 17,
        retry_cnt: 1,
        ..ConnectAttr::default()
    };
    let give_up = Duration::from_nanos(4096 << 17) * 2;
    let nonce = 0x570_u64 ^ u64::from(std::process::id());
    let (mut child, mut s) =
        raw::raw_peer_connected(&ctx, &sender, "child_entry", "stopped", nonce, &attr);
    assert_eq!(get(&mut s), b"posted");
    sender.write(0, b"held until acknowledged");
    let t0 = Instant::now();
    sender.send(7, WrOp::Send, 0, 23, true).unwrap();
    // Half the retry timeout later: no completion (the buffer is still the WR's), and the
    // receiver's ring names the sender's buffer in place.
    let early = poll_for(&sender.send_cq, give_up / 2);
    assert!(early.is_empty(), "completed before the ACK: {early:?}");
    put(&mut s, b"look");
    let seen = String::from_utf8(get(&mut s)).unwrap();
    let want = format!(
        "prod 1 cons 0 src 1 len 23 key {:#x} addr {:#x}",
        sender.mr.lkey(),
        sender.mr.addr()
    );
    assert_eq!(seen, want, "the descriptor the receiver holds");
    let wc = poll_n(&sender.send_cq, 1, T);
    let waited = t0.elapsed();
    assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::RetryExcErr));
    assert!(
        waited >= give_up,
        "given up after {waited:?}, before the retry timeout {give_up:?}"
    );
    put(&mut s, b"done");
    assert!(
        child.wait().unwrap().success(),
        "the stopped peer ran to the end"
    );
}
