//! Soft provider, two QPs of one process connected to each other.

mod common;

use std::time::{Duration, Instant};

use byteexpress_verbs::{
    Access, ConnectAttr, Error, QpCap, QpState, RecvWr, SendWr, Wc, WcOpcode, WcStatus, WrOp,
};
use common::*;

const T: Duration = Duration::from_secs(5);

#[test]
fn sends_arrive_in_order_with_length_imm_and_wr_id() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    for i in 0..4u64 {
        b.post_recv(100 + i, (i as usize) * 1024, 1024);
    }
    for i in 0..4u64 {
        let len = 10 + i as u32 * 100;
        a.write(i as usize * 1024, &vec![i as u8 + 1; len as usize]);
        let op = if i % 2 == 1 {
            WrOp::SendWithImm(0xabc0 + i as u32)
        } else {
            WrOp::Send
        };
        a.send(i, op, i as usize * 1024, len, true).unwrap();
    }
    let rx = poll_n(&b.recv_cq, 4, T);
    assert_eq!(rx.len(), 4);
    for (i, wc) in rx.iter().enumerate() {
        let len = 10 + i as u32 * 100;
        assert_eq!(wc.wr_id, 100 + i as u64);
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.opcode, WcOpcode::Recv);
        assert_eq!(wc.byte_len, len);
        assert_eq!(wc.qp_num, b.qp.qp_num());
        assert_eq!(wc.imm, (i % 2 == 1).then_some(0xabc0 + i as u32));
        assert_eq!(
            b.read(i * 1024, len as usize),
            vec![i as u8 + 1; len as usize]
        );
    }
    let tx = poll_n(&a.send_cq, 4, T);
    let ids: Vec<u64> = tx.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [0, 1, 2, 3]);
    assert!(
        tx.iter()
            .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Send)
    );
}

#[test]
fn unsignaled_successful_sends_produce_no_completion() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    for i in 0..3 {
        b.post_recv(i, 0, 64);
    }
    a.send(1, WrOp::Send, 0, 8, false).unwrap();
    a.send(2, WrOp::Send, 0, 8, true).unwrap();
    a.send(3, WrOp::Send, 0, 8, false).unwrap();
    assert_eq!(poll_n(&b.recv_cq, 3, T).len(), 3);
    let tx = poll_for(&a.send_cq, Duration::from_millis(50));
    assert_eq!(tx.len(), 1, "{tx:?}");
    assert_eq!(tx[0].wr_id, 2);
}

#[test]
fn inline_send_copies_at_post_time() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    a.write(0, b"inline!!");
    let sge = [a.sge(0, 8)];
    a.qp.post_send(&SendWr {
        wr_id: 5,
        op: WrOp::Send,
        sg_list: &sge,
        signaled: true,
        inline: true,
    })
    .unwrap();
    // The source may change once posted: an RNR-delayed inline send still carries the old bytes.
    a.write(0, b"changed!");
    b.post_recv(9, 0, 64);
    let rx = poll_n(&b.recv_cq, 1, T);
    assert_eq!(rx[0].byte_len, 8);
    assert_eq!(b.read(0, 8), b"inline!!");
    let too_long = [a.sge(0, QpCap::default().max_inline_data + 1)];
    let err = a.qp.post_send(&SendWr {
        wr_id: 6,
        op: WrOp::Send,
        sg_list: &too_long,
        signaled: true,
        inline: true,
    });
    assert!(matches!(err, Err(Error::InvalidArgument(_))), "{err:?}");
}

#[test]
fn rnr_when_no_receive_posted() {
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

#[test]
fn post_before_rts_is_invalid_state() {
    let a = side(QpCap::default(), 4096);
    assert_eq!(a.qp.state(), QpState::Reset);
    let err = a.send(1, WrOp::Send, 0, 8, true);
    assert!(matches!(err, Err(Error::InvalidState(_))), "{err:?}");
    let sge = [a.sge(0, 8)];
    let err = a.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &sge,
    });
    assert!(matches!(err, Err(Error::InvalidState(_))), "{err:?}");
}

#[test]
fn post_beyond_max_send_wr_is_queue_full_without_side_effect() {
    let cap = QpCap {
        max_send_wr: 4,
        ..QpCap::default()
    };
    let (a, b) = pair(
        cap,
        ConnectAttr {
            min_rnr_timer: 1,
            ..ConnectAttr::default()
        },
    );
    assert_eq!(a.qp.cap().max_send_wr, 4);
    for i in 0..4 {
        a.send(i, WrOp::Send, 0, 8, true).unwrap(); // all wait: no receive posted
    }
    let err = a.send(99, WrOp::Send, 0, 8, true);
    assert!(matches!(err, Err(Error::QueueFull(_))), "{err:?}");
    for i in 0..5 {
        b.post_recv(i, 0, 64);
    }
    let tx = poll_n(&a.send_cq, 4, T);
    assert_eq!(tx.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert!(
        poll_for(&b.recv_cq, Duration::from_millis(20)).len() == 4,
        "the refused WR was not sent"
    );
}

#[test]
fn post_beyond_max_recv_wr_is_queue_full() {
    let cap = QpCap {
        max_recv_wr: 2,
        ..QpCap::default()
    };
    let (_a, b) = pair(cap, ConnectAttr::default());
    b.post_recv(1, 0, 8);
    b.post_recv(2, 0, 8);
    let sge = [b.sge(0, 8)];
    let err = b.qp.post_recv(&RecvWr {
        wr_id: 3,
        sg_list: &sge,
    });
    assert!(matches!(err, Err(Error::QueueFull(_))), "{err:?}");
}

#[test]
fn caps_beyond_device_limits_are_refused_and_granted_caps_reported() {
    let ctx = soft();
    let attr = ctx.query();
    assert!(attr.remote_access_needs_shared);
    assert_eq!(attr.active_mtu, 4096);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let too_many = QpCap {
        max_send_sge: attr.max_sge + 1,
        ..QpCap::default()
    };
    assert!(matches!(
        pd.create_qp(&cq, &cq, too_many),
        Err(Error::InvalidArgument(_))
    ));
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
fn too_many_sges_are_invalid_argument() {
    let (a, _b) = pair(QpCap::default(), ConnectAttr::default());
    let sges = [a.sge(0, 4), a.sge(4, 4)];
    let err = a.qp.post_send(&SendWr {
        wr_id: 1,
        op: WrOp::Send,
        sg_list: &sges,
        signaled: true,
        inline: false,
    });
    assert!(matches!(err, Err(Error::InvalidArgument(_))), "{err:?}");
}

#[test]
fn to_err_flushes_every_outstanding_wr_in_order() {
    let (a, b) = pair(
        QpCap::default(),
        ConnectAttr {
            min_rnr_timer: 1,
            ..ConnectAttr::default()
        },
    );
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
        ]
    );
    let rx = poll_n(&a.recv_cq, 3, T);
    assert_eq!(
        rx.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        [
            (10, WcStatus::WrFlushErr, WcOpcode::Recv),
            (11, WcStatus::WrFlushErr, WcOpcode::Recv),
            (12, WcStatus::WrFlushErr, WcOpcode::Recv),
        ]
    );
    // Posting in ERR completes at once as flushed.
    a.post_recv(20, 0, 64);
    a.send(21, WrOp::Send, 0, 8, false).unwrap();
    assert_eq!(poll_n(&a.recv_cq, 1, T)[0].wr_id, 20);
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::WrFlushErr);
    // The peer can no longer deliver into a's (flushed) buffers: its send times out.
    drop(b);
}

#[test]
fn message_longer_than_the_receive_buffer_fails_both_sides() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    b.post_recv(1, 0, 16);
    b.post_recv(2, 16, 16);
    a.send(7, WrOp::Send, 0, 17, false).unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!((tx[0].wr_id, tx[0].status), (7, WcStatus::RemInvReqErr));
    let rx = poll_n(&b.recv_cq, 2, T);
    assert_eq!(
        rx.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(b.qp.state(), QpState::Err);
}

#[test]
fn bad_local_key_fails_with_loc_prot_err() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    b.post_recv(1, 0, 64);
    let sge = [byteexpress_verbs::Sge {
        addr: a.mr.addr(),
        len: 8,
        lkey: a.mr.lkey() ^ 0x5555,
    }];
    a.qp.post_send(&SendWr {
        wr_id: 3,
        op: WrOp::Send,
        sg_list: &sge,
        signaled: false,
        inline: false,
    })
    .unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(tx[0].status, WcStatus::LocProtErr);
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn receive_buffer_registered_after_connect_is_announced() {
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
fn rdma_write_and_read_respect_rkeys_and_access() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    a.write(0, b"written by a");
    let remote_addr = b.mr.addr() + 500;
    a.send(
        1,
        WrOp::Write {
            remote_addr,
            rkey: b.mr.rkey(),
        },
        0,
        12,
        true,
    )
    .unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(
        (tx[0].status, tx[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(b.read(500, 12), b"written by a");

    b.write(1000, b"read me");
    a.send(
        2,
        WrOp::Read {
            remote_addr: b.mr.addr() + 1000,
            rkey: b.mr.rkey(),
        },
        2000,
        7,
        true,
    )
    .unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(
        (tx[0].status, tx[0].opcode, tx[0].byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 7)
    );
    assert_eq!(a.read(2000, 7), b"read me");

    b.post_recv(50, 0, 16);
    a.send(
        3,
        WrOp::WriteWithImm {
            remote_addr: b.mr.addr() + 3000,
            rkey: b.mr.rkey(),
            imm: 42,
        },
        0,
        12,
        true,
    )
    .unwrap();
    let rx = poll_n(&b.recv_cq, 1, T);
    assert_eq!(
        (rx[0].wr_id, rx[0].opcode, rx[0].imm, rx[0].byte_len),
        (50, WcOpcode::RecvRdmaWithImm, Some(42), 12)
    );
    assert_eq!(b.read(3000, 12), b"written by a");
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::Success);

    // A read-only MR refuses WRITE: REM_ACCESS_ERR and the QP goes to ERR.
    let ro_mem = b.pd.alloc_shared(4096).unwrap();
    let ro =
        b.pd.reg_shared(&ro_mem, 0, 4096, Access::REMOTE_READ)
            .unwrap();
    a.send(
        4,
        WrOp::Write {
            remote_addr: ro.addr(),
            rkey: ro.rkey(),
        },
        0,
        8,
        false,
    )
    .unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(tx[0].status, WcStatus::RemAccessErr);
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn write_out_of_bounds_is_remote_access_error() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let end = b.mr.addr() + b.mr.len() as u64;
    a.send(
        1,
        WrOp::Write {
            remote_addr: end - 4,
            rkey: b.mr.rkey(),
        },
        0,
        8,
        true,
    )
    .unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::RemAccessErr);
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
    a.send(
        1,
        WrOp::Read {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        0,
        8,
        true,
    )
    .unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn connect_twice_or_to_a_missing_qp_fails() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let err = a.qp.connect(&b.qp.endpoint(), &ConnectAttr::default());
    assert!(matches!(err, Err(Error::InvalidState(_))), "{err:?}");
    let c = side(QpCap::default(), 4096);
    let mut ep = b.qp.endpoint();
    let bytes = {
        let mut v = ep.to_bytes();
        v[1..5].copy_from_slice(&0xfff_fffu32.to_le_bytes()); // no such QPN
        v
    };
    ep = byteexpress_verbs::Endpoint::from_bytes(&bytes).unwrap();
    let err = c.qp.connect(&ep, &ConnectAttr::default());
    assert!(matches!(err, Err(Error::Peer(_))), "{err:?}");
    assert_eq!(c.qp.state(), QpState::Reset);
}

#[test]
fn a_sleeping_cq_wakes_for_a_completion_from_the_peer() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    b.post_recv(1, 0, 64);
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        a.write(0, b"wake up");
        a.send(1, WrOp::Send, 0, 7, true).unwrap();
        a
    });
    let t0 = Instant::now();
    rt.block_on(async {
        let mut wc = [Wc::default(); 4];
        loop {
            tokio::time::timeout(T, b.recv_cq.ready(Duration::ZERO))
                .await
                .expect("woken")
                .unwrap();
            if b.recv_cq.poll(&mut wc).unwrap() > 0 {
                break;
            }
        }
        assert_eq!((wc[0].wr_id, wc[0].byte_len), (1, 7));
    });
    assert!(
        t0.elapsed() >= Duration::from_millis(90),
        "it slept until the send"
    );
    sender.join().unwrap();
}

#[test]
fn cq_overrun_is_an_error() {
    let ctx = soft();
    let pd = ctx.alloc_pd().unwrap();
    let small = ctx.create_cq(2).unwrap();
    let big = ctx.create_cq(64).unwrap();
    let qp = pd.create_qp(&small, &big, QpCap::default()).unwrap();
    let peer = side(QpCap::default(), 4096);
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

#[test]
fn many_qps_of_one_device_work_side_by_side() {
    let pairs: Vec<_> = (0..8)
        .map(|_| pair(QpCap::default(), ConnectAttr::default()))
        .collect();
    for (i, (a, b)) in pairs.iter().enumerate() {
        b.post_recv(i as u64, 0, 64);
        a.write(0, &[i as u8; 16]);
        a.send(i as u64, WrOp::Send, 0, 16, true).unwrap();
    }
    for (i, (_, b)) in pairs.iter().enumerate() {
        let rx = poll_n(&b.recv_cq, 1, T);
        assert_eq!(rx[0].wr_id, i as u64);
        assert_eq!(b.read(0, 16), vec![i as u8; 16]);
    }
}

#[test]
fn deregistered_mr_is_refused_to_the_peer_at_once() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let mem = b.pd.alloc_shared(4096).unwrap();
    let mr = b.pd.reg_shared(&mem, 0, 4096, Access::ALL).unwrap();
    let (addr, rkey) = (mr.addr(), mr.rkey());
    a.send(
        1,
        WrOp::Write {
            remote_addr: addr,
            rkey,
        },
        0,
        8,
        true,
    )
    .unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::Success);
    drop(mr);
    a.send(
        2,
        WrOp::Write {
            remote_addr: addr,
            rkey,
        },
        0,
        8,
        true,
    )
    .unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn receive_buffer_with_a_bad_key_fails_both_sides() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let sge = [byteexpress_verbs::Sge {
        addr: b.mr.addr(),
        len: 64,
        lkey: b.mr.lkey() ^ 0x777,
    }];
    b.qp.post_recv(&RecvWr {
        wr_id: 4,
        sg_list: &sge,
    })
    .unwrap();
    a.send(1, WrOp::Send, 0, 8, true).unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::RemOpErr);
    let rx = poll_n(&b.recv_cq, 1, T);
    assert_eq!((rx[0].wr_id, rx[0].status), (4, WcStatus::LocProtErr));
    assert_eq!(b.qp.state(), QpState::Err);
}

#[test]
fn destroyed_peer_qp_makes_sends_fail_with_retry_exceeded() {
    let (a, b) = pair(QpCap::default(), fast_attr());
    b.post_recv(1, 0, 64);
    drop(b);
    let t0 = Instant::now();
    a.send(1, WrOp::Send, 0, 8, true).unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(tx[0].status, WcStatus::RetryExcErr);
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert_eq!(a.qp.state(), QpState::Err);
}
