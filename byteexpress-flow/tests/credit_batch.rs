//! A batch of data messages (`can_send_more`, `try_send_data_batch`) is accounted for exactly
//! as the same messages sent one by one, from any reachable state of a link.

use byteexpress_flow::credit::{CreditConfig, Credits, MsgKind, Piggyback};
use proptest::prelude::*;

/// One step of a two-ended link whose messages are delivered at once.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// End `0` or `1` sends a data message, if it has a credit.
    Send(usize),
    /// End `0` or `1` re-posts a data buffer it received, if one awaits re-posting.
    RepostData(usize),
    /// End `0` or `1` re-posts the update slot, if it holds an update.
    RepostSlot(usize),
    /// End `0` or `1` sends an explicit update, if one is due.
    Update(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let end = 0..2usize;
    prop_oneof![
        4 => end.clone().prop_map(Op::Send),
        3 => end.clone().prop_map(Op::RepostData),
        1 => end.clone().prop_map(Op::RepostSlot),
        1 => end.prop_map(Op::Update),
    ]
}

/// Both ends after `ops` (each op that does not apply is skipped).
fn link(grant: u32, ops: &[Op]) -> [Credits; 2] {
    let cfg = CreditConfig::new(grant).unwrap();
    let mut ends = [Credits::new(cfg), Credits::new(cfg)];
    for &op in ops {
        match op {
            Op::Send(s) => {
                if let Some(pb) = ends[s].try_send_data() {
                    ends[1 - s].on_receive(MsgKind::Data, pb).unwrap();
                }
            }
            Op::RepostData(s) => {
                let _ = ends[s].on_reposted(MsgKind::Data);
            }
            Op::RepostSlot(s) => {
                let _ = ends[s].on_reposted(MsgKind::CreditUpdate);
            }
            Op::Update(s) => {
                if let Some(pb) = ends[s].poll_update() {
                    ends[1 - s].on_receive(MsgKind::CreditUpdate, pb).unwrap();
                }
            }
        }
    }
    ends
}

proptest! {
    #[test]
    fn a_batch_is_the_same_messages_sent_one_by_one(
        grant in 1u32..10,
        ops in proptest::collection::vec(op(), 0..80),
        n in 0u32..12,
    ) {
        let [end, _] = link(grant, &ops);

        // The gate: `can_send_more(k)` says whether a (k + 1)-th message of the batch may go,
        // as `can_send` would after k single sends; the same for bulk.
        let mut one_by_one = end.clone();
        for k in 0..=n {
            prop_assert_eq!(end.can_send_more(k), one_by_one.can_send());
            prop_assert_eq!(end.can_send_bulk_more(k), one_by_one.can_send_bulk());
            let _ = one_by_one.try_send_data();
        }

        // The batch: the first message's piggyback, the rest empty, and the same state after.
        let mut batched = end.clone();
        let got = batched.try_send_data_batch(n);
        let mut singles = end.clone();
        let enough = n > 0 && end.send_credits() >= n;
        if enough {
            let first = singles.try_send_data();
            prop_assert_eq!(got, first);
            for _ in 1..n {
                prop_assert_eq!(singles.try_send_data(), Some(Piggyback::default()));
            }
            prop_assert_eq!(format!("{batched:?}"), format!("{singles:?}"));
        } else {
            // Nothing taken, nothing owed cleared; a refused batch of at least one counts one
            // block.
            prop_assert_eq!(got, None);
            let mut unchanged = end.stats();
            unchanged.blocked += u64::from(n > 0);
            prop_assert_eq!(batched.stats(), unchanged);
            let state = |c: &Credits| {
                (
                    c.send_credits(),
                    c.escrowed_credits(),
                    c.pending_returns(),
                    c.peer_credits(),
                    c.update_outstanding(),
                    c.slot_return_owed(),
                )
            };
            prop_assert_eq!(state(&batched), state(&end));
        }
    }
}
