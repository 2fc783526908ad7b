//! A QP fatal error (`IBV_EVENT_QP_FATAL`, `ibv_get_async_event(3)`; IBTA 11.6.3, a local
//! catastrophic error): the QP enters ERR and says so through the device's async events, not
//! through a completion; its outstanding WRs complete only when the application moves it to
//! ERR itself (flushed). Other QPs go on.

mod common;

use std::time::Duration;

use byteexpress_verbs::test_hooks::inject_qp_fatal;
use byteexpress_verbs::{AsyncEvent, AsyncEvents, QpCap, QpState, WcStatus, WrOp};
use common::*;

const T: Duration = Duration::from_secs(5);
/// Long enough for any completion the provider would make of its own accord.
const QUIET: Duration = Duration::from_millis(300);

fn events_now(events: &mut AsyncEvents) -> Vec<AsyncEvent> {
    let mut seen = Vec::new();
    while let Some(e) = events.try_next().unwrap() {
        seen.push(e);
    }
    seen
}

#[test]
fn qp_fatal_raises_the_event_and_completes_nothing_until_to_err() {
    let mut events = soft().async_events().unwrap();
    let (a, b) = soft_pair(QpCap::default(), fast_attr());
    a.post_recv(1, 0, 4096);
    a.post_recv(2, 4096, 4096);
    assert!(inject_qp_fatal(&a.qp));
    assert_eq!(a.qp.state(), QpState::Err);
    let seen = events_now(&mut events);
    let want = AsyncEvent::QpFatal {
        qp_num: a.qp.qp_num(),
    };
    assert!(seen.contains(&want), "{want:?} in {seen:?}");
    assert!(
        !seen.contains(&AsyncEvent::QpFatal {
            qp_num: b.qp.qp_num()
        }),
        "only the failed QP is named: {seen:?}"
    );
    // No completion reports the error: the receives stay outstanding.
    assert_eq!(poll_for(&a.recv_cq, QUIET), Vec::new());
    // The application moves the QP to ERR: now they flush, in order.
    a.qp.to_err().unwrap();
    let rx = poll_n(&a.recv_cq, 2, T);
    assert_eq!(
        rx.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
    // The peer finds a dead responder.
    b.send(7, WrOp::Send, 0, 16, true).unwrap();
    let tx = poll_n(&b.send_cq, 1, T);
    assert_eq!((tx[0].wr_id, tx[0].status), (7, WcStatus::RetryExcErr));
}

#[test]
fn qp_fatal_leaves_other_qps_working() {
    let (a, _b) = soft_pair(QpCap::default(), fast_attr());
    let (c, d) = soft_pair(QpCap::default(), fast_attr());
    assert!(inject_qp_fatal(&a.qp));
    d.post_recv(3, 0, 4096);
    c.send(4, WrOp::Send, 0, 64, true).unwrap();
    assert_eq!(poll_n(&c.send_cq, 1, T)[0].status, WcStatus::Success);
    let rx = poll_n(&d.recv_cq, 1, T);
    assert_eq!((rx[0].wr_id, rx[0].status), (3, WcStatus::Success));
    assert_eq!(c.qp.state(), QpState::Rts);
    // A QP already in ERR has nothing to fail.
    assert!(!inject_qp_fatal(&a.qp));
}
