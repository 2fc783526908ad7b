//! Failed operations: RNR, access and key errors, length errors, a vanished peer, and the
//! flush of every outstanding WR when a QP enters ERR. On RC, the first failed WR moves the QP
//! to ERR (`ibv_poll_cq(3)`), so each test checks the state afterwards.

use std::time::{Duration, Instant};

use byteexpress_verbs::{Access, ConnectAttr, QpCap, QpState, RecvWr, SendWr, WcStatus, WrOp};

use crate::T;
use crate::common::*;

/// Local errors as the man pages name them, or `LOC_QP_OP_ERR`, which rxe (Linux 6.1) reports
/// for every local failure: lkey, length and receive-buffer key alike. `soft_same_process.rs`
/// pins the exact status on the soft provider.
fn local_error(s: WcStatus, expected: WcStatus) -> bool {
    s == expected || s == WcStatus::LocQpOpErr
}

#[test]
fn rnr_with_rnr_retry_zero_fails_the_wr_and_flushes_the_rest() {
    let attr = ConnectAttr {
        rnr_retry: 0,
        ..fast_attr()
    };
    let (a, b) = pair(QpCap::default(), attr);
    b.post_recv(1, 0, 64);
    a.send(1, WrOp::Send, 0, 8, true).unwrap();
    a.send(2, WrOp::Send, 0, 8, true).unwrap();
    a.send(3, WrOp::Send, 0, 8, true).unwrap();
    let tx = poll_n(&a.send_cq, 3, T);
    let got: Vec<(u64, WcStatus)> = tx.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success),
            (2, WcStatus::RnrRetryExcErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(a.qp.state(), QpState::Err);
}

/// What selective signaling relies on (`ibv_post_send(3)`: an unsignaled WR that fails still
/// completes): when a QP fails, the failing WR and every later one complete, unsignaled ones
/// included, in post order, while an earlier unsignaled WR that succeeded stays silent. So a
/// completion of WR n, success or not, means every WR posted before n is done.
#[test]
fn a_failing_unsignaled_send_completes_with_its_error_and_flushes_the_unsignaled_rest() {
    let attr = ConnectAttr {
        rnr_retry: 0,
        ..fast_attr()
    };
    let (a, b) = pair(QpCap::default(), attr);
    b.post_recv(1, 0, 64);
    for i in 1..=4 {
        a.send(i, WrOp::Send, 0, 8, false).unwrap();
    }
    let tx = poll_n(&a.send_cq, 3, T);
    let got: Vec<(u64, WcStatus)> = tx.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        [
            (2, WcStatus::RnrRetryExcErr),
            (3, WcStatus::WrFlushErr),
            (4, WcStatus::WrFlushErr)
        ]
    );
    assert!(
        poll_for(&a.send_cq, Duration::from_millis(20)).is_empty(),
        "the unsignaled send that succeeded produced no completion"
    );
    assert_eq!(poll_n(&b.recv_cq, 1, T)[0].status, WcStatus::Success);
    assert_eq!(a.qp.state(), QpState::Err);
}

/// How a caller gets back unsignaled SENDs that already completed silently when its QP
/// fails (the kernel's `ib_drain_sq` does the same): after `to_err` it posts a signaled WR, a
/// SEND with no SGE; that WR completes WR_FLUSH_ERR after every earlier WR of the queue, so
/// its completion covers them. On rdma-core the provider's ledger held a WR posted in ERR
/// behind the device's silently completed WRs, which never complete again, so it never came
/// (seen on rxe0: a link's failed QP kept its last unsignaled SENDs for good).
#[test]
fn a_wr_posted_after_to_err_completes_behind_unsignaled_sends_that_completed_silently() {
    let (a, b) = pair(QpCap::default(), fast_attr());
    for i in 0..4u64 {
        b.post_recv(10 + i, i as usize * 64, 64);
    }
    for i in 1..=4 {
        a.send(i, WrOp::Send, 0, 8, false).unwrap();
    }
    let rx = poll_n(&b.recv_cq, 4, T);
    assert!(rx.iter().all(|w| w.status == WcStatus::Success), "{rx:?}");
    assert!(
        poll_for(&a.send_cq, Duration::from_millis(20)).is_empty(),
        "unsignaled sends that succeeded complete silently"
    );
    a.qp.to_err().unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 5,
        op: WrOp::Send,
        sg_list: &[],
        signaled: true,
        inline: false,
    })
    .unwrap();
    // A WR whose ACK the sender had not processed yet is flushed with its own completion
    // first (in order); WR 5's flush comes last, and nothing after it.
    let t0 = Instant::now();
    let mut tx = Vec::new();
    while tx.last().is_none_or(|&(id, _)| id != 5) && t0.elapsed() < T {
        tx.extend(poll_n(&a.send_cq, 1, T).iter().map(|w| (w.wr_id, w.status)));
    }
    assert_eq!(tx.last(), Some(&(5, WcStatus::WrFlushErr)), "{tx:?}");
    assert!(
        tx.iter().all(|&(_, st)| st == WcStatus::WrFlushErr),
        "{tx:?}"
    );
    let ids: Vec<u64> = tx.iter().map(|&(id, _)| id).collect();
    assert!(ids.is_sorted() && ids[0] >= 1, "in post order: {ids:?}");
    assert!(
        poll_for(&a.send_cq, Duration::from_millis(20)).is_empty(),
        "one completion each"
    );
}

#[test]
fn rnr_retry_succeeds_when_a_receive_is_posted_later() {
    let attr = ConnectAttr {
        rnr_retry: 7,
        min_rnr_timer: 1,
        ..ConnectAttr::default()
    };
    let (a, b) = pair(QpCap::default(), attr);
    a.write(0, b"late");
    a.send(1, WrOp::Send, 0, 4, true).unwrap();
    a.send(2, WrOp::SendWithImm(7), 0, 4, true).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert!(
        poll_for(&a.send_cq, Duration::ZERO).is_empty(),
        "nothing completes without a receive"
    );
    b.post_recv(10, 0, 64);
    b.post_recv(11, 64, 64);
    let tx = poll_n(&a.send_cq, 2, T);
    assert_eq!(
        tx.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let rx = poll_n(&b.recv_cq, 2, T);
    assert_eq!(
        rx.iter().map(|w| (w.wr_id, w.imm)).collect::<Vec<_>>(),
        [(10, None), (11, Some(7))]
    );
    assert_eq!(b.read(0, 4), b"late");
    assert_eq!(a.qp.state(), QpState::Rts);
}

/// RNR timer code 25: 61.44 ms between RNR retries. With rnr_retry 3 a SEND that finds no
/// receive is retried for ≈ 3 × 61.44 ms ≈ 184 ms before RNR_RETRY_EXC_ERR.
fn rnr_budget_attr() -> ConnectAttr {
    ConnectAttr {
        rnr_retry: 3,
        min_rnr_timer: 25,
        ..ConnectAttr::default()
    }
}

const RNR_DELAY: Duration = Duration::from_micros(61_440);

#[test]
fn rnr_retry_3_succeeds_when_the_receive_comes_within_the_rnr_budget() {
    let (a, b) = pair(QpCap::default(), rnr_budget_attr());
    a.write(0, b"in time");
    let t0 = Instant::now();
    a.send(1, WrOp::Send, 0, 7, true).unwrap();
    std::thread::sleep(Duration::from_millis(20)); // < 3 × 61.44 ms
    assert!(
        poll_for(&a.send_cq, Duration::ZERO).is_empty(),
        "nothing completes without a receive"
    );
    b.post_recv(10, 0, 64);
    let tx = poll_n(&a.send_cq, 1, T);
    let elapsed = t0.elapsed();
    assert_eq!(
        tx.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success)],
        "after {elapsed:?}"
    );
    let rx = poll_n(&b.recv_cq, 1, T);
    assert_eq!(
        rx.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        [(10, WcStatus::Success, 7)]
    );
    assert_eq!(b.read(0, 7), b"in time");
    assert_eq!(a.qp.state(), QpState::Rts);
    // The RNR NAK made the requester wait one RNR timer before it tried again.
    assert!(elapsed >= RNR_DELAY * 9 / 10, "{elapsed:?}");
}

#[test]
fn rnr_retry_3_without_a_receive_fails_after_the_rnr_budget() {
    let (a, _b) = pair(QpCap::default(), rnr_budget_attr());
    let t0 = Instant::now();
    a.send(1, WrOp::Send, 0, 8, true).unwrap();
    a.send(2, WrOp::Send, 0, 8, true).unwrap();
    let tx = poll_n(&a.send_cq, 2, T);
    let elapsed = t0.elapsed();
    assert_eq!(
        tx.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    eprintln!(
        "[{}] RNR_RETRY_EXC_ERR after {elapsed:?}; 3 × RNR timer = {:?}",
        provider_kind(),
        RNR_DELAY * 3
    );
    // Three retries, each after one RNR timer (9/10: rxe's timers tick in jiffies).
    assert!(elapsed >= RNR_DELAY * 3 * 9 / 10, "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    assert_eq!(a.qp.state(), QpState::Err);
}

/// `ibv_poll_cq(3)`: the opcode of a flushed WR is undefined, so only wr_id and status count.
#[test]
fn to_err_flushes_every_outstanding_wr_in_order() {
    let attr = ConnectAttr {
        min_rnr_timer: 31, // 491 ms between RNR retries: the sends stay outstanding
        ..ConnectAttr::default()
    };
    let (a, _b) = pair(QpCap::default(), attr);
    for i in 0..3 {
        a.send(i, WrOp::Send, 0, 8, i != 1).unwrap(); // waits: b posted nothing
        a.post_recv(10 + i, 0, 64);
    }
    a.qp.to_err().unwrap();
    assert_eq!(a.qp.state(), QpState::Err);
    let tx = poll_n(&a.send_cq, 3, T);
    assert_eq!(
        tx.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [
            (0, WcStatus::WrFlushErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ],
        "flushed WRs complete even when unsignaled"
    );
    let rx = poll_n(&a.recv_cq, 3, T);
    assert_eq!(
        rx.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [
            (10, WcStatus::WrFlushErr),
            (11, WcStatus::WrFlushErr),
            (12, WcStatus::WrFlushErr),
        ]
    );
    assert!(poll_for(&a.send_cq, Duration::from_millis(20)).is_empty());
}

#[test]
fn a_message_longer_than_the_receive_buffer_fails_both_sides() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    b.post_recv(1, 0, 3000);
    b.post_recv(2, 4096, 3000);
    a.send(7, WrOp::Send, 0, 3001, false).unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(tx[0].wr_id, 7);
    // The responder's NAK: "invalid request" per the IB spec; rxe answers "remote operation".
    assert!(
        matches!(tx[0].status, WcStatus::RemInvReqErr | WcStatus::RemOpErr),
        "{tx:?}"
    );
    let rx = poll_n(&b.recv_cq, 2, T);
    assert_eq!(rx.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2]);
    assert!(local_error(rx[0].status, WcStatus::LocLenErr), "{rx:?}");
    assert_eq!(rx[1].status, WcStatus::WrFlushErr);
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(b.qp.state(), QpState::Err);
}

#[test]
fn a_bad_local_key_fails_with_loc_prot_err() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    b.post_recv(1, 0, 64);
    a.send_with_bad_lkey(3);
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(tx[0].wr_id, 3);
    assert!(local_error(tx[0].status, WcStatus::LocProtErr), "{tx:?}");
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn a_write_to_a_read_only_mr_is_a_remote_access_error() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let ro_mem = b.pd.alloc_shared(4096).unwrap();
    let ro =
        b.pd.reg_shared(&ro_mem, 0, 4096, Access::REMOTE_READ)
            .unwrap();
    let write = WrOp::Write {
        remote_addr: ro.addr(),
        rkey: ro.rkey(),
    };
    a.send(4, write, 0, 8, false).unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!((tx[0].wr_id, tx[0].status), (4, WcStatus::RemAccessErr));
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn a_write_past_the_end_of_the_mr_is_a_remote_access_error() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let end = b.mr.addr() + b.mr.len() as u64;
    a.write(0, &[0x11; 8]);
    let write = WrOp::Write {
        remote_addr: end - 4,
        rkey: b.mr.rkey(),
    };
    a.send(1, write, 0, 8, true).unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::RemAccessErr);
    assert_eq!(b.read(b.mr.len() - 4, 4), [0; 4], "nothing was written");
}

#[test]
fn a_read_with_an_unknown_rkey_is_a_remote_access_error() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let read = WrOp::Read {
        remote_addr: b.mr.addr(),
        rkey: b.mr.rkey() ^ 0x00ff_ff00,
    };
    a.send(1, read, 0, 8, true).unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn a_deregistered_mr_is_refused_to_the_peer() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let mem = b.pd.alloc_shared(4096).unwrap();
    let mr = b.pd.reg_shared(&mem, 0, 4096, Access::ALL).unwrap();
    let write = WrOp::Write {
        remote_addr: mr.addr(),
        rkey: mr.rkey(),
    };
    a.send(1, write, 0, 8, true).unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::Success);
    drop(mr);
    a.send(2, write, 0, 8, true).unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn an_mr_registered_after_connect_serves_receives() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let mem = b.pd.alloc_shared(4096).unwrap();
    let mr = b.pd.reg_shared(&mem, 0, 4096, Access::LOCAL_WRITE).unwrap();
    let sge = [byteexpress_verbs::Sge {
        addr: mr.addr() + 100,
        len: 64,
        lkey: mr.lkey(),
    }];
    b.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &sge,
    })
    .unwrap();
    a.write(0, b"fresh memory");
    a.send(1, WrOp::Send, 0, 12, true).unwrap();
    assert_eq!(poll_n(&b.recv_cq, 1, T)[0].status, WcStatus::Success);
    let mut got = [0u8; 12];
    // SAFETY: 100..112 lies inside the 4096-byte mapping, which `mem` keeps alive.
    unsafe { std::ptr::copy_nonoverlapping(mem.as_ptr().add(100), got.as_mut_ptr(), 12) };
    assert_eq!(&got, b"fresh memory");
}

#[test]
fn a_receive_buffer_with_a_bad_key_fails_the_receiver() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    b.post_recv_with_bad_lkey(4);
    a.send(1, WrOp::Send, 0, 8, true).unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_ne!(tx[0].status, WcStatus::Success, "{tx:?}");
    let rx = poll_n(&b.recv_cq, 1, T);
    assert_eq!(rx[0].wr_id, 4);
    assert!(local_error(rx[0].status, WcStatus::LocProtErr), "{rx:?}");
    assert_eq!(b.qp.state(), QpState::Err);
}

#[test]
fn qp_access_flags_limit_what_the_peer_may_do() {
    let a = side(QpCap::default(), 4096);
    let b = side(QpCap::default(), 4096);
    a.qp.connect(&b.qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    let no_remote = ConnectAttr {
        access: Access::LOCAL_WRITE,
        ..ConnectAttr::default()
    };
    b.qp.connect(&a.qp.endpoint(), &no_remote).unwrap();
    b.write(0, b"secret!!");
    let read = WrOp::Read {
        remote_addr: b.mr.addr(),
        rkey: b.mr.rkey(),
    };
    a.send(1, read, 64, 8, true).unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_ne!(tx[0].status, WcStatus::Success, "{tx:?}");
    assert_eq!(a.read(64, 8), [0; 8], "nothing was read");
}

#[test]
fn a_destroyed_peer_qp_makes_sends_fail_with_retry_exceeded() {
    let (a, b) = pair(QpCap::default(), fast_attr());
    b.post_recv(1, 0, 64);
    drop(b);
    let t0 = Instant::now();
    a.send(1, WrOp::Send, 0, 8, true).unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(tx[0].status, WcStatus::RetryExcErr);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(a.qp.state(), QpState::Err);
}
