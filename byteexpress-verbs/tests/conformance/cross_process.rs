//! Two processes: the conformance binary re-executes itself as the peer (`peer_entry`, selected
//! by an environment variable; the child inherits `BX_PROVIDER`, so both ends use the provider
//! under test: soft0, or rxe0 inside the VM). Endpoints travel over TCP loopback.
//!
//! A killed peer: on rxe the kernel destroys a dead process's QPs, so packets to it are dropped
//! without a NAK and the survivor's ACK timer runs out; the soft provider sees the control
//! channel close and gives up after the same timeout × (retry_cnt + 1). Either way the first
//! outstanding SEND completes with RETRY_EXC_ERR, the rest are flushed in order, the QP is in ERR.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use byteexpress_verbs::{ConnectAttr, QpCap, QpState, WcStatus, WrOp};

use crate::T;
use crate::common::peer::{self, get, handshake, put};
use crate::common::*;

/// Sends that succeed before the peer is killed.
const BEFORE: u64 = 3;

/// ACK timeout 4.096 µs · 2^13 ≈ 33.6 ms and 2 retries: a silent peer is given up after
/// ≈ 101 ms, short enough under TCG, long enough to measure.
fn death_attr() -> ConnectAttr {
    ConnectAttr {
        timeout: 13,
        retry_cnt: 2,
        min_rnr_timer: 1,
        rnr_retry: 7,
        ..ConnectAttr::default()
    }
}

fn give_up_after(attr: &ConnectAttr) -> Duration {
    Duration::from_nanos(4096u64 << attr.timeout) * (u32::from(attr.retry_cnt) + 1)
}

/// The peer process; a no-op when run as an ordinary test.
#[test]
fn peer_entry() {
    let Some((role, mut s)) = peer::peer_role() else {
        return;
    };
    match role.as_str() {
        "victim" => peer_victim(&mut s),
        other => panic!("unknown role {other}"),
    }
}

/// Receives `BEFORE` sends, reports their bytes, then waits to be killed.
fn peer_victim(s: &mut TcpStream) {
    let me = side(QpCap::default(), 4096);
    handshake(s, &me, death_attr(), || {
        for i in 0..BEFORE {
            me.post_recv(i, 64 * i as usize, 64);
        }
    });
    let rx = poll_n(&me.recv_cq, BEFORE as usize, T);
    let got: Vec<(u64, WcStatus, u32)> =
        rx.iter().map(|w| (w.wr_id, w.status, w.byte_len)).collect();
    let want: Vec<(u64, WcStatus, u32)> = (0..BEFORE).map(|i| (i, WcStatus::Success, 16)).collect();
    assert_eq!(got, want);
    let mut bytes = Vec::new();
    for i in 0..BEFORE {
        bytes.extend(me.read(64 * i as usize, 16));
    }
    put(s, &bytes);
    let _ = get(s); // blocks until killed
    unreachable!("the victim is killed before the parent writes again");
}

#[test]
fn a_killed_peer_process_fails_the_next_send_with_retry_exceeded_and_flushes_the_rest() {
    // Generous: the peer's first device open under TCG emulation takes a while.
    let (mut child, mut s) = peer::spawn_peer(
        "cross_process::peer_entry",
        "victim",
        Duration::from_secs(30),
    );
    let attr = death_attr();
    let me = side(QpCap::default(), 4096);
    handshake(&mut s, &me, attr, || {});
    for i in 0..BEFORE {
        me.write(64 * i as usize, &[0x40 + i as u8; 16]);
        me.send(i, WrOp::Send, 64 * i as usize, 16, true).unwrap();
    }
    let ok = poll_n(&me.send_cq, BEFORE as usize, T);
    assert_eq!(
        ok.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (0..BEFORE)
            .map(|i| (i, WcStatus::Success))
            .collect::<Vec<_>>()
    );
    let expect: Vec<u8> = (0..BEFORE).flat_map(|i| [0x40 + i as u8; 16]).collect();
    assert_eq!(get(&mut s), expect, "the peer received the sends intact");
    assert_eq!(me.qp.state(), QpState::Rts);

    let t0 = Instant::now();
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success(), "{status:?}");
    me.post_recv(20, 0, 64);
    me.send(10, WrOp::Send, 0, 16, true).unwrap();
    me.send(11, WrOp::Send, 0, 16, false).unwrap();
    me.send(12, WrOp::SendWithImm(5), 0, 16, true).unwrap();
    let tx = poll_n(&me.send_cq, 3, T);
    let elapsed = t0.elapsed();
    assert_eq!(
        tx.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [
            (10, WcStatus::RetryExcErr),
            (11, WcStatus::WrFlushErr),
            (12, WcStatus::WrFlushErr)
        ],
        "flushed WRs complete even when unsignaled"
    );
    let budget = give_up_after(&attr);
    eprintln!(
        "[{}] RETRY_EXC_ERR {elapsed:?} after SIGKILL; timeout × (retry_cnt + 1) = {budget:?}",
        provider_kind()
    );
    // Lower bound: more than retry_cnt timeouts ran, i.e. all retry_cnt + 1 of them; half a
    // timeout of slack because rxe rounds the ACK timeout down to jiffies (4 ms at HZ=250:
    // 33.6 ms runs as 32 ms; measured 98 ms for the 100.7 ms budget). Upper: generous for TCG.
    let lower =
        budget * (2 * u32::from(attr.retry_cnt) + 1) / (2 * (u32::from(attr.retry_cnt) + 1));
    assert!(
        elapsed >= lower,
        "gave up after {elapsed:?}, before timeout × (retry_cnt + ½) = {lower:?}"
    );
    assert!(
        elapsed < Duration::from_secs(2),
        "gave up after {elapsed:?} (budget {budget:?})"
    );
    assert_eq!(me.qp.state(), QpState::Err);
    let rx = poll_n(&me.recv_cq, 1, T);
    assert_eq!(
        rx.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(20, WcStatus::WrFlushErr)]
    );
    // Later sends are flushed at once.
    me.send(13, WrOp::Send, 0, 16, true).unwrap();
    let later = poll_n(&me.send_cq, 1, T);
    assert_eq!(
        (later[0].wr_id, later[0].status),
        (13, WcStatus::WrFlushErr)
    );
    assert!(poll_for(&me.send_cq, Duration::from_millis(20)).is_empty());
}
