//! The QP state machine as the API enforces it (`ibv_modify_qp(3)`): connect only from RESET,
//! SQD (posting refused, the send queue drains, SQ_DRAINED, back to RTS), and the async events
//! of CQ overrun.

use std::time::{Duration, Instant};

use byteexpress_verbs::{
    Access, AsyncEvent, AsyncEvents, ConnectAttr, Error, QpCap, QpState, WcStatus, WrOp,
};

use crate::T;
use crate::common::*;

fn wait_event(events: &mut AsyncEvents, want: AsyncEvent) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(T, async {
            loop {
                if events.next().await.unwrap() == want {
                    return;
                }
            }
        })
        .await
    })
    .is_ok()
}

fn invalid_state<T: std::fmt::Debug>(r: byteexpress_verbs::Result<T>) -> bool {
    matches!(r, Err(Error::InvalidState(_)))
}

#[test]
fn state_changes_out_of_sequence_are_invalid_state() {
    let a = side(QpCap::default(), 4096);
    let b = side(QpCap::default(), 4096);
    assert!(invalid_state(a.qp.to_sqd()), "SQD from RESET");
    assert!(
        invalid_state(a.qp.to_rts()),
        "RTS from RESET without connect"
    );
    assert_eq!(a.qp.state(), QpState::Reset);
    a.qp.connect(&b.qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    b.qp.connect(&a.qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    assert!(invalid_state(a.qp.to_rts()), "RTS from RTS");
    a.qp.to_err().unwrap();
    assert_eq!(a.qp.state(), QpState::Err);
    assert!(invalid_state(a.qp.to_sqd()), "SQD from ERR");
    assert!(invalid_state(a.qp.to_rts()), "RTS from ERR");
    assert!(invalid_state(
        a.qp.connect(&b.qp.endpoint(), &ConnectAttr::default())
    ));
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn in_sqd_posting_sends_is_invalid_state_receives_go_on_and_rts_resumes() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let mut events = provider().async_events().unwrap();
    b.post_recv(1, 0, 64);
    a.send(1, WrOp::Send, 0, 8, true).unwrap();
    a.qp.to_sqd().unwrap();
    assert!(
        wait_event(
            &mut events,
            AsyncEvent::SqDrained {
                qp_num: a.qp.qp_num()
            }
        ),
        "SQ_DRAINED"
    );
    assert_eq!(a.qp.state(), QpState::Sqd);
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::Success);
    let err = a.send(2, WrOp::Send, 0, 8, true);
    assert!(matches!(err, Err(Error::InvalidState(_))), "{err:?}");
    // Receives continue in SQD.
    a.post_recv(10, 0, 64);
    b.write(0, b"to sqd");
    b.send(3, WrOp::Send, 0, 6, true).unwrap();
    let rx = poll_n(&a.recv_cq, 1, T);
    assert_eq!((rx[0].wr_id, rx[0].status), (10, WcStatus::Success));
    assert_eq!(a.read(0, 6), b"to sqd");
    // Back to RTS (an rdma-core device may refuse while it still drains).
    let t0 = Instant::now();
    loop {
        match a.qp.to_rts() {
            Ok(()) => break,
            Err(Error::InvalidState(_)) if t0.elapsed() < T => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("to_rts: {e}"),
        }
    }
    assert_eq!(a.qp.state(), QpState::Rts);
    b.post_recv(2, 0, 64);
    a.send(4, WrOp::Send, 0, 8, true).unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].wr_id, 4);
    assert_eq!(poll_n(&b.recv_cq, 2, T).len(), 2);
}

/// `ibv_create_cq(3)`: more completions than the CQ holds overrun it; the device raises
/// IBV_EVENT_CQ_ERR.
#[test]
fn a_cq_overrun_raises_cq_err_on_the_async_event_stream() {
    let ctx = provider();
    let mut events = ctx.async_events().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let small = ctx.create_cq(2).unwrap();
    let big = ctx.create_cq(64).unwrap();
    let cap = QpCap {
        max_send_wr: 32,
        ..QpCap::default()
    };
    let qp = pd.create_qp(&small, &big, cap).unwrap();
    let mem = pd.alloc_shared(4096).unwrap();
    let mr = pd.reg_shared(&mem, 0, 4096, Access::ALL).unwrap();
    let b = side(QpCap::default(), 4096);
    qp.connect(&b.qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    b.qp.connect(&qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    for i in 0..16 {
        let sge = [byteexpress_verbs::Sge {
            addr: mr.addr(),
            len: 8,
            lkey: mr.lkey(),
        }];
        qp.post_send(&byteexpress_verbs::SendWr {
            wr_id: i,
            op: WrOp::Write {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            sg_list: &sge,
            signaled: true,
            inline: false,
        })
        .unwrap();
    }
    assert!(
        wait_event(&mut events, AsyncEvent::CqErr { cq: small.id() }),
        "CQ_ERR for CQ {}",
        small.id()
    );
}
