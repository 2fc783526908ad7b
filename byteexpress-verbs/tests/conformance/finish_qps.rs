//! `Pd::finish_qps`: no QP is created in the PD afterwards, and everything else of the PD (its
//! QPs, MRs registered before and after) behaves as without it. On the soft
//! provider the PD's memfds are closed once the peer has them, which these tests exercise.

use byteexpress_verbs::{Access, ConnectAttr, Error, QpCap, WcOpcode, WcStatus, WrOp};

use crate::T;
use crate::common::{Side, poll_n, side};

/// Two sides whose PDs are finished right after their one QP, connected to each other.
fn finished_pair(attr: ConnectAttr) -> (Side, Side) {
    let a = side(QpCap::default(), 1 << 16);
    let b = side(QpCap::default(), 1 << 16);
    a.pd.finish_qps();
    b.pd.finish_qps();
    a.qp.connect(&b.qp.endpoint(), &attr).unwrap();
    b.qp.connect(&a.qp.endpoint(), &attr).unwrap();
    (a, b)
}

#[test]
fn a_finished_pd_refuses_new_qps_with_invalid_state() {
    let s = side(QpCap::default(), 4096);
    s.pd.create_qp(&s.send_cq, &s.recv_cq, QpCap::default())
        .expect("a second QP before finish_qps");
    s.pd.finish_qps();
    let err =
        s.pd.create_qp(&s.send_cq, &s.recv_cq, QpCap::default())
            .expect_err("a QP after finish_qps");
    assert!(matches!(err, Error::InvalidState(_)), "{err:?}");
}

#[test]
fn memory_registered_before_and_after_connecting_a_finished_pd_is_reachable_by_the_peer() {
    let (a, b) = finished_pair(ConnectAttr::default());
    // Registered at connect time.
    a.write(0, b"before");
    let write = WrOp::Write {
        remote_addr: b.mr.addr() + 100,
        rkey: b.mr.rkey(),
    };
    a.send(1, write, 0, 6, true).unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(
        (tx[0].wr_id, tx[0].status),
        (1, WcStatus::Success),
        "{tx:?}"
    );
    assert_eq!(b.read(100, 6), b"before");
    // Allocated and registered once connected (on the soft provider: a new memfd, passed to
    // the peer and closed).
    for round in 0..3u64 {
        let later = b.pd.alloc_shared(8192).unwrap();
        let mr =
            b.pd.reg_shared(&later, 0, later.len(), Access::ALL)
                .unwrap();
        a.write(0, b"after!");
        let write = WrOp::Write {
            remote_addr: mr.addr() + 4096,
            rkey: mr.rkey(),
        };
        a.send(10 + round, write, 0, 6, true).unwrap();
        let tx = poll_n(&a.send_cq, 1, T);
        assert_eq!(
            (tx[0].wr_id, tx[0].status, tx[0].opcode),
            (10 + round, WcStatus::Success, WcOpcode::RdmaWrite),
            "{tx:?}"
        );
        let mut got = [0u8; 6];
        // SAFETY: in bounds of the live mapping; the write completed.
        unsafe { std::ptr::copy_nonoverlapping(later.as_ptr().add(4096), got.as_mut_ptr(), 6) };
        assert_eq!(&got, b"after!", "round {round}");
    }
    // SENDs into the memory registered at connect time still land.
    b.post_recv(5, 0, 64);
    a.write(0, b"a send");
    a.send(6, WrOp::Send, 0, 6, true).unwrap();
    let rx = poll_n(&b.recv_cq, 1, T);
    assert_eq!(
        (rx[0].wr_id, rx[0].status),
        (5, WcStatus::Success),
        "{rx:?}"
    );
    assert_eq!(b.read(0, 6), b"a send");
}
