//! A live peer is not dropped for a burst of registrations (review of issue 22).
//!
//! Every MR a PD registers is announced to the peers of its QPs over their control sockets.
//! A socket holds some 280 records; announcements that found it full dropped the peer at once,
//! so a burst of a few hundred registrations (a pool growing, MRs split over a large region)
//! outran a live peer's progress thread and killed its QP: the next SEND failed
//! `RETRY_EXC_ERR`. They now wait for room, as long as a live peer needs.

mod common;

use std::time::Duration;

use byteexpress_verbs::{Access, ConnectAttr, QpCap, WcStatus, WrOp};
use common::*;

const T: Duration = Duration::from_secs(10);

#[test]
fn a_live_peer_keeps_its_qp_through_three_thousand_registrations_announced_to_it() {
    let (a, b) = soft_pair(QpCap::default(), ConnectAttr::default());
    const N: usize = 3000;
    let region = a.pd.alloc_shared(N * 4096).unwrap();
    let mrs: Vec<_> = (0..N)
        .map(|i| {
            // REMOTE_READ: announced to the peer (local-only memory would not be).
            a.pd.reg_shared(
                &region,
                i * 4096,
                4096,
                Access::LOCAL_WRITE | Access::REMOTE_READ,
            )
            .unwrap()
        })
        .collect();
    for i in 0..5u64 {
        b.post_recv(i, 0, 64);
        a.write(0, &i.to_le_bytes());
        a.send(i, WrOp::Send, 0, 8, true).unwrap();
        let tx = poll_n(&a.send_cq, 1, T);
        assert_eq!(tx.len(), 1, "send {i} completes");
        assert_eq!(
            tx[0].status,
            WcStatus::Success,
            "send {i}: the live peer was dropped"
        );
        let rx = poll_n(&b.recv_cq, 1, T);
        assert_eq!((rx[0].wr_id, rx[0].status), (i, WcStatus::Success));
        assert_eq!(b.read(0, 8), i.to_le_bytes());
    }
    drop(mrs);
}
