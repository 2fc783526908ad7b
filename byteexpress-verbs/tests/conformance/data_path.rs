//! Successful operations: SEND, SEND_WITH_IMM, WRITE, WRITE_WITH_IMM, READ; SGE lists; inline;
//! selective signaling; completion order; message sizes around the MTU and the receive buffer.

use std::time::Duration;

use byteexpress_verbs::{ConnectAttr, QpCap, RecvWr, SendWr, WcOpcode, WcStatus, WrOp};

use crate::T;
use crate::common::*;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i as u8).wrapping_mul(13)) ^ (i >> 8) as u8)
        .collect()
}

#[test]
fn sends_arrive_in_order_with_length_imm_and_wr_id() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    for i in 0..4u64 {
        b.post_recv(100 + i, (i as usize) * 1024, 1024);
    }
    for i in 0..4u64 {
        let len = 10 + i as u32 * 100;
        a.write(i as usize * 1024, &vec![i as u8 + 1; len as usize]);
        let op = if i % 2 == 1 {
            WrOp::SendWithImm(0xabc0 + i as u32)
        } else {
            WrOp::Send
        };
        a.send(i, op, i as usize * 1024, len, true).unwrap();
    }
    let rx = poll_n(&b.recv_cq, 4, T);
    assert_eq!(rx.len(), 4);
    for (i, wc) in rx.iter().enumerate() {
        let len = 10 + i as u32 * 100;
        assert_eq!(wc.wr_id, 100 + i as u64);
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.opcode, WcOpcode::Recv);
        assert_eq!(wc.byte_len, len);
        assert_eq!(wc.qp_num, b.qp.qp_num());
        assert_eq!(wc.imm, (i % 2 == 1).then_some(0xabc0 + i as u32));
        assert_eq!(
            b.read(i * 1024, len as usize),
            vec![i as u8 + 1; len as usize]
        );
    }
    let tx = poll_n(&a.send_cq, 4, T);
    let ids: Vec<u64> = tx.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [0, 1, 2, 3]);
    assert!(tx.iter().all(|w| w.status == WcStatus::Success
        && w.opcode == WcOpcode::Send
        && w.qp_num == a.qp.qp_num()));
}

#[test]
fn unsignaled_successful_sends_produce_no_completion() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    for i in 0..3 {
        b.post_recv(i, 0, 64);
    }
    a.send(1, WrOp::Send, 0, 8, false).unwrap();
    a.send(2, WrOp::Send, 0, 8, true).unwrap();
    a.send(3, WrOp::Send, 0, 8, false).unwrap();
    assert_eq!(poll_n(&b.recv_cq, 3, T).len(), 3);
    let tx = poll_for(&a.send_cq, Duration::from_millis(50));
    assert_eq!(tx.len(), 1, "{tx:?}");
    assert_eq!(tx[0].wr_id, 2);
}

#[test]
fn inline_send_copies_at_post_time() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    a.write(0, b"inline!!");
    let sge = [a.sge(0, 8)];
    a.qp.post_send(&SendWr {
        wr_id: 5,
        op: WrOp::Send,
        sg_list: &sge,
        signaled: true,
        inline: true,
    })
    .unwrap();
    // The source may change once posted: an RNR-delayed inline send still carries the old bytes.
    a.write(0, b"changed!");
    b.post_recv(9, 0, 64);
    let rx = poll_n(&b.recv_cq, 1, T);
    assert_eq!((rx[0].status, rx[0].byte_len), (WcStatus::Success, 8));
    assert_eq!(b.read(0, 8), b"inline!!");
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].wr_id, 5);
}

/// The CPU reads inline data at post time: the lkey is not checked, but the bytes must lie in
/// memory registered on the device (anything else could be unmapped), else `InvalidArgument`.
#[test]
fn inline_data_needs_registered_memory_but_no_valid_lkey() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    a.write(100, b"no key needed");
    let sge = [byteexpress_verbs::Sge {
        addr: a.mr.addr() + 100,
        len: 13,
        lkey: a.mr.lkey() ^ 0x5a5a,
    }];
    b.post_recv(1, 0, 64);
    a.qp.post_send(&SendWr {
        wr_id: 1,
        op: WrOp::Send,
        sg_list: &sge,
        signaled: true,
        inline: true,
    })
    .unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::Success);
    assert_eq!(poll_n(&b.recv_cq, 1, T)[0].byte_len, 13);
    assert_eq!(b.read(0, 13), b"no key needed");

    let stack = *b"not registered";
    let sge = [byteexpress_verbs::Sge {
        addr: stack.as_ptr() as u64,
        len: stack.len() as u32,
        lkey: a.mr.lkey(),
    }];
    let err = a.qp.post_send(&SendWr {
        wr_id: 2,
        op: WrOp::Send,
        sg_list: &sge,
        signaled: true,
        inline: true,
    });
    assert!(
        matches!(err, Err(byteexpress_verbs::Error::InvalidArgument(_))),
        "{err:?}"
    );
}

#[test]
fn rdma_write_read_and_write_with_imm_move_the_bytes() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    a.write(0, b"written by a");
    let write = WrOp::Write {
        remote_addr: b.mr.addr() + 500,
        rkey: b.mr.rkey(),
    };
    a.send(1, write, 0, 12, true).unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(
        (tx[0].wr_id, tx[0].status, tx[0].opcode),
        (1, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(b.read(500, 12), b"written by a");
    assert!(
        poll_for(&b.recv_cq, Duration::from_millis(20)).is_empty(),
        "a plain WRITE consumes no receive and makes no completion at the target"
    );

    b.write(1000, b"read me");
    let read = WrOp::Read {
        remote_addr: b.mr.addr() + 1000,
        rkey: b.mr.rkey(),
    };
    a.send(2, read, 2000, 7, true).unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(
        (tx[0].status, tx[0].opcode, tx[0].byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 7)
    );
    assert_eq!(a.read(2000, 7), b"read me");

    b.post_recv(50, 0, 16);
    let write_imm = WrOp::WriteWithImm {
        remote_addr: b.mr.addr() + 3000,
        rkey: b.mr.rkey(),
        imm: 42,
    };
    a.send(3, write_imm, 0, 12, true).unwrap();
    let rx = poll_n(&b.recv_cq, 1, T);
    assert_eq!(
        (
            rx[0].wr_id,
            rx[0].status,
            rx[0].opcode,
            rx[0].imm,
            rx[0].byte_len
        ),
        (
            50,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            Some(42),
            12
        )
    );
    assert_eq!(b.read(3000, 12), b"written by a");
    assert_eq!(
        b.read(0, 12),
        vec![0; 12],
        "the receive buffer is not written"
    );
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(
        (tx[0].wr_id, tx[0].status, tx[0].opcode),
        (3, WcStatus::Success, WcOpcode::RdmaWrite)
    );
}

#[test]
fn sge_lists_gather_on_send_and_scatter_on_receive() {
    let cap = QpCap {
        max_send_sge: 3,
        max_recv_sge: 3,
        ..QpCap::default()
    };
    let (a, b) = pair(cap, ConnectAttr::default());
    let msg = pattern(7, 300);
    // Gather from three pieces far apart.
    a.write(0, &msg[..100]);
    a.write(5000, &msg[100..101]);
    a.write(9000, &msg[101..]);
    let src = [a.sge(0, 100), a.sge(5000, 1), a.sge(9000, 199)];
    // Scatter into two pieces: the first ends in the middle of the second source piece.
    let dst = [b.sge(100, 150), b.sge(7000, 200)];
    b.qp.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: &dst,
    })
    .unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 1,
        op: WrOp::Send,
        sg_list: &src,
        signaled: true,
        inline: false,
    })
    .unwrap();
    let rx = poll_n(&b.recv_cq, 1, T);
    assert_eq!((rx[0].status, rx[0].byte_len), (WcStatus::Success, 300));
    assert_eq!(b.read(100, 150), msg[..150]);
    assert_eq!(b.read(7000, 150), msg[150..]);
    assert_eq!(b.read(7150, 50), vec![0; 50], "nothing beyond the message");

    // WRITE gathers too, and READ scatters into local pieces.
    a.qp.post_send(&SendWr {
        wr_id: 2,
        op: WrOp::Write {
            remote_addr: b.mr.addr() + 20000,
            rkey: b.mr.rkey(),
        },
        sg_list: &src,
        signaled: true,
        inline: false,
    })
    .unwrap();
    assert_eq!(poll_n(&a.send_cq, 2, T).len(), 2);
    assert_eq!(b.read(20000, 300), msg);
    let into = [a.sge(30000, 10), a.sge(40000, 290)];
    a.qp.post_send(&SendWr {
        wr_id: 3,
        op: WrOp::Read {
            remote_addr: b.mr.addr() + 20000,
            rkey: b.mr.rkey(),
        },
        sg_list: &into,
        signaled: true,
        inline: false,
    })
    .unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!((tx[0].status, tx[0].byte_len), (WcStatus::Success, 300));
    assert_eq!(a.read(30000, 10), msg[..10]);
    assert_eq!(a.read(40000, 290), msg[10..]);
}

#[test]
fn completions_come_in_post_order_across_operation_kinds() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    for i in 0..3 {
        b.post_recv(10 + i, i as usize * 64, 64);
    }
    let w = |off: u64| WrOp::Write {
        remote_addr: b.mr.addr() + off,
        rkey: b.mr.rkey(),
    };
    let ops = [
        WrOp::Send,
        w(4096),
        WrOp::Read {
            remote_addr: b.mr.addr() + 8192,
            rkey: b.mr.rkey(),
        },
        WrOp::SendWithImm(5),
        w(12288),
        WrOp::WriteWithImm {
            remote_addr: b.mr.addr() + 16384,
            rkey: b.mr.rkey(),
            imm: 6,
        },
        WrOp::Read {
            remote_addr: b.mr.addr() + 8192,
            rkey: b.mr.rkey(),
        },
    ];
    for (i, op) in ops.iter().enumerate() {
        a.send(i as u64, *op, 1024 * (i + 1), 16, true).unwrap();
    }
    let tx = poll_n(&a.send_cq, ops.len(), T);
    assert_eq!(
        tx.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (0..ops.len() as u64)
            .map(|i| (i, WcStatus::Success))
            .collect::<Vec<_>>()
    );
    let rx = poll_n(&b.recv_cq, 3, T);
    assert_eq!(
        rx.iter().map(|w| (w.wr_id, w.imm)).collect::<Vec<_>>(),
        [(10, None), (11, Some(5)), (12, Some(6))]
    );
}

/// Lengths 0, 1, MTU−1, MTU, MTU+1, 2·MTU+1 and 3·MTU by SEND, WRITE and READ, each checked
/// byte for byte (multi-packet messages are where segmentation bugs live).
#[test]
fn sizes_around_the_mtu_arrive_intact() {
    let mtu = provider().query().active_mtu.min(4096) as usize;
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let sizes = [0, 1, mtu - 1, mtu, mtu + 1, 2 * mtu + 1, 3 * mtu];
    for (k, &len) in sizes.iter().enumerate() {
        let msg = pattern(k as u8, len);
        a.write(0, &msg);
        b.post_recv(k as u64, 16384, 3 * 4096);
        a.send(k as u64, WrOp::Send, 0, len as u32, true).unwrap();
        let rx = poll_n(&b.recv_cq, 1, T);
        assert_eq!(
            (rx[0].status, rx[0].byte_len),
            (WcStatus::Success, len as u32),
            "SEND {len}"
        );
        assert_eq!(b.read(16384, len), msg, "SEND {len}");

        let write = WrOp::Write {
            remote_addr: b.mr.addr() + 32768,
            rkey: b.mr.rkey(),
        };
        a.send(100 + k as u64, write, 0, len as u32, true).unwrap();
        let read = WrOp::Read {
            remote_addr: b.mr.addr() + 32768,
            rkey: b.mr.rkey(),
        };
        a.send(200 + k as u64, read, 49152, len as u32, true)
            .unwrap();
        let tx = poll_n(&a.send_cq, 3, T);
        assert!(
            tx.iter().all(|w| w.status == WcStatus::Success),
            "{len}: {tx:?}"
        );
        assert_eq!(tx[2].byte_len, len as u32, "READ {len}");
        assert_eq!(b.read(32768, len), msg, "WRITE {len}");
        assert_eq!(a.read(49152, len), msg, "READ {len}");
    }
}

#[test]
fn messages_of_the_receive_buffer_size_and_one_less_fit() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    const BUF: usize = 3000;
    for (i, len) in [BUF - 1, BUF].into_iter().enumerate() {
        let msg = pattern(i as u8 + 3, len);
        a.write(0, &msg);
        b.write(8192, &[0xee; BUF + 1]);
        b.post_recv(i as u64, 8192, BUF as u32);
        a.send(i as u64, WrOp::Send, 0, len as u32, false).unwrap();
        let rx = poll_n(&b.recv_cq, 1, T);
        assert_eq!(
            (rx[0].status, rx[0].byte_len),
            (WcStatus::Success, len as u32)
        );
        assert_eq!(b.read(8192, len), msg);
        assert_eq!(
            b.read(8192 + BUF, 1),
            [0xee],
            "the byte after the buffer is untouched"
        );
    }
}
