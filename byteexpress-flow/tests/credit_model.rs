//! Model-based proptests of the credit protocol: two endpoints, posted receive buffers, FIFO
//! reliable in-order channels (RC), bounded send queues and one CQ per endpoint shared by its
//! send and receive completions, random interleavings (so random CQE orders), then a fair
//! scheduler.
//!
//! Each SEND takes a receiver credit ([`Credits`]) and a send slot ([`QueueBudget`]). On the
//! wire it lands in a posted receive at the peer (a receive completion there); the sender's
//! send completion is generated later by a separate `Ack` event, so the peer's reply returning
//! the credit may be polled before or after the send completion of the message it answers.

use std::collections::VecDeque;

use byteexpress_flow::credit::{
    CreditConfig, CreditError, Credits, MsgKind, Piggyback, QueueBudget, QueueConfig,
};
use proptest::prelude::*;

/// A message on the wire: its kind, header piggyback and (for data) the sender's sequence id.
#[derive(Debug, Clone)]
struct Msg {
    kind: MsgKind,
    pb: Piggyback,
    id: Option<u64>,
}

/// A completion in an endpoint's CQ.
#[derive(Debug, Clone)]
enum Cqe {
    /// One of this endpoint's SENDs completed.
    Send,
    /// A message from the peer filled one of this endpoint's posted receives.
    Recv(Msg),
}

/// One endpoint: its credit machine, its queue budget, its message queue, its posted receive
/// buffers and its CQ.
#[derive(Debug)]
struct Side {
    credits: Credits,
    /// Sends only bulk chunks: takes a credit only through `can_send_bulk`, leaving the
    /// latency reserve.
    bulk: bool,
    queues: QueueBudget,
    queue: VecDeque<u64>,
    next_id: u64,
    /// Posted data receive buffers (at most grant).
    free_data: u32,
    /// The update slot receive is posted.
    free_slot: bool,
    /// Received buffers awaiting the application's re-post, by kind.
    consumed: Vec<MsgKind>,
    /// Ids of data messages received from the peer, in poll order.
    received: Vec<u64>,
    /// Completions not yet polled, in the order the NIC wrote them.
    cq: VecDeque<Cqe>,
    /// SENDs of this side delivered at the peer whose send completion is not written yet.
    acks_due: u32,
    /// Position in this side's SEND order (data and updates) of each data SEND.
    data_sends: Vec<usize>,
    /// SENDs posted, and send CQEs polled (they complete in SEND order on an RC QP).
    sends_posted: usize,
    send_cqes_polled: usize,
    /// Credits the peer returned so far (unit: credits).
    returned: usize,
    /// Credits this side put in the headers it sent (unit: credits).
    returns_sent: u64,
    /// Polled credit returns, by which came first: the return covering our n-th data SEND
    /// (the peer cannot return n credits before receiving n of them) or that SEND's own send
    /// completion.
    returns_before_send_cqe: u32,
    send_cqe_before_returns: u32,
}

#[derive(Debug)]
struct Model {
    grant: u32,
    qcfg: QueueConfig,
    sides: [Side; 2],
    /// `wires[i]`: in flight from side i to side 1 - i, FIFO.
    wires: [VecDeque<Msg>; 2],
}

#[derive(Debug, Clone, Copy)]
enum Event {
    Enqueue(usize),
    SendData(usize),
    /// The next SEND towards side `r` lands in a posted receive (receive CQE at `r`).
    Deliver(usize),
    /// The oldest delivered SEND of side `s` gets its send CQE.
    Ack(usize),
    /// Side `s` polls one CQE.
    Poll(usize),
    Repost(usize, usize),
    PollUpdate(usize),
}

fn event() -> impl Strategy<Value = Event> {
    let side = 0usize..2;
    prop_oneof![
        side.clone().prop_map(Event::Enqueue),
        side.clone().prop_map(Event::SendData),
        side.clone().prop_map(Event::Deliver),
        side.clone().prop_map(Event::Ack),
        side.clone().prop_map(Event::Poll),
        (side.clone(), 0usize..64).prop_map(|(s, i)| Event::Repost(s, i)),
        side.prop_map(Event::PollUpdate),
    ]
}

/// Grant, and queue sizes around it: `sq_depth` in 1..=4, the CQ sized for all receives plus
/// 1..=sq_depth+1 sends (so sometimes the CQ, not the SQ, limits sends).
fn sizes() -> impl Strategy<Value = (u32, QueueConfig)> {
    (1u32..=8, 1u32..=4)
        .prop_flat_map(|(grant, sq)| (Just(grant), Just(sq), 1..=sq + 1))
        .prop_map(|(grant, sq, cq_extra)| {
            let rq = grant + 1;
            (grant, QueueConfig::new(sq, rq, rq + cq_extra).unwrap())
        })
}

impl Model {
    fn new(grant: u32, qcfg: QueueConfig) -> Self {
        let cfg = CreditConfig::new(grant).expect("grant >= 1");
        assert_eq!(qcfg.rq_depth(), cfg.posted_receives());
        let side = || {
            let mut queues = QueueBudget::new(qcfg);
            for _ in 0..cfg.posted_receives() {
                queues.try_post_recv().expect("rq_depth = grant + 1");
            }
            Side {
                credits: Credits::new(cfg),
                bulk: false,
                queues,
                queue: VecDeque::new(),
                next_id: 0,
                free_data: grant,
                free_slot: true,
                consumed: Vec::new(),
                received: Vec::new(),
                cq: VecDeque::new(),
                acks_due: 0,
                data_sends: Vec::new(),
                sends_posted: 0,
                send_cqes_polled: 0,
                returned: 0,
                returns_sent: 0,
                returns_before_send_cqe: 0,
                send_cqe_before_returns: 0,
            }
        };
        Self {
            grant,
            qcfg,
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
            Event::Ack(s) => {
                self.ack(s);
            }
            Event::Poll(s) => {
                self.poll(s);
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

    /// Whether side `s` may post a data SEND now: a receiver credit and a send slot.
    fn can_send_data(&self, s: usize) -> bool {
        let side = &self.sides[s];
        let credit = if side.bulk {
            side.credits.can_send_bulk()
        } else {
            side.credits.can_send()
        };
        credit && side.queues.can_post_send()
    }

    fn send_data(&mut self, s: usize) -> bool {
        if self.sides[s].queue.is_empty() || !self.can_send_data(s) {
            return false;
        }
        let side = &mut self.sides[s];
        let pb = side.credits.try_send_data().expect("credit checked");
        side.returns_sent += u64::from(pb.credits);
        side.queues.try_post_send().expect("slot checked");
        side.data_sends.push(side.sends_posted);
        side.sends_posted += 1;
        let id = side.queue.pop_front();
        self.wires[s].push_back(Msg {
            kind: MsgKind::Data,
            pb,
            id,
        });
        true
    }

    /// An explicit update, when one is due and a send slot is free (asked in that order: a
    /// due update is committed by `poll_update`).
    fn poll_update(&mut self, s: usize) -> bool {
        let side = &mut self.sides[s];
        if !side.queues.can_post_send() {
            return false;
        }
        match side.credits.poll_update() {
            Some(pb) => {
                side.returns_sent += u64::from(pb.credits);
                side.queues.try_post_send().expect("slot checked");
                side.sends_posted += 1;
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

    /// Writes a CQE into side `s`'s CQ, asserting the CQ does not overrun.
    fn write_cqe(&mut self, s: usize, cqe: Cqe) {
        let side = &mut self.sides[s];
        assert!(
            side.cq.len() < self.qcfg.cq_size() as usize,
            "CQ overrun: {} CQEs in a CQ of {}",
            side.cq.len() + 1,
            self.qcfg.cq_size()
        );
        side.cq.push_back(cqe);
    }

    /// Delivers the next message in flight towards side `r` into a posted receive, asserting
    /// one exists (no RNR); its receive CQE is written at `r` and the sender's ack becomes due.
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
            }
            MsgKind::CreditUpdate => {
                assert!(
                    side.free_slot,
                    "RNR: update arrived with the update slot not posted"
                );
                side.free_slot = false;
            }
        }
        self.write_cqe(r, Cqe::Recv(msg));
        self.sides[1 - r].acks_due += 1;
        true
    }

    /// Writes the send CQE of side `s`'s oldest delivered, unacknowledged SEND.
    fn ack(&mut self, s: usize) -> bool {
        if self.sides[s].acks_due == 0 {
            return false;
        }
        self.sides[s].acks_due -= 1;
        self.write_cqe(s, Cqe::Send);
        true
    }

    /// Side `s` polls its oldest CQE and applies it.
    fn poll(&mut self, s: usize) -> bool {
        let side = &mut self.sides[s];
        let Some(cqe) = side.cq.pop_front() else {
            return false;
        };
        match cqe {
            Cqe::Send => {
                side.send_cqes_polled += 1;
                side.queues
                    .on_send_completion()
                    .expect("a send CQE follows a posted send");
            }
            Cqe::Recv(msg) => {
                if msg.pb.credits > 0 {
                    side.returned += msg.pb.credits as usize;
                    // The peer holds the last of these returns only since our data SEND
                    // number `returned` (1-based) reached it.
                    let answered = side.data_sends[side.returned - 1];
                    if answered >= side.send_cqes_polled {
                        side.returns_before_send_cqe += 1;
                    } else {
                        side.send_cqe_before_returns += 1;
                    }
                }
                side.queues
                    .on_recv_completion()
                    .expect("a receive CQE follows a posted receive");
                if let Some(id) = msg.id {
                    side.received.push(id);
                }
                side.consumed.push(msg.kind);
                side.credits
                    .on_receive(msg.kind, msg.pb)
                    .expect("an honest peer never breaks a credit rule");
            }
        }
        true
    }

    fn repost(&mut self, s: usize, i: usize) -> bool {
        let side = &mut self.sides[s];
        if side.consumed.is_empty() {
            return false;
        }
        let kind = side.consumed.remove(i % side.consumed.len());
        side.queues
            .try_post_recv()
            .expect("a consumed receive's slot and CQ entry are free");
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
        for (s, side) in self.sides.iter().enumerate() {
            if side.bulk {
                let reserve = side.credits.config().latency_reserve();
                assert!(
                    side.credits.send_credits() >= reserve,
                    "side {s}: bulk dipped into the latency reserve of {reserve}"
                );
            }
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
            // What we take the peer to hold is what it holds: its credits (usable or in
            // escrow), the returns on their way to it and the data it sent us not yet taken.
            // (Given the two counter checks below, this pins the formula of `peer_credits`.)
            let peer = &self.sides[1 - s];
            let (ps, cs) = (peer.credits.stats(), c.stats());
            assert_eq!(
                u64::from(c.peer_credits()),
                u64::from(peer.credits.send_credits() + peer.credits.escrowed_credits())
                    + (side.returns_sent - peer.returned as u64)
                    + (ps.data_sent - cs.data_received),
                "side {s}: peer credits"
            );
            // The credit counters (derived from the state) match what crossed the wire.
            let stats = c.stats();
            assert_eq!(stats.credits_returned, side.returns_sent, "side {s}");
            assert_eq!(stats.data_received, side.received.len() as u64, "side {s}");
            assert_eq!(stats.credits_received, side.returned as u64, "side {s}");
            // WRs outstanding, counted from the model: on the wire, delivered but not yet
            // acknowledged, or completed but not yet polled.
            let sends = self.wires[s].len() as u32 + side.acks_due + count_send_cqes(&side.cq);
            assert!(
                sends <= self.qcfg.sq_depth(),
                "{sends} SENDs outstanding in an SQ of {}",
                self.qcfg.sq_depth()
            );
            assert_eq!(sends, side.queues.sends_outstanding());
            assert_eq!(side.queues.free_sends(), self.qcfg.send_limit() - sends);
            // CQEs owed: one per outstanding send, per posted receive and per unpolled
            // receive CQE.
            let recvs = side.free_data
                + u32::from(side.free_slot)
                + (side.cq.len() as u32 - count_send_cqes(&side.cq));
            assert_eq!(recvs, side.queues.recvs_posted());
            assert!(
                sends + recvs <= self.qcfg.cq_size(),
                "{} CQEs owed to a CQ of {}",
                sends + recvs,
                self.qcfg.cq_size()
            );
            assert_eq!(sends + recvs, side.queues.cqes_owed());
        }
    }

    fn quiet(&self) -> bool {
        self.sides.iter().all(|s| {
            s.queue.is_empty() && s.cq.is_empty() && s.acks_due == 0 && s.consumed.is_empty()
        }) && self.wires.iter().all(|w| w.is_empty())
    }

    /// Work left: queued, on the wire, awaiting an ack, a poll or a re-post.
    fn work(&self) -> usize {
        self.sides
            .iter()
            .map(|s| s.queue.len() + s.cq.len() + s.acks_due as usize + s.consumed.len())
            .sum::<usize>()
            + self.wires.iter().map(VecDeque::len).sum::<usize>()
    }

    /// Fair round-robin: every event of every side gets a turn each round; the NIC delivers
    /// and acknowledges, the transport polls its CQ empty (a batch, as the engine does),
    /// re-posts, then sends; nothing new is enqueued. Returns the rounds used to drain.
    fn run_fair(&mut self, max_rounds: usize) -> Option<usize> {
        for round in 0..max_rounds {
            if self.quiet() {
                return Some(round);
            }
            for s in 0..2 {
                self.ack(s);
                self.deliver(s);
                while self.poll(s) {}
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

fn count_send_cqes(cq: &VecDeque<Cqe>) -> u32 {
    cq.iter().filter(|c| matches!(c, Cqe::Send)).count() as u32
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// During random interleavings, so random CQE orders (asserted inside `step`): no RNR (a
    /// SEND always finds a posted receive, so never a SEND without a receiver credit), credits
    /// within the grant, never more SENDs outstanding than SQ slots, never more CQEs owed
    /// than the CQ holds and no CQ overrun, the queue budget equal to the model's count.
    /// Then liveness: a fair scheduler drains every queue in bounded rounds, every queued
    /// message posted and received once, in FIFO order. Either side may send only bulk, which
    /// leaves the latency reserve of credits untouched and must still drain.
    #[test]
    fn random_interleavings_never_rnr_and_always_drain(
        (grant, qcfg) in sizes(),
        bulk in any::<[bool; 2]>(),
        events in prop::collection::vec(event(), 0..300),
    ) {
        let mut m = Model::new(grant, qcfg);
        for (side, bulk) in m.sides.iter_mut().zip(bulk) {
            side.bulk = bulk;
        }
        for ev in events {
            m.step(ev);
        }
        // Each message needs at most a credit round trip: a handful of rounds per message
        // plus what is already under way, independent of grant and queue sizes.
        let bound = 8 * m.work() + 4 * grant as usize + 16;
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
        (grant, qcfg) in sizes(),
        events in prop::collection::vec(event(), 0..200),
        victim in 0usize..2,
        extra in 1u32..=u32::MAX / 2,
    ) {
        let mut m = Model::new(grant, qcfg);
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

/// Grant 1, one SQ slot, a CQ of 3 (2 receives + 1 send). A sends message 0, B receives it,
/// re-posts the buffer and replies with data carrying the credit back; the reply's receive
/// CQE reaches A's CQ before (`return_first`) or after A's own send CQE. Returns the model
/// with both CQEs in A's CQ, not yet polled.
fn reply_and_ack(return_first: bool) -> Model {
    let mut m = Model::new(1, QueueConfig::new(1, 2, 3).unwrap());
    for ev in [
        Event::Enqueue(0),
        Event::Enqueue(0),
        Event::Enqueue(1),
        Event::SendData(0),
        Event::Deliver(1),
        Event::Poll(1),
        Event::Repost(1, 0),
        Event::SendData(1),
    ] {
        m.step(ev);
    }
    assert_eq!(m.wires[1].front().map(|msg| msg.pb.credits), Some(1));
    let order = if return_first {
        [Event::Deliver(0), Event::Ack(0)]
    } else {
        [Event::Ack(0), Event::Deliver(0)]
    };
    for ev in order {
        m.step(ev);
    }
    m
}

/// The credit comes back first: A holds a credit but its only SQ slot is still taken by the
/// message the reply answers, so the next SEND waits for the send completion.
#[test]
fn credit_return_polled_before_the_send_completion_waits_for_the_slot() {
    let mut m = reply_and_ack(true);
    m.step(Event::Poll(0));
    let a = &m.sides[0];
    assert!(a.credits.can_send());
    assert!(!a.queues.can_post_send());
    assert_eq!(a.queues.sends_outstanding(), 1);
    assert!(!m.send_data(0), "posted with the SQ full");
    m.step(Event::Poll(0));
    assert!(m.send_data(0));
    assert_eq!(m.sides[0].returns_before_send_cqe, 1);
    assert_eq!(m.sides[0].send_cqe_before_returns, 0);
    assert!(m.run_fair(64).is_some());
    assert_eq!(m.sides[1].received, [0, 1]);
}

/// The send completion comes first: A's slot is free but it has no credit until the reply
/// is polled.
#[test]
fn send_completion_polled_before_the_credit_return_waits_for_the_credit() {
    let mut m = reply_and_ack(false);
    m.step(Event::Poll(0));
    let a = &m.sides[0];
    assert!(!a.credits.can_send());
    assert!(a.queues.can_post_send());
    assert_eq!(a.queues.sends_outstanding(), 0);
    assert!(!m.send_data(0), "posted without a credit");
    m.step(Event::Poll(0));
    assert!(m.send_data(0));
    assert_eq!(m.sides[0].returns_before_send_cqe, 0);
    assert_eq!(m.sides[0].send_cqe_before_returns, 1);
    assert!(m.run_fair(64).is_some());
    assert_eq!(m.sides[1].received, [0, 1]);
}

/// The random event sequences of the proptests do exercise both CQE orders: over a fixed
/// set of pseudo-random runs (each checked like the proptest), credit returns are polled
/// both before and after the send completion of the message they answer, many times.
#[test]
fn random_runs_poll_credit_returns_on_both_sides_of_the_send_completion() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (rng >> 33) % n
    };
    let (mut before, mut after) = (0, 0);
    for _ in 0..200 {
        let grant = 1 + next(4) as u32;
        let sq = 1 + next(3) as u32;
        let qcfg = QueueConfig::new(sq, grant + 1, grant + 1 + sq).unwrap();
        let mut m = Model::new(grant, qcfg);
        for _ in 0..300 {
            let s = next(2) as usize;
            let ev = match next(7) {
                0 => Event::Enqueue(s),
                1 => Event::SendData(s),
                2 => Event::Deliver(s),
                3 => Event::Ack(s),
                4 => Event::Poll(s),
                5 => Event::Repost(s, next(64) as usize),
                _ => Event::PollUpdate(s),
            };
            m.step(ev);
        }
        assert!(m.run_fair(10_000).is_some());
        for side in &m.sides {
            before += side.returns_before_send_cqe;
            after += side.send_cqe_before_returns;
        }
    }
    println!("credit returns polled before the send CQE: {before}, after: {after}");
    assert!(
        before >= 50 && after >= 50,
        "before {before}, after {after}"
    );
}
