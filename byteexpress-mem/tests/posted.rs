//! `PostedBufs`: a posted WR owns its buffer until its completion hands it back.

mod common;
use common::{one_completion, soft};

use byteexpress_mem::{Pool, PoolConfig, PostedBufs};
use byteexpress_verbs::{ConnectAttr, Context, Cq, Qp, QpCap, WcStatus, WrOp};
use bytes::BufMut;

fn end(ctx: &Context) -> (Pool, Qp, Cq) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qp = pd.create_qp(&cq, &cq, QpCap::default()).unwrap();
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

#[test]
fn posted_buffers_stay_out_of_the_pool_until_their_completion_hands_them_back() {
    let ctx = soft();
    let (tx_pool, tx_qp, tx_cq) = end(&ctx);
    let (rx_pool, rx_qp, rx_cq) = end(&ctx);
    tx_qp
        .connect(&rx_qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    rx_qp
        .connect(&tx_qp.endpoint(), &ConnectAttr::default())
        .unwrap();

    let mut recvs = PostedBufs::<&str>::new(1);
    let mut sends = PostedBufs::<u32>::new(2);
    let rbuf = rx_pool.try_alloc(4096).unwrap();
    let raddr = rbuf.addr();
    let rid = recvs.post_recv(&rx_qp, rbuf, "first receive").unwrap();
    assert_eq!(
        rx_pool
            .stats()
            .classes
            .iter()
            .map(|c| c.in_use)
            .sum::<u64>(),
        1,
        "the WR holds the receive buffer"
    );

    let mut sbuf = tx_pool.try_alloc(4096).unwrap();
    sbuf.put_slice(b"owned by the WR");
    let sid = sends.post_send(&tx_qp, sbuf, WrOp::Send, 7).unwrap();
    assert!(sends.owns(sid) && !recvs.owns(sid) && recvs.owns(rid));

    let swc = one_completion(&tx_cq);
    assert!(
        recvs.complete(&swc).is_none(),
        "a send completion is not the receive set's"
    );
    let (sbuf, data) = sends
        .complete(&swc)
        .expect("the send completion hands its buffer back");
    assert_eq!((data, swc.status), (7, WcStatus::Success));
    assert_eq!(sbuf.as_slice(), b"owned by the WR");
    assert!(sends.is_empty());

    let rwc = one_completion(&rx_cq);
    let (rbuf, data) = recvs
        .complete(&rwc)
        .expect("the receive completion hands its buffer back");
    assert_eq!(data, "first receive");
    assert_eq!(rbuf.addr(), raddr);
    assert_eq!(
        rbuf.as_slice(),
        b"owned by the WR",
        "length set from byte_len"
    );
    assert!(
        recvs.complete(&rwc).is_none(),
        "a completion hands its buffer back once"
    );
}

#[test]
fn a_refused_post_gives_the_buffer_back_and_keeps_nothing() {
    let ctx = soft();
    let (pool, qp, _cq) = end(&ctx);
    let mut sends = PostedBufs::<()>::new(3);
    let buf = pool.try_alloc(256).unwrap();
    let addr = buf.addr();
    // The QP is still in RESET: posting is refused.
    let (err, back) = sends.post_send(&qp, buf, WrOp::Send, ()).unwrap_err();
    assert_eq!(back.addr(), addr, "{err}");
    assert!(sends.is_empty());
}
