//! Soft provider only, two QPs of one process: what the conformance suite
//! (`tests/conformance/`) leaves open to the provider, pinned down for the soft device.

mod common;

use std::time::Duration;

use byteexpress_verbs::{
    Access, ConnectAttr, Error, QpCap, QpState, SendWr, Sge, Wc, WcStatus, WrOp,
};
use common::*;

const T: Duration = Duration::from_secs(5);

#[test]
fn soft_limits_are_reported_and_caps_granted_exactly() {
    let ctx = soft();
    let attr = ctx.query();
    assert!(attr.remote_access_needs_shared);
    assert_eq!(attr.active_mtu, 4096);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let cap = QpCap {
        max_send_wr: 0,
        max_recv_wr: 3,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 100,
    };
    let qp = pd.create_qp(&cq, &cq, cap).unwrap();
    assert_eq!(
        qp.cap(),
        QpCap {
            max_send_wr: 1,
            ..cap
        }
    );
}

#[test]
fn connect_to_a_missing_qp_fails_at_once_and_leaves_reset() {
    let (_a, b) = soft_pair(QpCap::default(), ConnectAttr::default());
    let c = soft_side(QpCap::default(), 4096);
    let mut bytes = b.qp.endpoint().to_bytes();
    bytes[1..5].copy_from_slice(&0xfff_fffu32.to_le_bytes()); // no such QPN
    let ep = byteexpress_verbs::Endpoint::from_bytes(&bytes).unwrap();
    let err = c.qp.connect(&ep, &ConnectAttr::default());
    assert!(matches!(err, Err(Error::Peer(_))), "{err:?}");
    assert_eq!(c.qp.state(), QpState::Reset);
}

#[test]
fn a_receive_buffer_with_a_bad_key_answers_the_sender_rem_op_err() {
    let (a, b) = soft_pair(QpCap::default(), ConnectAttr::default());
    b.post_recv_with_bad_lkey(4);
    a.send(1, WrOp::Send, 0, 8, true).unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::RemOpErr);
}

#[test]
fn local_errors_carry_their_own_status() {
    let (a, b) = soft_pair(QpCap::default(), ConnectAttr::default());
    b.post_recv(1, 0, 16);
    b.post_recv(2, 16, 16);
    a.send(7, WrOp::Send, 0, 17, false).unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::RemInvReqErr);
    assert_eq!(poll_n(&b.recv_cq, 1, T)[0].status, WcStatus::LocLenErr);

    let (a, b) = soft_pair(QpCap::default(), ConnectAttr::default());
    b.post_recv(1, 0, 64);
    a.send_with_bad_lkey(3);
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::LocProtErr);
}

#[test]
fn qp_access_flags_refuse_a_read_with_rem_access_err() {
    let a = soft_side(QpCap::default(), 4096);
    let b = soft_side(QpCap::default(), 4096);
    a.qp.connect(&b.qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    let no_remote = ConnectAttr {
        access: Access::LOCAL_WRITE,
        ..ConnectAttr::default()
    };
    b.qp.connect(&a.qp.endpoint(), &no_remote).unwrap();
    let read = WrOp::Read {
        remote_addr: b.mr.addr(),
        rkey: b.mr.rkey(),
    };
    a.send(1, read, 0, 8, true).unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn flushed_wrs_report_their_opcode() {
    let attr = ConnectAttr {
        min_rnr_timer: 31,
        ..ConnectAttr::default()
    };
    let (a, _b) = soft_pair(QpCap::default(), attr);
    a.post_recv(10, 0, 64);
    a.qp.to_err().unwrap();
    let rx = poll_n(&a.recv_cq, 1, T);
    assert_eq!(
        (rx[0].wr_id, rx[0].status, rx[0].opcode),
        (10, WcStatus::WrFlushErr, byteexpress_verbs::WcOpcode::Recv)
    );
}

#[test]
fn cq_overrun_is_an_error() {
    let ctx = soft();
    let pd = ctx.alloc_pd().unwrap();
    let small = ctx.create_cq(2).unwrap();
    let big = ctx.create_cq(64).unwrap();
    let qp = pd.create_qp(&small, &big, QpCap::default()).unwrap();
    let peer = soft_side(QpCap::default(), 4096);
    qp.connect(
        &peer.qp.endpoint(),
        &ConnectAttr {
            min_rnr_timer: 1,
            ..ConnectAttr::default()
        },
    )
    .unwrap();
    peer.qp
        .connect(&qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    let mem = pd.alloc_shared(4096).unwrap();
    let mr = pd.reg_shared(&mem, 0, 4096, Access::ALL).unwrap();
    let sge = [byteexpress_verbs::Sge {
        addr: mr.addr(),
        len: 4,
        lkey: mr.lkey(),
    }];
    for i in 0..3 {
        qp.post_send(&SendWr {
            wr_id: i,
            op: WrOp::Send,
            sg_list: &sge,
            signaled: true,
            inline: false,
        })
        .unwrap();
    }
    qp.to_err().unwrap(); // three flush completions into a CQ of two
    let mut wc = [Wc::default(); 8];
    assert!(small.poll(&mut wc).is_err());
}

/// post_send caches the local MRs it used (no lock per send): the cache must not outlive a
/// registration, so an MR deregistered right after sends went through it is refused, inline
/// (at post time) and not inline (LOC_PROT_ERR).
#[test]
fn a_deregistered_mr_is_refused_even_right_after_sends_used_it() {
    let (a, b) = soft_pair(QpCap::default(), ConnectAttr::default());
    let mem = a.pd.alloc_shared(4096).unwrap();
    let mr = a.pd.reg_shared(&mem, 0, 4096, Access::LOCAL_WRITE).unwrap();
    let sge = [Sge {
        addr: mr.addr(),
        len: 8,
        lkey: mr.lkey(),
    }];
    let send = |inline| {
        a.qp.post_send(&SendWr {
            wr_id: u64::from(inline),
            op: WrOp::Send,
            sg_list: &sge,
            signaled: true,
            inline,
        })
    };
    for wr_id in 0..3 {
        b.post_recv(wr_id, 0, 64);
    }
    send(false).unwrap();
    send(true).unwrap();
    for wc in poll_n(&a.send_cq, 2, T) {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
    drop(mr);
    assert!(matches!(send(true), Err(Error::InvalidArgument(_))));
    send(false).unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::LocProtErr);
    drop(mem);
}

/// Inline data that no lkey vouches for is looked for in every MR of the device; that scan
/// must not drop the last handle of an MR while it holds the device's MR table lock (the MR's
/// drop takes that lock for writing: a self-deadlock). One thread posts such sends while
/// another deregisters MRs; both must finish within a bounded time.
#[test]
fn the_inline_scan_survives_mrs_deregistered_during_it() {
    use std::sync::mpsc;
    use std::time::Instant;

    const RUN: Duration = Duration::from_millis(1500);
    let (a, b) = soft_pair(QpCap::default(), ConnectAttr::default());
    let (done_tx, done_rx) = mpsc::channel();
    let poster = {
        let done = done_tx.clone();
        std::thread::spawn(move || {
            let a = a; // all of it: after a deadlock, nothing of it is dropped by the test
            // Not registered anywhere: every post scans the whole MR table, then refuses.
            let bytes = [7u8; 8];
            let sge = [Sge {
                addr: bytes.as_ptr() as u64,
                len: 8,
                lkey: 0,
            }];
            let start = Instant::now();
            let mut posts = 0u64;
            while start.elapsed() < RUN && posts < 50_000_000 {
                let r = a.qp.post_send(&SendWr {
                    wr_id: posts,
                    op: WrOp::Send,
                    sg_list: &sge,
                    signaled: true,
                    inline: true,
                });
                assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
                posts += 1;
            }
            let _ = done.send(("poster", posts));
        })
    };
    let dereg = std::thread::spawn(move || {
        let b = b;
        let start = Instant::now();
        let mut rounds = 0u64;
        while start.elapsed() < RUN && rounds < 1_000_000 {
            let mrs: Vec<_> = (0..64)
                .map(|i| {
                    b.pd.reg_shared(&b.mem, i * 64, 64, Access::LOCAL_WRITE)
                        .unwrap()
                })
                .collect();
            drop(mrs); // one by one, each racing the poster's scan
            rounds += 1;
        }
        let _ = done_tx.send(("deregistering", rounds));
    });
    for _ in 0..2 {
        match done_rx.recv_timeout(RUN + Duration::from_secs(5)) {
            Ok((who, n)) => eprintln!("{who}: {n} iterations"),
            Err(_) => panic!("deadlock: a thread did not finish (inline scan vs. deregistration)"),
        }
    }
    poster.join().unwrap();
    dereg.join().unwrap();
}

/// One scenario of `a_short_send_completes_and_fails_as_a_general_one`: what the posts
/// returned, every completion on both sides, both QPs' states and the bytes received.
fn send_trace(split: bool, case: &str) -> Vec<String> {
    let cap = QpCap {
        max_send_sge: 2,
        ..QpCap::default()
    };
    // Short RNR timer; the default transport timeout (≈ 0.5 s in all): the peer attaches
    // asynchronously, and on a loaded machine that may take longer than fast_attr's ≈ 8 ms.
    let attr = ConnectAttr {
        min_rnr_timer: 1,
        rnr_retry: if case == "rnr_exceeded" { 0 } else { 7 },
        ..ConnectAttr::default()
    };
    let (a, b) = soft_pair(cap, attr);
    a.write(0, &(0u8..100).collect::<Vec<_>>());
    // One SGE takes the short path; the same bytes in two SGEs take the general one.
    let sges = |len: u32, lkey: u32| -> Vec<Sge> {
        let whole = Sge {
            lkey,
            ..a.sge(0, len)
        };
        if !split {
            return vec![whole];
        }
        vec![
            Sge { len: 4, ..whole },
            Sge {
                addr: whole.addr + 4,
                len: len - 4,
                ..whole
            },
        ]
    };
    let key = a.mr.lkey();
    // A WRITE through the MR first: the short path needs the MR in the QP's cache.
    let warm = [a.sge(0, 8)];
    a.qp.post_send(&SendWr {
        wr_id: 99,
        op: WrOp::Write {
            remote_addr: b.mr.addr() + 4096,
            rkey: b.mr.rkey(),
        },
        sg_list: &warm,
        signaled: true,
        inline: false,
    })
    .unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::Success);
    let mut log = Vec::new();
    let mut post = |wr_id: u64, op: WrOp, len: u32, lkey: u32, inline: bool| {
        let sg = sges(len, lkey);
        let r = a.qp.post_send(&SendWr {
            wr_id,
            op,
            sg_list: &sg,
            signaled: true,
            inline,
        });
        log.push(format!("post {wr_id}: {r:?}"));
    };
    match case {
        "ok" => {
            for id in 0..4 {
                b.post_recv(id, id as usize * 64, 64);
            }
            post(1, WrOp::Send, 8, key, false);
            post(2, WrOp::SendWithImm(7), 16, key, false);
            post(3, WrOp::Send, 8, key, true);
            post(4, WrOp::SendWithImm(9), 64, key, true);
        }
        "rnr_then_recv" => {
            post(1, WrOp::Send, 8, key, false);
            post(2, WrOp::Send, 8, key, true);
            std::thread::sleep(Duration::from_millis(20));
            b.post_recv(0, 0, 64);
            b.post_recv(1, 64, 64);
        }
        "rnr_exceeded" => {
            post(1, WrOp::Send, 8, key, false);
            std::thread::sleep(Duration::from_millis(50));
            post(2, WrOp::Send, 8, key, false);
        }
        "over_max_inline" => {
            b.post_recv(0, 0, 128);
            post(1, WrOp::Send, 65, key, true);
            post(2, WrOp::Send, 64, key, true);
        }
        "bad_lkey" => {
            b.post_recv(0, 0, 64);
            // Inline data needs registered memory under any key; a SEND needs its lkey.
            post(1, WrOp::Send, 8, key ^ 0x5555, true);
            post(2, WrOp::Send, 8, key ^ 0x5555, false);
            post(3, WrOp::Send, 8, key, false);
        }
        "recv_too_small" => {
            b.post_recv(0, 0, 4);
            post(1, WrOp::Send, 8, key, false);
        }
        _ => unreachable!(),
    }
    std::thread::sleep(Duration::from_millis(60));
    for (side, cq) in [("a.send", &a.send_cq), ("b.recv", &b.recv_cq)] {
        for wc in poll_for(cq, Duration::from_millis(100)) {
            log.push(format!(
                "{side}: {} {:?} {:?} {} {:?}",
                wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm
            ));
        }
    }
    log.push(format!("states {:?} {:?}", a.qp.state(), b.qp.state()));
    log.push(format!("bytes {:?}", b.read(0, 256)));
    log
}

/// post_send has a short path for a SEND of one SGE; a WR with two SGEs takes the general
/// path. Both must give the same post results, completions, QP states and received bytes,
/// also where things go wrong (RNR, RNR retries exceeded, inline data over max_inline_data,
/// a bad lkey, a receive buffer too small).
#[test]
fn a_short_send_completes_and_fails_as_a_general_one() {
    for case in [
        "ok",
        "rnr_then_recv",
        "rnr_exceeded",
        "over_max_inline",
        "bad_lkey",
        "recv_too_small",
    ] {
        let short = send_trace(false, case);
        let general = send_trace(true, case);
        assert_eq!(short, general, "{case}");
        eprintln!("{case}: {short:#?}");
    }
}

/// Issue 22, item 2: a send completes on the receiver's ACK, and a receiver whose application
/// never polls still ACKs: the sender nudges, the receiver's progress thread delivers into the
/// CQ's queue. Without that, the send would wait for a poll that never comes and fail
/// RETRY_EXC_ERR at the retry timeout.
#[test]
fn a_send_to_a_receiver_that_never_polls_is_delivered_by_its_progress_thread() {
    let (a, b) = soft_pair(QpCap::default(), fast_attr());
    b.post_recv(1, 0, 64);
    a.write(0, b"nobody polls here");
    a.send(9, WrOp::Send, 0, 17, true).unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(
        (tx[0].wr_id, tx[0].status, tx[0].byte_len),
        (9, WcStatus::Success, 17)
    );
    // Delivered before the application's first poll: the bytes are there already.
    assert_eq!(b.read(0, 17), b"nobody polls here");
    let rx = poll_n(&b.recv_cq, 1, T);
    assert_eq!((rx[0].wr_id, rx[0].byte_len), (1, 17));
}
