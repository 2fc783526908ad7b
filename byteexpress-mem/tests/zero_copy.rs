//! One payload from `prost::Message::encode` to the receiver's `Bytes`, on two soft-provider QPs
//! of this process: encoded in place in registered memory, sent by naming that memory in the
//! SGE, received into a reserve buffer and handed out as `Bytes` over that same buffer.

mod common;
use common::{one_completion, soft};

use byteexpress_mem::{Pool, PoolConfig, is_pool_memory};
use byteexpress_verbs::{
    ConnectAttr, Context, Cq, Qp, QpCap, RecvWr, SendWr, WcOpcode, WcStatus, WrOp,
};
use prost::Message;

#[derive(Clone, PartialEq, prost::Message)]
struct Pull {
    #[prost(uint64, tag = "1")]
    key: u64,
    #[prost(bytes = "bytes", tag = "2")]
    value: bytes::Bytes,
    #[prost(string, tag = "3")]
    table: String,
}

struct End {
    pool: Pool,
    qp: Qp,
    cq: Cq,
}

fn end(ctx: &Context) -> End {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qp = pd.create_qp(&cq, &cq, QpCap::default()).unwrap();
    let cfg = PoolConfig {
        limit: 8 << 20,
        ..PoolConfig::for_device(ctx)
    };
    End {
        pool: Pool::new(&pd, cfg).unwrap(),
        qp,
        cq,
    }
}

#[test]
fn an_encoded_message_travels_from_the_encoder_to_the_receivers_bytes_without_a_copy() {
    let ctx = soft();
    let (tx, rx) = (end(&ctx), end(&ctx));
    tx.qp
        .connect(&rx.qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    rx.qp
        .connect(&tx.qp.endpoint(), &ConnectAttr::default())
        .unwrap();

    let receives = rx.pool.reserve(64 << 10, 4).unwrap();
    let posted = receives.take().unwrap();
    let recv_addr = posted.addr();
    rx.qp
        .post_recv(&RecvWr {
            wr_id: 7,
            sg_list: &[posted.recv_sge()],
        })
        .unwrap();

    let msg = Pull {
        key: 42,
        value: bytes::Bytes::from(vec![0xab; 20_000]),
        table: "embeddings".into(),
    };
    let mut sbuf = tx.pool.try_alloc(msg.encoded_len()).unwrap();
    msg.encode(&mut sbuf).unwrap();
    assert_eq!(sbuf.as_slice(), &msg.encode_to_vec()[..]);
    assert_eq!(
        sbuf.as_slice().as_ptr() as u64,
        sbuf.addr(),
        "encoded in place"
    );
    let sge = sbuf.sge();
    assert_eq!(
        (sge.addr, sge.len as usize),
        (sbuf.addr(), msg.encoded_len())
    );
    tx.qp
        .post_send(&SendWr {
            wr_id: 1,
            op: WrOp::Send,
            sg_list: &[sge],
            signaled: true,
            inline: false,
        })
        .unwrap();

    let wc = one_completion(&rx.cq);
    assert_eq!(
        (wc.status, wc.opcode, wc.wr_id),
        (WcStatus::Success, WcOpcode::Recv, 7)
    );
    assert_eq!(wc.byte_len as usize, msg.encoded_len());
    // The completion hands the posted buffer back (the WR owned it until now).
    let mut landed = posted;
    landed.set_len(wc.byte_len as usize);
    let received = landed.freeze();
    assert_eq!(
        received.as_ptr() as u64,
        recv_addr,
        "the receiver's Bytes is the posted buffer"
    );
    assert!(is_pool_memory(received.as_ptr()) && rx.pool.contains(received.as_ptr()));

    let decoded = Pull::decode(received.clone()).unwrap();
    assert_eq!(decoded, msg);
    let v = decoded.value.as_ptr() as u64;
    assert!(
        v >= recv_addr && v + 20_000 <= recv_addr + wc.byte_len as u64,
        "prost sliced the bytes field out of the receive buffer"
    );

    let sent = one_completion(&tx.cq);
    assert_eq!((sent.status, sent.wr_id), (WcStatus::Success, 1));
    drop(sbuf);
    assert_eq!(receives.available(), 3);
    drop((received, decoded));
    assert_eq!(
        receives.available(),
        4,
        "the last Bytes returned the buffer"
    );
    assert_eq!(tx.pool.stats().in_use(), 0);
    assert_eq!(rx.pool.stats().in_use(), 0);
}
