//! Memory windows on the soft provider, where the conformance suite cannot go: invalidating a
//! window that is not bound crashes rxe's kernel (Linux 6.1, `rxe_do_invalidate_mw`), so these
//! answers are pinned on the soft provider only (DESIGN.md 3.1).

mod common;

use std::time::Duration;

use byteexpress_verbs::{Access, QpCap, SendWr, WcOpcode, WcStatus, WrOp};
use common::*;

const T: Duration = Duration::from_secs(5);

#[test]
fn the_receive_of_a_send_with_inv_naming_an_unbound_window_fails_both_sides() {
    let (a, b) = soft_pair(QpCap::default(), fast_attr());
    let mw = b.pd.alloc_mw().unwrap();
    b.post_recv(3, 0, 64);
    a.send(4, WrOp::SendWithInv { rkey: mw.rkey() }, 0, 8, true)
        .unwrap();
    let rx = poll_n(&b.recv_cq, 1, T);
    assert_eq!(rx.len(), 1);
    assert_eq!(
        (rx[0].wr_id, rx[0].status, rx[0].invalidated_rkey),
        (3, WcStatus::RemInvReqErr, None)
    );
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(tx.len(), 1);
    assert_eq!((tx[0].wr_id, tx[0].status), (4, WcStatus::RemInvReqErr));
}

#[test]
fn local_inv_of_a_window_that_is_not_bound_fails_with_loc_qp_op_err() {
    let (_a, b) = soft_pair(QpCap::default(), fast_attr());
    let mw = b.pd.alloc_mw().unwrap();
    b.qp.post_send(&SendWr {
        wr_id: 9,
        op: WrOp::LocalInv { rkey: mw.rkey() },
        sg_list: &[],
        signaled: true,
        inline: false,
    })
    .unwrap();
    let wc = poll_n(&b.send_cq, 1, T);
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (9, WcStatus::LocQpOpErr, WcOpcode::LocalInv)
    );
}

#[test]
fn a_window_over_local_only_memory_fails_its_bind_with_mw_bind_err() {
    // The soft device's own limit: a peer maps only memory allocated for remote access.
    let (_a, b) = soft_pair(QpCap::default(), fast_attr());
    let mem = b.pd.alloc_shared_for(4096, Access::LOCAL_WRITE).unwrap();
    let mr =
        b.pd.reg_shared(&mem, 0, 4096, Access::LOCAL_WRITE | Access::MW_BIND)
            .unwrap();
    let mw = b.pd.alloc_mw().unwrap();
    b.qp.post_send(&SendWr {
        wr_id: 5,
        op: WrOp::BindMw(byteexpress_verbs::MwBind {
            mw: &mw,
            mr: &mr,
            addr: mr.addr(),
            len: 64,
            access: Access::REMOTE_READ,
        }),
        sg_list: &[],
        signaled: true,
        inline: false,
    })
    .unwrap();
    let wc = poll_n(&b.send_cq, 1, T);
    assert_eq!(wc.len(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::MwBindErr));
}
