//! Limits and states: queue capacity (as granted: devices round queue sizes up), SGE count,
//! inline size, device caps, posting before the QP is ready, connecting twice, posting in ERR.

use std::time::Duration;

use byteexpress_verbs::{ConnectAttr, Error, QpCap, QpState, RecvWr, SendWr, WcStatus, WrOp};

use crate::T;
use crate::common::*;

#[test]
fn posting_before_connect_is_invalid_state() {
    let a = side(QpCap::default(), 4096);
    let b = side(QpCap::default(), 4096);
    assert_eq!(a.qp.state(), QpState::Reset);
    let err = a.send(1, WrOp::Send, 0, 8, true);
    assert!(matches!(err, Err(Error::InvalidState(_))), "{err:?}");
    let sge = [a.sge(0, 8)];
    let err = a.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &sge,
    });
    assert!(matches!(err, Err(Error::InvalidState(_))), "{err:?}");
    // Nothing was queued: once connected, the first send is the first to arrive.
    a.qp.connect(&b.qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    b.qp.connect(&a.qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    assert_eq!(a.qp.state(), QpState::Rts);
    b.post_recv(7, 0, 64);
    a.send(2, WrOp::Send, 0, 8, true).unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].wr_id, 2);
    assert!(poll_for(&a.send_cq, Duration::from_millis(20)).is_empty());
    assert_eq!(poll_n(&b.recv_cq, 1, T)[0].wr_id, 7);
}

#[test]
fn connecting_twice_is_invalid_state() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let err = a.qp.connect(&b.qp.endpoint(), &ConnectAttr::default());
    assert!(matches!(err, Err(Error::InvalidState(_))), "{err:?}");
    assert_eq!(
        a.qp.state(),
        QpState::Rts,
        "the failed call changed nothing"
    );
}

#[test]
fn connect_attributes_out_of_range_are_refused_and_leave_reset() {
    let a = side(QpCap::default(), 4096);
    let b = side(QpCap::default(), 4096);
    for bad in [
        ConnectAttr {
            retry_cnt: 8,
            ..ConnectAttr::default()
        },
        ConnectAttr {
            mtu: 100,
            ..ConnectAttr::default()
        },
    ] {
        let err = a.qp.connect(&b.qp.endpoint(), &bad);
        assert!(matches!(err, Err(Error::InvalidArgument(_))), "{err:?}");
        assert_eq!(a.qp.state(), QpState::Reset);
    }
}

/// Fills the granted send queue with sends that wait (no receive posted, RNR retried forever),
/// then one more: `QueueFull`, and that one is never sent.
#[test]
fn posting_beyond_the_granted_send_queue_is_queue_full_and_posts_nothing() {
    let cap = QpCap {
        max_send_wr: 4,
        ..QpCap::default()
    };
    let attr = ConnectAttr {
        min_rnr_timer: 1,
        ..ConnectAttr::default()
    };
    let (a, b) = pair(cap, attr);
    let granted = a.qp.cap().max_send_wr;
    assert!(granted >= 4, "granted {granted}");
    for i in 0..u64::from(granted) {
        a.send(i, WrOp::Send, 0, 8, true).unwrap();
    }
    let err = a.send(99, WrOp::Send, 0, 8, true);
    assert!(matches!(err, Err(Error::QueueFull(_))), "{err:?}");
    assert_eq!(err.unwrap_err().errno(), libc::ENOMEM);
    for i in 0..u64::from(granted) + 1 {
        b.post_recv(i, 0, 64);
    }
    let tx = poll_n(&a.send_cq, granted as usize, T);
    assert_eq!(
        tx.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (0..u64::from(granted)).collect::<Vec<_>>()
    );
    assert_eq!(
        poll_for(&b.recv_cq, Duration::from_millis(50)).len(),
        granted as usize,
        "the refused WR was not sent"
    );
    // Space freed by completions can be used again.
    a.send(100, WrOp::Send, 0, 8, true).unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].wr_id, 100);
}

#[test]
fn posting_beyond_the_granted_receive_queue_is_queue_full() {
    let cap = QpCap {
        max_recv_wr: 2,
        ..QpCap::default()
    };
    let (_a, b) = pair(cap, ConnectAttr::default());
    let granted = b.qp.cap().max_recv_wr;
    assert!(granted >= 2, "granted {granted}");
    for i in 0..u64::from(granted) {
        b.post_recv(i, 0, 8);
    }
    let sge = [b.sge(0, 8)];
    let err = b.qp.post_recv(&RecvWr {
        wr_id: 99,
        sg_list: &sge,
    });
    assert!(matches!(err, Err(Error::QueueFull(_))), "{err:?}");
}

#[test]
fn caps_beyond_device_limits_are_refused_and_granted_caps_cover_the_request() {
    let ctx = provider();
    let attr = ctx.query();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    for too_much in [
        QpCap {
            max_send_sge: attr.max_sge + 1,
            ..QpCap::default()
        },
        QpCap {
            max_send_wr: attr.max_qp_wr + 1,
            ..QpCap::default()
        },
        QpCap {
            max_inline_data: attr.max_inline_data + 1,
            ..QpCap::default()
        },
    ] {
        let err = pd.create_qp(&cq, &cq, too_much);
        assert!(
            matches!(err, Err(Error::InvalidArgument(_))),
            "{too_much:?}: {err:?}"
        );
    }
    let want = QpCap {
        max_send_wr: 3,
        max_recv_wr: 5,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: attr.max_inline_data.min(100),
    };
    let got = pd.create_qp(&cq, &cq, want).unwrap().cap();
    assert!(
        got.max_send_wr >= want.max_send_wr
            && got.max_recv_wr >= want.max_recv_wr
            && got.max_send_sge >= want.max_send_sge
            && got.max_recv_sge >= want.max_recv_sge
            && got.max_inline_data >= want.max_inline_data,
        "asked {want:?}, granted {got:?}"
    );
}

#[test]
fn more_sges_than_granted_are_invalid_argument() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let n = a.qp.cap().max_send_sge as usize + 1;
    let sges: Vec<_> = (0..n).map(|i| a.sge(i * 8, 8)).collect();
    let err = a.qp.post_send(&SendWr {
        wr_id: 1,
        op: WrOp::Send,
        sg_list: &sges,
        signaled: true,
        inline: false,
    });
    assert!(matches!(err, Err(Error::InvalidArgument(_))), "{err:?}");
    let n = b.qp.cap().max_recv_sge as usize + 1;
    let sges: Vec<_> = (0..n).map(|i| b.sge(i * 8, 8)).collect();
    let err = b.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &sges,
    });
    assert!(matches!(err, Err(Error::InvalidArgument(_))), "{err:?}");
}

#[test]
fn inline_beyond_the_granted_size_or_on_read_is_invalid_argument() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let max = a.qp.cap().max_inline_data;
    for (op, len) in [
        (WrOp::Send, max + 1),
        (
            WrOp::Read {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            8,
        ),
    ] {
        let sge = [a.sge(0, len)];
        let err = a.qp.post_send(&SendWr {
            wr_id: 6,
            op,
            sg_list: &sge,
            signaled: true,
            inline: true,
        });
        assert!(matches!(err, Err(Error::InvalidArgument(_))), "{err:?}");
    }
    assert!(poll_for(&a.send_cq, Duration::from_millis(20)).is_empty());
}

/// `ibv_post_send(3)`: a WR posted in ERR completes with WR_FLUSH_ERR.
#[test]
fn posting_in_err_completes_with_flush() {
    let (a, _b) = pair(QpCap::default(), ConnectAttr::default());
    a.qp.to_err().unwrap();
    a.post_recv(20, 0, 64);
    a.send(21, WrOp::Send, 0, 8, false).unwrap();
    let rx = poll_n(&a.recv_cq, 1, T);
    assert_eq!((rx[0].wr_id, rx[0].status), (20, WcStatus::WrFlushErr));
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!((tx[0].wr_id, tx[0].status), (21, WcStatus::WrFlushErr));
}
