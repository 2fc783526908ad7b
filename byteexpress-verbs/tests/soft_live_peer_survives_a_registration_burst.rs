//! A live peer is not dropped for a burst of registrations (review of issue 22).
//!
//! Every MR a PD registers is announced to the peers of its QPs over their control sockets.
//! Announcements that found a peer's socket full dropped that peer at once, so a burst of a few
//! hundred registrations (a pool growing, MRs split over a large region) that outran a live
//! peer's progress thread killed its QP: its next SEND failed `RETRY_EXC_ERR`. They now wait for
//! room up to the control timeout. To make the peer slow for sure, it is another process,
//! stopped (`SIGSTOP`) for the burst's first half second and then resumed.
//!
//! The peer is this test binary started again (`child_entry`, role `receiver`).

mod common;

use std::net::TcpStream;
use std::time::Duration;

use byteexpress_verbs::{Access, ConnectAttr, QpCap, WcStatus, WrOp};
use common::peer::{self, get, handshake, put};
use common::*;

const T: Duration = Duration::from_secs(10);
const SENDS: u64 = 5;

/// The peer process's entry point (not a check of its own: it returns at once in a normal run).
#[test]
fn child_entry() {
    let Some((role, mut s)) = peer::peer_role() else {
        return;
    };
    assert_eq!(role, "receiver");
    child_receiver(&mut s);
}

/// Connects, posts receives, and reports each message it gets.
fn child_receiver(s: &mut TcpStream) {
    let me = side(QpCap::default(), 4096);
    handshake(s, &me, ConnectAttr::default(), || {
        for i in 0..SENDS {
            me.post_recv(i, 0, 64);
        }
    });
    let rx = poll_n(&me.recv_cq, SENDS as usize, T);
    let got: Vec<String> = rx
        .iter()
        .map(|w| format!("{}:{:?}", w.wr_id, w.status))
        .collect();
    put(s, got.join(",").as_bytes());
    assert_eq!(get(s), b"done");
}

#[test]
fn a_peer_stopped_during_a_burst_of_registrations_announced_to_it_keeps_its_qp() {
    if peer::peer_role().is_some() {
        return;
    }
    let (mut child, mut s) = peer::spawn_peer("child_entry", "receiver", T);
    let me = side(QpCap::default(), 4096);
    handshake(&mut s, &me, ConnectAttr::default(), || {});
    const N: usize = 3000;
    let region = me.pd.alloc_shared(N * 4096).unwrap();
    let pid = child.id() as libc::pid_t;
    // SAFETY: signals to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let resume = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    });
    // REMOTE_READ: announced to the peer (local-only memory would not be). The socket fills
    // within the first few hundred while the peer is stopped.
    let mrs: Vec<_> = (0..N)
        .map(|i| {
            me.pd
                .reg_shared(
                    &region,
                    i * 4096,
                    4096,
                    Access::LOCAL_WRITE | Access::REMOTE_READ,
                )
                .unwrap()
        })
        .collect();
    resume.join().unwrap();
    for i in 0..SENDS {
        me.write(0, &i.to_le_bytes());
        me.send(i, WrOp::Send, 0, 8, true).unwrap();
        let tx = poll_n(&me.send_cq, 1, T);
        assert_eq!(tx.len(), 1, "send {i} completes");
        assert_eq!(
            tx[0].status,
            WcStatus::Success,
            "send {i}: the live peer was dropped"
        );
    }
    let got = String::from_utf8(get(&mut s)).unwrap();
    let want: Vec<String> = (0..SENDS).map(|i| format!("{i}:Success")).collect();
    assert_eq!(got, want.join(","));
    put(&mut s, b"done");
    assert!(child.wait().unwrap().success());
    drop(mrs);
}
