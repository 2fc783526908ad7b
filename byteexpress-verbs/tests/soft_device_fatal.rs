//! A device fatal error (`IBV_EVENT_DEVICE_FATAL`, `ibv_get_async_event(3)`): the device
//! says so through its async events, and none of its QPs completes anything again, not even
//! a flush. Its own test binary: it fails the process's one soft device.

mod common;

use std::time::Duration;

use byteexpress_verbs::test_hooks::inject_device_fatal;
use byteexpress_verbs::{AsyncEvent, QpCap, QpState, RecvWr, WcStatus, WrOp};
use common::*;

const T: Duration = Duration::from_secs(5);
/// Long enough for any completion the provider would make of its own accord.
const QUIET: Duration = Duration::from_millis(300);

#[test]
fn device_fatal_raises_the_event_and_nothing_completes_not_even_a_flush() {
    let mut events = soft().async_events().unwrap();
    let (a, b) = soft_pair(QpCap::default(), fast_attr());
    a.post_recv(1, 0, 4096);
    a.post_recv(2, 4096, 4096);
    assert!(inject_device_fatal(&soft()));
    let mut seen = Vec::new();
    while let Some(e) = events.try_next().unwrap() {
        seen.push(e);
    }
    assert!(seen.contains(&AsyncEvent::DeviceFatal), "{seen:?}");
    assert_eq!((a.qp.state(), b.qp.state()), (QpState::Err, QpState::Err));
    assert_eq!(poll_for(&a.recv_cq, QUIET), Vec::new());
    // Moving a QP to ERR flushes nothing: flushes never come from a dead device.
    a.qp.to_err().unwrap();
    assert_eq!(poll_for(&a.recv_cq, QUIET), Vec::new());
    // Posts are taken, as by hardware that is gone, and never complete.
    let sge = [a.sge(0, 16)];
    a.qp.post_recv(&RecvWr {
        wr_id: 3,
        sg_list: &sge,
    })
    .unwrap();
    b.send(4, WrOp::Send, 0, 16, true).unwrap();
    assert_eq!(poll_for(&a.recv_cq, QUIET), Vec::new());
    assert_eq!(poll_for(&b.send_cq, QUIET), Vec::new());
    // QPs made after the fault work (the device as a reset leaves it).
    let (c, d) = soft_pair(QpCap::default(), fast_attr());
    d.post_recv(5, 0, 4096);
    c.send(6, WrOp::Send, 0, 64, true).unwrap();
    assert_eq!(poll_n(&c.send_cq, 1, T)[0].status, WcStatus::Success);
    assert_eq!(poll_n(&d.recv_cq, 1, T)[0].status, WcStatus::Success);
}
