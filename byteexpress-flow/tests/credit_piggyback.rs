//! Unit tests of piggybacked returns, the update threshold and the update slot, grant 1, 2, 8.

use byteexpress_flow::credit::{CreditConfig, CreditError, Credits, MsgKind, Piggyback};

fn link(grant: u32) -> Credits {
    Credits::new(CreditConfig::new(grant).unwrap())
}

const NONE: Piggyback = Piggyback {
    credits: 0,
    slot_return: false,
};

/// `rx` receives `n` data messages and re-posts them, so `n` returns are pending.
fn receive_and_repost(rx: &mut Credits, n: u32) {
    for _ in 0..n {
        rx.on_receive(MsgKind::Data, NONE).unwrap();
        rx.on_reposted(MsgKind::Data).unwrap();
    }
}

#[test]
fn zero_grant_is_rejected() {
    assert_eq!(CreditConfig::new(0), Err(CreditError::ZeroGrant));
}

#[test]
fn threshold_is_half_the_grant_but_at_least_one() {
    let t = |g| CreditConfig::new(g).unwrap().update_threshold();
    assert_eq!((t(1), t(2), t(8)), (1, 1, 4));
    assert_eq!(CreditConfig::new(8).unwrap().posted_receives(), 9);
}

#[test]
fn sends_stop_at_zero_credits_and_count_blocks() {
    for grant in [1, 2, 8] {
        let mut c = link(grant);
        for _ in 0..grant {
            assert!(c.can_send());
            assert_eq!(c.try_send_data(), Some(NONE));
        }
        assert!(!c.can_send());
        assert_eq!(c.try_send_data(), None);
        assert_eq!(c.stats().blocked, 1);
        assert_eq!(c.stats().data_sent, u64::from(grant));
    }
}

#[test]
fn bulk_holds_at_most_the_update_threshold_and_leaves_the_rest_to_small_messages() {
    for (grant, bulk) in [(1, 1), (2, 1), (8, 4), (9, 4)] {
        let mut c = link(grant);
        assert_eq!(c.config().latency_reserve(), grant - bulk);
        for _ in 0..bulk {
            assert!(c.can_send_bulk());
            c.try_send_data().unwrap();
        }
        assert!(!c.can_send_bulk(), "grant {grant}: bulk took {bulk}");
        assert_eq!(
            c.can_send(),
            grant > bulk,
            "grant {grant}: the reserve is left"
        );
    }
}

#[test]
fn bulk_alone_at_its_cap_unblocks_through_an_explicit_update() {
    // Sender A sends only bulk; B, with nothing to send, must still return the credits.
    let (mut a, mut b) = (link(8), link(8));
    while a.can_send_bulk() {
        a.try_send_data().unwrap();
        b.on_receive(MsgKind::Data, NONE).unwrap();
        b.on_reposted(MsgKind::Data).unwrap();
    }
    let pb = b.poll_update().expect("B owes the update threshold");
    a.on_receive(MsgKind::CreditUpdate, pb).unwrap();
    a.on_reposted(MsgKind::CreditUpdate).unwrap();
    assert!(a.can_send_bulk(), "credits back: {}", a.send_credits());
}

#[test]
fn data_carries_all_pending_returns_and_clears_them() {
    let mut c = link(8);
    receive_and_repost(&mut c, 3);
    assert_eq!(c.pending_returns(), 3);
    let pb = c.try_send_data().unwrap();
    assert_eq!(pb.credits, 3);
    assert_eq!(c.pending_returns(), 0);
    assert_eq!(c.try_send_data().unwrap().credits, 0);
    assert_eq!(c.stats().credits_returned, 3);
    assert!(
        format!("{c:?}").contains("credits_returned: 3"),
        "Debug shows the derived counters: {c:?}"
    );
}

#[test]
fn received_but_unreposted_buffers_are_not_returned() {
    let mut c = link(2);
    c.on_receive(MsgKind::Data, NONE).unwrap();
    assert_eq!(c.try_send_data().unwrap().credits, 0);
    assert_eq!(c.poll_update(), None);
}

#[test]
fn update_is_sent_only_at_the_threshold() {
    for (grant, threshold) in [(1, 1), (2, 1), (8, 4)] {
        let mut c = link(grant);
        receive_and_repost(&mut c, threshold - 1);
        assert_eq!(c.poll_update(), None, "grant {grant}: below threshold");
        receive_and_repost(&mut c, 1);
        let pb = c.poll_update().expect("at threshold");
        assert_eq!(pb.credits, threshold, "grant {grant}");
        assert!(c.update_outstanding());
        assert_eq!(c.pending_returns(), 0);
        assert_eq!(c.stats().updates_sent, 1);
    }
}

#[test]
fn only_one_update_is_outstanding_until_the_slot_returns() {
    let mut c = link(2);
    receive_and_repost(&mut c, 1);
    assert!(c.poll_update().is_some());
    receive_and_repost(&mut c, 1);
    assert_eq!(c.poll_update(), None, "slot busy");
    // Pending returns still ride on data while the slot is busy.
    assert_eq!(c.try_send_data().unwrap().credits, 1);
    receive_and_repost(&mut c, 1);
    // The peer's next message returns the slot; the update may go again.
    let back = Piggyback {
        credits: 1,
        slot_return: true,
    };
    c.on_receive(MsgKind::Data, back).unwrap();
    assert!(!c.update_outstanding());
    assert_eq!(c.poll_update().unwrap().credits, 1);
}

#[test]
fn update_credits_wait_for_the_slot_repost_and_the_flag_rides_the_next_message() {
    let mut c = link(2);
    c.try_send_data().unwrap();
    c.try_send_data().unwrap();
    let update = Piggyback {
        credits: 2,
        slot_return: false,
    };
    c.on_receive(MsgKind::CreditUpdate, update).unwrap();
    assert_eq!((c.send_credits(), c.escrowed_credits()), (0, 2));
    assert!(!c.slot_return_owed());
    c.on_reposted(MsgKind::CreditUpdate).unwrap();
    assert_eq!((c.send_credits(), c.escrowed_credits()), (2, 0));
    assert!(c.slot_return_owed());
    let pb = c.try_send_data().unwrap();
    assert!(pb.slot_return);
    assert!(!c.try_send_data().unwrap().slot_return, "flag sent once");
}

#[test]
fn owed_flag_rides_an_update_too() {
    let mut c = link(1);
    c.try_send_data().unwrap();
    let update = Piggyback {
        credits: 1,
        slot_return: false,
    };
    c.on_receive(MsgKind::CreditUpdate, update).unwrap();
    c.on_reposted(MsgKind::CreditUpdate).unwrap();
    receive_and_repost(&mut c, 1);
    let pb = c.poll_update().unwrap();
    assert_eq!(
        pb,
        Piggyback {
            credits: 1,
            slot_return: true
        }
    );
}

#[test]
fn grant_one_ping_pong_returns_the_credit_each_way() {
    let (mut a, mut b) = (link(1), link(1));
    for round in 0..5 {
        let pb = a.try_send_data().unwrap();
        assert!(!a.can_send());
        // From round 1 on, a's request returns the credit b spent on its previous reply.
        assert_eq!(pb.credits, u32::from(round > 0));
        b.on_receive(MsgKind::Data, pb).unwrap();
        b.on_reposted(MsgKind::Data).unwrap();
        assert!(b.can_send());
        let reply = b.try_send_data().unwrap();
        assert_eq!(reply.credits, 1);
        a.on_receive(MsgKind::Data, reply).unwrap();
        a.on_reposted(MsgKind::Data).unwrap();
        assert!(a.can_send());
    }
}

#[test]
fn protocol_violations_are_typed_errors() {
    let mut c = link(1);
    let one = Piggyback {
        credits: 1,
        slot_return: false,
    };
    assert_eq!(
        c.on_receive(MsgKind::Data, one),
        Err(CreditError::TooManyCredits {
            returned: 1,
            outstanding: 0
        })
    );
    let flag = Piggyback {
        credits: 0,
        slot_return: true,
    };
    assert_eq!(
        c.on_receive(MsgKind::Data, flag),
        Err(CreditError::UnexpectedSlotReturn)
    );
    assert_eq!(
        c.on_receive(MsgKind::CreditUpdate, NONE),
        Err(CreditError::EmptyUpdate)
    );
    c.on_receive(MsgKind::Data, NONE).unwrap();
    assert_eq!(
        c.on_receive(MsgKind::Data, NONE),
        Err(CreditError::DataOverrun)
    );
    c.try_send_data().unwrap();
    c.on_receive(MsgKind::CreditUpdate, one).unwrap();
    assert_eq!(
        c.on_receive(MsgKind::CreditUpdate, one),
        Err(CreditError::UpdateSlotBusy)
    );
    assert_eq!(
        c.on_reposted(MsgKind::Data)
            .and(c.on_reposted(MsgKind::Data)),
        Err(CreditError::NothingToRepost(MsgKind::Data))
    );
    let huge = Piggyback {
        credits: u32::MAX,
        slot_return: false,
    };
    assert!(matches!(
        c.on_receive(MsgKind::Data, huge),
        Err(CreditError::DataOverrun | CreditError::TooManyCredits { .. })
    ));
    assert!(c.send_credits() <= 1);
}
