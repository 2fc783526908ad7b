//! Object lifetimes and completion events: teardown in any drop order with work outstanding,
//! many QPs on one device, and `Cq::ready` under tokio.

use std::time::{Duration, Instant};

use byteexpress_verbs::{ConnectAttr, QpCap, Wc, WcStatus, WrOp};

use crate::T;
use crate::common::*;

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

/// Many wake-ups in a row on one CQ: each completion event is consumed, none is lost.
#[test]
fn a_cq_wakes_again_for_each_later_completion() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    for i in 0..5 {
        b.post_recv(i, 0, 64);
    }
    let sender = std::thread::spawn(move || {
        for i in 0..5 {
            std::thread::sleep(Duration::from_millis(10));
            a.send(i, WrOp::Send, 0, 4, false).unwrap();
        }
        a
    });
    let got = rt.block_on(async {
        let mut got = Vec::new();
        let mut wc = [Wc::default(); 4];
        while got.len() < 5 {
            tokio::time::timeout(T, b.recv_cq.ready(Duration::from_micros(5)))
                .await
                .expect("woken")
                .unwrap();
            let n = b.recv_cq.poll(&mut wc).unwrap();
            got.extend(wc[..n].iter().map(|w| w.wr_id));
        }
        got
    });
    assert_eq!(got, [0, 1, 2, 3, 4]);
    sender.join().unwrap();
}

#[test]
fn many_qps_of_one_device_work_side_by_side() {
    let pairs: Vec<_> = (0..6)
        .map(|_| pair(QpCap::default(), ConnectAttr::default()))
        .collect();
    for (i, (a, b)) in pairs.iter().enumerate() {
        b.post_recv(i as u64, 0, 64);
        a.write(0, &[i as u8; 16]);
        a.send(i as u64, WrOp::Send, 0, 16, true).unwrap();
    }
    for (i, (_, b)) in pairs.iter().enumerate() {
        let rx = poll_n(&b.recv_cq, 1, T);
        assert_eq!((rx[0].wr_id, rx[0].qp_num), (i as u64, b.qp.qp_num()));
        assert_eq!(b.read(0, 16), vec![i as u8; 16]);
    }
}

/// A pair with work outstanding in both directions: a send waiting for RNR, posted receives,
/// and an armed CQ with an unread completion event.
fn busy_pair() -> (Side, Side) {
    let attr = ConnectAttr {
        min_rnr_timer: 1,
        ..ConnectAttr::default()
    };
    let (a, b) = pair(QpCap::default(), attr);
    a.post_recv(1, 0, 64);
    a.post_recv(2, 64, 64);
    b.post_recv(3, 0, 64);
    a.send(4, WrOp::Send, 0, 8, true).unwrap(); // consumes b's receive
    a.send(5, WrOp::Send, 0, 8, true).unwrap(); // waits: RNR
    // An event sits unread on a's send CQ.
    let _ = poll_n(&b.recv_cq, 1, T);
    let mut wc = [Wc::default(); 1];
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].wr_id, 4);
    let _ = a.send_cq.poll(&mut wc);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // Arms the CQ; a flush later raises an event nobody reads.
        let _ =
            tokio::time::timeout(Duration::from_millis(5), a.send_cq.ready(Duration::ZERO)).await;
    });
    (a, b)
}

/// The device still works after a teardown: a fresh pair exchanges a message.
fn device_still_works() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    b.post_recv(1, 0, 64);
    a.send(1, WrOp::Send, 0, 8, true).unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::Success);
    assert_eq!(poll_n(&b.recv_cq, 1, T)[0].status, WcStatus::Success);
}

#[test]
fn teardown_in_field_order_with_work_outstanding() {
    let (a, b) = busy_pair();
    drop(a);
    drop(b);
    device_still_works();
}

#[test]
fn teardown_of_cqs_pd_and_mr_before_the_qp() {
    let (a, b) = busy_pair();
    let Side {
        pd,
        qp,
        send_cq,
        recv_cq,
        mem,
        mr,
    } = a;
    drop(send_cq);
    drop(recv_cq);
    drop(pd);
    drop(mr);
    drop(mem);
    qp.to_err().unwrap(); // the QP still works: its PD and CQs live on inside it
    assert_eq!(qp.state(), byteexpress_verbs::QpState::Err);
    drop(qp);
    drop(b);
    device_still_works();
}

#[test]
fn teardown_of_the_peer_first_then_memory_before_the_qp() {
    let (a, b) = busy_pair();
    drop(b);
    let Side {
        pd,
        qp,
        send_cq,
        recv_cq,
        mem,
        mr,
    } = a;
    drop(mem);
    drop(mr);
    drop(qp);
    drop(recv_cq);
    drop(pd);
    let mut wc = [Wc::default(); 8];
    let _ = send_cq.poll(&mut wc); // the CQ outlives its QP and can still be polled
    drop(send_cq);
    device_still_works();
}

/// Handles of a second opened context keep it alive after the context handle itself is dropped.
#[test]
fn objects_outlive_the_context_handle_they_came_from() {
    let ctx = open_provider();
    let a = side_on(&ctx, QpCap::default(), 4096);
    let b = side_on(&ctx, QpCap::default(), 4096);
    drop(ctx);
    a.qp.connect(&b.qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    b.qp.connect(&a.qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    b.post_recv(1, 0, 64);
    a.write(0, b"still here");
    a.send(1, WrOp::Send, 0, 10, true).unwrap();
    assert_eq!(poll_n(&b.recv_cq, 1, T)[0].byte_len, 10);
    assert_eq!(b.read(0, 10), b"still here");
    drop(b);
    drop(a);
}
