//! Model-based proptests of the credit protocol: two endpoints, posted receive buffers, FIFO
//! reliable in-order channels (RC), random interleavings, then a fair scheduler.

use std::collections::VecDeque;

use byteexpress_flow::credit::{CreditConfig, CreditError, Credits, MsgKind, Piggyback};
use proptest::prelude::*;

/// A message on the wire: its kind, header piggyback and (for data) the sender's sequence id.
#[derive(Debug, Clone)]
struct Msg {
    kind: MsgKind,
    pb: Piggyback,
    id: Option<u64>,
}

/// One endpoint: its credit machine, its send queue and its posted receive buffers.
#[derive(Debug)]
struct Side {
    credits: Credits,
    queue: VecDeque<u64>,
    next_id: u64,
    /// Posted data receive buffers (at most grant).
    free_data: u32,
    /// The update slot receive is posted.
    free_slot: bool,
    /// Received buffers awaiting the application's re-post, by kind.
    consumed: Vec<MsgKind>,
    /// Ids of data messages received from the peer, in arrival order.
    received: Vec<u64>,
}

#[derive(Debug)]
struct Model {
    grant: u32,
    sides: [Side; 2],
    /// `wires[i]`: in flight from side i to side 1 - i, FIFO.
    wires: [VecDeque<Msg>; 2],
}

#[derive(Debug, Clone, Copy)]
enum Event {
    Enqueue(usize),
    SendData(usize),
    Deliver(usize),
    Repost(usize, usize),
    PollUpdate(usize),
}

fn event() -> impl Strategy<Value = Event> {
    let side = 0usize..2;
    prop_oneof![
        side.clone().prop_map(Event::Enqueue),
        side.clone().prop_map(Event::SendData),
        side.clone().prop_map(Event::Deliver),
        (side.clone(), 0usize..64).prop_map(|(s, i)| Event::Repost(s, i)),
        side.prop_map(Event::PollUpdate),
    ]
}

impl Model {
    fn new(grant: u32) -> Self {
        let cfg = CreditConfig::new(grant).expect("grant >= 1");
        let side = || Side {
            credits: Credits::new(cfg),
            queue: VecDeque::new(),
            next_id: 0,
            free_data: grant,
            free_slot: true,
            consumed: Vec::new(),
            received: Vec::new(),
        };
        Self {
            grant,
            sides: [side(), side()],
            wires: [VecDeque::new(), VecDeque::new()],
        }
    }

    fn step(&mut self, ev: Event) {
        match ev {
            Event::Enqueue(s) => {
                let side = &mut self.sides[s];
                side.queue.push_back(side.next_id);
                side.next_id += 1;
            }
            Event::SendData(s) => {
                self.send_data(s);
            }
            Event::Deliver(r) => {
                self.deliver(r);
            }
            Event::Repost(s, i) => {
                self.repost(s, i);
            }
            Event::PollUpdate(s) => {
                self.poll_update(s);
            }
        }
        self.check_invariants();
    }

    fn send_data(&mut self, s: usize) -> bool {
        let side = &mut self.sides[s];
        if side.queue.is_empty() {
            return false;
        }
        match side.credits.try_send_data() {
            Some(pb) => {
                let id = side.queue.pop_front();
                self.wires[s].push_back(Msg {
                    kind: MsgKind::Data,
                    pb,
                    id,
                });
                true
            }
            None => false,
        }
    }

    fn poll_update(&mut self, s: usize) -> bool {
        match self.sides[s].credits.poll_update() {
            Some(pb) => {
                self.wires[s].push_back(Msg {
                    kind: MsgKind::CreditUpdate,
                    pb,
                    id: None,
                });
                true
            }
            None => false,
        }
    }

    /// Delivers the next message in flight towards side `r`, asserting a posted buffer exists.
    fn deliver(&mut self, r: usize) -> bool {
        let Some(msg) = self.wires[1 - r].pop_front() else {
            return false;
        };
        let side = &mut self.sides[r];
        match msg.kind {
            MsgKind::Data => {
                assert!(
                    side.free_data > 0,
                    "RNR: data arrived with no data buffer posted"
                );
                side.free_data -= 1;
                side.received.push(msg.id.expect("data has an id"));
            }
            MsgKind::CreditUpdate => {
                assert!(
                    side.free_slot,
                    "RNR: update arrived with the update slot not posted"
                );
                side.free_slot = false;
            }
        }
        side.consumed.push(msg.kind);
        side.credits
            .on_receive(msg.kind, msg.pb)
            .expect("an honest peer never breaks a credit rule");
        true
    }

    fn repost(&mut self, s: usize, i: usize) -> bool {
        let side = &mut self.sides[s];
        if side.consumed.is_empty() {
            return false;
        }
        let kind = side.consumed.remove(i % side.consumed.len());
        match kind {
            MsgKind::Data => side.free_data += 1,
            MsgKind::CreditUpdate => side.free_slot = true,
        }
        side.credits
            .on_reposted(kind)
            .expect("a consumed buffer can be re-posted");
        true
    }

    fn check_invariants(&self) {
        for side in &self.sides {
            let c = &side.credits;
            assert!(
                c.send_credits() + c.escrowed_credits() <= self.grant,
                "send credits {} + escrow {} exceed grant {}",
                c.send_credits(),
                c.escrowed_credits(),
                self.grant
            );
            assert!(
                !c.slot_return_owed() || c.send_credits() >= 1,
                "a slot return is owed by a side with no credit"
            );
            assert!(side.free_data <= self.grant);
        }
    }

    fn quiet(&self) -> bool {
        self.sides.iter().all(|s| s.queue.is_empty()) && self.wires.iter().all(|w| w.is_empty())
    }

    /// Fair round-robin: every event of every side gets a turn each round; re-posts always
    /// happen; nothing new is enqueued. Returns the rounds used to drain all queues.
    fn run_fair(&mut self, max_rounds: usize) -> Option<usize> {
        for round in 0..max_rounds {
            if self.quiet() {
                return Some(round);
            }
            for s in 0..2 {
                self.deliver(s);
                self.repost(s, 0);
                // Transport policy: data first; an explicit update only when no data can go.
                if !self.send_data(s) {
                    self.poll_update(s);
                }
                self.check_invariants();
            }
        }
        self.quiet().then_some(max_rounds)
    }

    fn outstanding_at(&self, s: usize) -> u32 {
        let c = &self.sides[s].credits;
        self.grant - c.send_credits() - c.escrowed_credits()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Properties 1 and 3 during random interleavings (asserted inside `step`), then property 2:
    /// a fair scheduler drains every queue in bounded rounds, in FIFO order, without RNR.
    #[test]
    fn random_interleavings_never_rnr_and_always_drain(
        grant in 1u32..=8,
        events in prop::collection::vec(event(), 0..300),
    ) {
        let mut m = Model::new(grant);
        for ev in events {
            m.step(ev);
        }
        let queued: usize = m.sides.iter().map(|s| s.queue.len()).sum();
        let in_flight: usize = m.wires.iter().map(|w| w.len()).sum();
        // Each message needs at most a credit round trip: a handful of rounds per message
        // plus what is already in flight, independent of grant.
        let bound = 8 * (queued + in_flight) + 4 * grant as usize + 16;
        let rounds = m.run_fair(bound);
        prop_assert!(rounds.is_some(), "not drained in {bound} rounds: {m:#?}");
        for s in 0..2 {
            let sent = m.sides[s].next_id;
            let got = &m.sides[1 - s].received;
            prop_assert_eq!(got.len() as u64, sent);
            prop_assert!(got.iter().copied().eq(0..sent), "out of order or lost");
        }
    }

    /// Property 4: returning more credits than are outstanding is a typed error and leaves the
    /// receiver's state unchanged, whatever happened before.
    #[test]
    fn lying_peer_returning_too_many_credits_is_an_error(
        grant in 1u32..=8,
        events in prop::collection::vec(event(), 0..200),
        victim in 0usize..2,
        extra in 1u32..=u32::MAX / 2,
    ) {
        let mut m = Model::new(grant);
        for ev in events {
            m.step(ev);
        }
        let lie = Piggyback {
            credits: m.outstanding_at(victim).saturating_add(extra),
            slot_return: false,
        };
        let before = m.sides[victim].credits.clone();
        let got = m.sides[victim].credits.on_receive(MsgKind::Data, lie);
        prop_assert!(
            matches!(got, Err(CreditError::TooManyCredits { .. } | CreditError::DataOverrun)),
            "{got:?}"
        );
        let after = &m.sides[victim].credits;
        prop_assert_eq!(after.send_credits(), before.send_credits());
        prop_assert_eq!(after.escrowed_credits(), before.escrowed_credits());
        prop_assert_eq!(after.stats(), before.stats());
        prop_assert!(after.send_credits() <= grant);
    }

    /// Property 4 in isolation: after `sent` data messages, any return above `sent` is refused.
    #[test]
    fn returns_above_sent_count_are_refused(
        grant in 1u32..=64,
        sent_frac in 0.0f64..=1.0,
        extra in 1u32..=1000,
    ) {
        let mut c = Credits::new(CreditConfig::new(grant).unwrap());
        let sent = (f64::from(grant) * sent_frac) as u32;
        for _ in 0..sent {
            prop_assert!(c.try_send_data().is_some());
        }
        let lie = Piggyback { credits: sent + extra, slot_return: false };
        prop_assert_eq!(
            c.on_receive(MsgKind::CreditUpdate, lie),
            Err(CreditError::TooManyCredits { returned: sent + extra, outstanding: sent })
        );
        prop_assert_eq!(c.send_credits(), grant - sent);
    }
}
