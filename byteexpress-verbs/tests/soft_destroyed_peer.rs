//! A destroyed QP answers no peer from the moment the application drops it, even while the
//! device still holds it (a CQ poll, the progress thread): the peer's SEND times out with
//! RETRY_EXC_ERR, as against an IB responder that is gone, and never fails on the receive
//! buffers the application deregisters after the QP.

mod common;

use std::time::Duration;

use byteexpress_verbs::test_hooks::hold_provider_qp;
use byteexpress_verbs::{QpCap, QpState, WcStatus, WrOp};
use common::*;

const T: Duration = Duration::from_secs(5);

#[test]
fn a_destroyed_peer_qp_the_device_still_holds_drops_sends_so_they_time_out() {
    let (a, b) = soft_pair(QpCap::default(), fast_attr());
    b.post_recv(1, 0, 64);
    // As the progress thread or a CQ poll holding the QP when the application drops it
    // (1 run in ~60 of conformance's `a_destroyed_peer_qp_makes_sends_fail_with_retry_exceeded`
    // failed with REM_OP_ERR this way: the receive buffer's MR was gone, the QP not yet).
    let hold = hold_provider_qp(&b.qp).expect("a soft QP");
    drop(b); // the QP handle first, then its PD, CQs, memory and MR
    a.send(1, WrOp::Send, 0, 8, true).unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(tx[0].status, WcStatus::RetryExcErr);
    assert_eq!(a.qp.state(), QpState::Err);
    drop(hold);
}
