//! Soft provider across two processes: this test binary re-executes itself as the peer
//! (`child_entry`, selected by an environment variable); the two exchange Endpoint and
//! DeviceInfo bytes over a TCP loopback socket. (A killed peer process is a conformance case,
//! `conformance/cross_process.rs`, run on both providers.)

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use byteexpress_verbs::{ConnectAttr, DeviceInfo, QpCap, WcOpcode, WcStatus, WrOp};
use common::peer::{self, get, handshake, put};
use common::*;

const T: Duration = Duration::from_secs(10);
const SLOT: usize = 64 * 1024;
const ROUNDS: usize = 1000;
const SIZES: [u32; 10] = [0, 1, 8, 63, 64, 1000, 4095, 4096, 4097, 65536];

fn pattern(round: usize, dir: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (round as u8).wrapping_mul(31) ^ (j as u8).wrapping_mul(7) ^ dir)
        .collect()
}

/// Starts this binary as the peer in `role`; returns it and the TCP control connection.
#[test]
fn child_entry() {
    let Some((role, mut s)) = peer::peer_role() else {
        return;
    };
    match role.as_str() {
        "pingpong" => child_pingpong(&mut s),
        other => panic!("unknown role {other}"),
    }
}

fn child_pingpong(s: &mut TcpStream) {
    let ctx = soft();
    // Probe: the parent sends a nonce over TCP, we accept it, the parent probes our device.
    put(s, &ctx.device_info().to_bytes());
    let nonce = u64::from_le_bytes(get(s).try_into().unwrap());
    ctx.expect_probe(nonce);
    put(s, b"expecting");
    assert_eq!(get(s), b"probed");

    let me = soft_side(QpCap::default(), 2 * SLOT);
    handshake(s, &me, ConnectAttr::default(), || {
        me.post_recv(0, 0, SLOT as u32)
    });
    for i in 0..ROUNDS {
        let rx = poll_n(&me.recv_cq, 1, T);
        assert_eq!(rx.len(), 1, "round {i}: no request");
        let len = SIZES[i % SIZES.len()] as usize;
        assert_eq!(
            (rx[0].wr_id, rx[0].status, rx[0].byte_len as usize),
            (i as u64, WcStatus::Success, len)
        );
        assert_eq!(
            me.read(0, len),
            pattern(i, 0x55, len),
            "round {i}: request bytes"
        );
        me.post_recv(i as u64 + 1, 0, SLOT as u32);
        let rlen = SIZES[(i + 3) % SIZES.len()];
        me.write(SLOT, &pattern(i, 0xaa, rlen as usize));
        me.send(i as u64, WrOp::SendWithImm(i as u32), SLOT, rlen, true)
            .unwrap();
        let tx = poll_n(&me.send_cq, 1, T);
        assert_eq!((tx[0].wr_id, tx[0].status), (i as u64, WcStatus::Success));
    }
    put(s, b"done");
}

#[test]
fn ping_pong_1000_sends_of_various_sizes_between_two_processes() {
    let (mut child, mut s) = peer::spawn_peer("child_entry", "pingpong", T);
    let ctx = soft();

    let peer_dev = DeviceInfo::from_bytes(&get(&mut s)).unwrap();
    let nonce: u64 = 0x5eed_0000_0000_0001 ^ u64::from(std::process::id());
    assert!(
        !ctx.probe(&peer_dev, nonce).unwrap(),
        "a nonce the peer does not expect is refused"
    );
    put(&mut s, &nonce.to_le_bytes());
    assert_eq!(get(&mut s), b"expecting");
    assert!(
        ctx.probe(&peer_dev, nonce).unwrap(),
        "the peer device answers its nonce"
    );
    assert!(
        !ctx.probe(&peer_dev, nonce).unwrap(),
        "a nonce is good for one probe"
    );
    put(&mut s, b"probed");

    let me = soft_side(QpCap::default(), 2 * SLOT);
    handshake(&mut s, &me, ConnectAttr::default(), || {});
    let t0 = Instant::now();
    for i in 0..ROUNDS {
        me.post_recv(i as u64, 0, SLOT as u32);
        let len = SIZES[i % SIZES.len()];
        me.write(SLOT, &pattern(i, 0x55, len as usize));
        me.send(i as u64, WrOp::Send, SLOT, len, true).unwrap();
        let tx = poll_n(&me.send_cq, 1, T);
        assert_eq!(
            (tx[0].wr_id, tx[0].status),
            (i as u64, WcStatus::Success),
            "round {i}"
        );
        let rx = poll_n(&me.recv_cq, 1, T);
        assert_eq!(rx.len(), 1, "round {i}: no reply");
        let rlen = SIZES[(i + 3) % SIZES.len()] as usize;
        assert_eq!(
            (
                rx[0].wr_id,
                rx[0].status,
                rx[0].opcode,
                rx[0].byte_len as usize,
                rx[0].imm
            ),
            (
                i as u64,
                WcStatus::Success,
                WcOpcode::Recv,
                rlen,
                Some(i as u32)
            ),
            "round {i}"
        );
        assert_eq!(
            me.read(0, rlen),
            pattern(i, 0xaa, rlen),
            "round {i}: reply bytes"
        );
    }
    eprintln!("{ROUNDS} round trips in {:?}", t0.elapsed());
    assert_eq!(get(&mut s), b"done");
    assert!(child.wait().unwrap().success(), "the child's checks passed");
}
