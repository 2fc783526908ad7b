//! `PostedSends`: unsignaled WRs come back with the signaled completion after them, every WR
//! comes back at a failure, and an inline WR's buffer returns to the pool at post.

mod common;
use common::{one_completion, soft};

use byteexpress_mem::{Pool, PoolConfig, PostedBufs, PostedSends, SendFlags};
use byteexpress_verbs::{ConnectAttr, Context, Cq, Qp, QpCap, WcStatus, WrOp};
use bytes::BufMut;

fn end(ctx: &Context) -> (Pool, Qp, Cq) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qp = pd
        .create_qp(
            &cq,
            &cq,
            QpCap {
                max_inline_data: 256,
                ..QpCap::default()
            },
        )
        .unwrap();
    let pool = Pool::new(
        &pd,
        PoolConfig {
            limit: 4 << 20,
            ..PoolConfig::for_device(ctx)
        },
    )
    .unwrap();
    (pool, qp, cq)
}

fn in_use(pool: &Pool) -> u64 {
    pool.stats().classes.iter().map(|c| c.in_use).sum()
}

/// Two connected ends; `rnr_retry` 0 so that a SEND finding no receive fails at once.
fn connected(ctx: &Context) -> ((Pool, Qp, Cq), (Pool, Qp, Cq)) {
    let a = end(ctx);
    let b = end(ctx);
    let attr = ConnectAttr {
        rnr_retry: 0,
        min_rnr_timer: 1,
        timeout: 10,
        retry_cnt: 1,
        ..ConnectAttr::default()
    };
    a.1.connect(&b.1.endpoint(), &attr).unwrap();
    b.1.connect(&a.1.endpoint(), &attr).unwrap();
    (a, b)
}

const UNSIGNALED: SendFlags = SendFlags {
    signaled: false,
    inline: false,
};
const SIGNALED: SendFlags = SendFlags {
    signaled: true,
    inline: false,
};

/// `n` receives of 256 bytes posted on `qp`, held until dropped.
fn receives(pool: &Pool, qp: &Qp, n: usize) -> PostedBufs<()> {
    let mut recvs = PostedBufs::<()>::new(1);
    for _ in 0..n {
        recvs
            .post_recv(qp, pool.try_alloc(256).unwrap(), ())
            .unwrap();
    }
    recvs
}

fn filled(pool: &Pool, bytes: &[u8]) -> byteexpress_mem::RegisteredBuf {
    let mut b = pool.try_alloc(256).unwrap();
    b.put_slice(bytes);
    b
}

#[test]
fn a_signaled_completion_hands_back_every_earlier_unsignaled_wr_in_posting_order() {
    let ctx = soft();
    let ((tx_pool, tx_qp, tx_cq), (rx_pool, rx_qp, rx_cq)) = connected(&ctx);
    let _recvs = receives(&rx_pool, &rx_qp, 3);
    let mut sends = PostedSends::<u32>::new(2);
    sends
        .post(&tx_qp, filled(&tx_pool, b"a"), WrOp::Send, 1, UNSIGNALED)
        .unwrap();
    sends
        .post(&tx_qp, filled(&tx_pool, b"b"), WrOp::Send, 2, UNSIGNALED)
        .unwrap();
    let last = sends
        .post(&tx_qp, filled(&tx_pool, b"c"), WrOp::Send, 3, SIGNALED)
        .unwrap();
    assert_eq!(in_use(&tx_pool), 3, "the WRs hold their buffers");
    for _ in 0..3 {
        assert_eq!(one_completion(&rx_cq).status, WcStatus::Success);
    }
    let wc = one_completion(&tx_cq);
    assert_eq!((wc.wr_id, wc.status), (last, WcStatus::Success));
    let done: Vec<_> = sends.complete(&wc).collect();
    assert_eq!(
        done.iter().map(|d| (d.data, d.named)).collect::<Vec<_>>(),
        [(1, false), (2, false), (3, true)]
    );
    assert_eq!(
        done.iter()
            .map(|d| d.buf.as_ref().unwrap().as_slice().to_vec())
            .collect::<Vec<_>>(),
        [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
    );
    drop(done);
    assert_eq!(in_use(&tx_pool), 0, "every buffer is back");
    assert!(sends.is_empty());
    assert_eq!(
        sends.complete(&wc).len(),
        0,
        "a completion hands its WRs back once"
    );
}

#[test]
fn at_a_failure_each_errored_or_flushed_wr_comes_back_with_its_own_completion() {
    let ctx = soft();
    let ((tx_pool, tx_qp, tx_cq), (rx_pool, rx_qp, _rx_cq)) = connected(&ctx);
    // One receive: the second SEND finds none and fails (RNR, no retry).
    let _recvs = receives(&rx_pool, &rx_qp, 1);
    let mut sends = PostedSends::<u32>::new(2);
    for i in 1..=4 {
        sends
            .post(&tx_qp, filled(&tx_pool, b"x"), WrOp::Send, i, UNSIGNALED)
            .unwrap();
    }
    let mut got = Vec::new();
    for _ in 0..3 {
        let wc = one_completion(&tx_cq);
        let done: Vec<_> = sends.complete(&wc).map(|d| (d.data, d.named)).collect();
        got.push((wc.status, done));
    }
    assert_eq!(
        got,
        [
            // WR 1 succeeded silently: the error completion of WR 2 covers it.
            (WcStatus::RnrRetryExcErr, vec![(1, false), (2, true)]),
            (WcStatus::WrFlushErr, vec![(3, true)]),
            (WcStatus::WrFlushErr, vec![(4, true)]),
        ]
    );
    assert!(sends.is_empty());
    assert_eq!(in_use(&tx_pool), 0, "every buffer is back");
}

#[test]
fn an_inline_send_returns_its_buffer_to_the_pool_at_post() {
    let ctx = soft();
    let ((tx_pool, tx_qp, tx_cq), (rx_pool, rx_qp, rx_cq)) = connected(&ctx);
    let mut recvs = receives(&rx_pool, &rx_qp, 1);
    let mut sends = PostedSends::<u32>::new(2);
    let buf = filled(&tx_pool, b"inline bytes");
    assert_eq!(in_use(&tx_pool), 1);
    let id = sends
        .post(
            &tx_qp,
            buf,
            WrOp::Send,
            9,
            SendFlags {
                signaled: true,
                inline: true,
            },
        )
        .unwrap();
    assert_eq!(
        in_use(&tx_pool),
        0,
        "the buffer is back before the completion"
    );
    assert_eq!(sends.len(), 1, "the WR's data waits for its completion");
    let rwc = one_completion(&rx_cq);
    let (rbuf, ()) = recvs.complete(&rwc).unwrap();
    assert_eq!(rbuf.as_slice(), b"inline bytes");
    let wc = one_completion(&tx_cq);
    assert_eq!(wc.wr_id, id);
    let done: Vec<_> = sends.complete(&wc).collect();
    assert_eq!(done.len(), 1);
    assert!(done[0].buf.is_none() && done[0].named && done[0].data == 9);
}

#[test]
fn a_refused_post_gives_the_buffer_back_and_holds_nothing() {
    let ctx = soft();
    let (pool, qp, _cq) = end(&ctx);
    let mut sends = PostedSends::<()>::new(3);
    let buf = filled(&pool, b"x");
    let addr = buf.addr();
    // The QP is still in RESET: posting is refused.
    let (err, back) = sends.post(&qp, buf, WrOp::Send, (), SIGNALED).unwrap_err();
    assert_eq!(back.addr(), addr, "{err}");
    assert!(sends.is_empty());
}

#[test]
fn a_drain_after_to_err_hands_back_unsignaled_sends_that_completed_silently() {
    let ctx = soft();
    let ((tx_pool, tx_qp, tx_cq), (rx_pool, rx_qp, rx_cq)) = connected(&ctx);
    let _recvs = receives(&rx_pool, &rx_qp, 2);
    let mut sends = PostedSends::<u32>::new(2);
    for i in 1..=2 {
        sends
            .post(&tx_qp, filled(&tx_pool, b"x"), WrOp::Send, i, UNSIGNALED)
            .unwrap();
    }
    for _ in 0..2 {
        assert_eq!(one_completion(&rx_cq).status, WcStatus::Success);
    }
    assert!(
        matches!(
            sends.post_drain(&tx_qp, 0),
            Err(byteexpress_verbs::Error::InvalidState(_))
        ),
        "no drain on a live QP: it would send an empty message"
    );
    assert_eq!(sends.len(), 2);
    tx_qp.to_err().unwrap();
    let drain = sends.post_drain(&tx_qp, 3).unwrap();
    // WRs the sender had not yet seen acknowledged are flushed with their own completions;
    // those it had complete silently and come back with the drain's.
    let mut back = Vec::new();
    let last = loop {
        let wc = one_completion(&tx_cq);
        assert_eq!(wc.status, WcStatus::WrFlushErr);
        back.extend(sends.complete(&wc).map(|d| d.data));
        if sends.is_empty() {
            break wc.wr_id;
        }
    };
    assert_eq!(last, drain, "the drain completes last");
    assert_eq!(back, [1, 2, 3]);
    assert_eq!(in_use(&tx_pool), 0, "every buffer is back");
}
