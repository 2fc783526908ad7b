//! A broken or hostile peer writes garbage into the ring it shares with a QP: that QP fails
//! (ERR, flushes), the process does not panic, and other QPs keep working.

mod common;

use std::time::Duration;

use byteexpress_verbs::test_hooks::{RingIndex, corrupt_ring_index};
use byteexpress_verbs::{Access, ConnectAttr, QpCap, QpState, RecvWr, WcStatus, WrOp};
use common::*;

const T: Duration = Duration::from_secs(5);

/// Two receiving QPs sharing one recv CQ, each connected to its own sender.
struct Setup {
    senders: [Side; 2],
    rx_pd: byteexpress_verbs::Pd,
    rx_cq: byteexpress_verbs::Cq,
    rx_qps: [byteexpress_verbs::Qp; 2],
    rx_mr: byteexpress_verbs::Mr,
}

fn setup() -> Setup {
    let ctx = soft();
    let rx_pd = ctx.alloc_pd().unwrap();
    let rx_cq = ctx.create_cq(1024).unwrap();
    let tx_cq = ctx.create_cq(1024).unwrap();
    let mem = rx_pd.alloc_shared(1 << 16).unwrap();
    let rx_mr = rx_pd.reg_shared(&mem, 0, mem.len(), Access::ALL).unwrap();
    let senders = [
        soft_side(QpCap::default(), 4096),
        soft_side(QpCap::default(), 4096),
    ];
    let rx_qps = [0, 1].map(|i| {
        let qp = rx_pd.create_qp(&tx_cq, &rx_cq, QpCap::default()).unwrap();
        let attr = ConnectAttr {
            min_rnr_timer: 1,
            timeout: 8,
            retry_cnt: 1,
            ..ConnectAttr::default()
        };
        qp.connect(&senders[i].qp.endpoint(), &attr).unwrap();
        senders[i].qp.connect(&qp.endpoint(), &attr).unwrap();
        qp
    });
    Setup {
        senders,
        rx_pd,
        rx_cq,
        rx_qps,
        rx_mr,
    }
}

impl Setup {
    fn post_recv(&self, qp: usize, wr_id: u64) {
        let sge = [byteexpress_verbs::Sge {
            addr: self.rx_mr.addr() + qp as u64 * 4096,
            len: 4096,
            lkey: self.rx_mr.lkey(),
        }];
        self.rx_qps[qp]
            .post_recv(&RecvWr {
                wr_id,
                sg_list: &sge,
            })
            .unwrap();
    }

    /// QP 1 still works end to end.
    fn second_pair_works(&self) {
        self.post_recv(1, 77);
        self.senders[1].send(1, WrOp::Send, 0, 100, true).unwrap();
        let rx = poll_n(&self.rx_cq, 1, T);
        assert_eq!(
            (rx[0].wr_id, rx[0].status, rx[0].qp_num),
            (77, WcStatus::Success, self.rx_qps[1].qp_num())
        );
        assert_eq!(self.rx_qps[1].state(), QpState::Rts);
        let _ = &self.rx_pd;
    }
}

#[test]
fn bogus_completion_index_fails_only_that_qp() {
    for bogus in [u64::MAX, 1 << 40, 3, 2] {
        let s = setup();
        s.post_recv(0, 1);
        s.post_recv(0, 2);
        assert!(corrupt_ring_index(
            &s.rx_qps[0],
            RingIndex::InboundCompletionProducer,
            bogus
        ));
        let rx = poll_n(&s.rx_cq, 2, T);
        assert_eq!(
            rx.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)],
            "bogus index {bogus}"
        );
        assert_eq!(s.rx_qps[0].state(), QpState::Err);
        s.second_pair_works();
    }
}

#[test]
fn bogus_receive_consumer_index_fails_the_sender_qp_only() {
    for bogus in [u64::MAX >> 1, 1 << 40, 5] {
        let s = setup();
        s.post_recv(0, 1);
        assert!(corrupt_ring_index(
            &s.rx_qps[0],
            RingIndex::ReceiveConsumer,
            bogus
        ));
        s.senders[0].send(9, WrOp::Send, 0, 10, false).unwrap();
        let tx = poll_n(&s.senders[0].send_cq, 1, T);
        assert_eq!(
            (tx[0].wr_id, tx[0].status),
            (9, WcStatus::RemOpErr),
            "bogus index {bogus}"
        );
        assert_eq!(s.senders[0].qp.state(), QpState::Err);
        s.second_pair_works();
    }
}

#[test]
fn peer_qp_in_err_is_not_written_after_its_flush() {
    let s = setup();
    s.post_recv(0, 1);
    s.rx_qps[0].to_err().unwrap();
    let rx = poll_n(&s.rx_cq, 1, T);
    assert_eq!((rx[0].wr_id, rx[0].status), (1, WcStatus::WrFlushErr));
    // The sender finds the receiver gone (its QP in ERR) and gives up after its ACK timeout.
    s.senders[0].write(0, &[0xee; 16]);
    s.senders[0].send(5, WrOp::Send, 0, 16, true).unwrap();
    let tx = poll_n(&s.senders[0].send_cq, 1, T);
    assert_eq!(tx[0].status, WcStatus::RetryExcErr);
    // SAFETY: the first 16 bytes of the receive MR lie in its live mapping.
    let first = unsafe { std::slice::from_raw_parts(s.rx_mr.addr() as *const u8, 16) }.to_vec();
    assert_eq!(first, [0u8; 16], "the flushed buffer was not written");
    s.second_pair_works();
}

/// Garbage in the shared ring is an error no completion reports: the QP raises QP_FATAL on the
/// device's async event stream (`ibv_get_async_event(3)`).
#[test]
fn a_peer_writing_garbage_raises_qp_fatal() {
    let s = setup();
    let mut events = soft().async_events().unwrap();
    s.post_recv(0, 1);
    assert!(corrupt_ring_index(
        &s.rx_qps[0],
        RingIndex::InboundCompletionProducer,
        u64::MAX
    ));
    let _ = poll_n(&s.rx_cq, 1, T);
    let want = byteexpress_verbs::AsyncEvent::QpFatal {
        qp_num: s.rx_qps[0].qp_num(),
    };
    let mut seen = Vec::new();
    while let Some(e) = events.try_next().unwrap() {
        seen.push(e);
    }
    assert!(seen.contains(&want), "{want:?} in {seen:?}");
    s.second_pair_works();
}
