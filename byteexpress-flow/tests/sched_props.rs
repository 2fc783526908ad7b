//! Property tests of the scheduler over random enqueue sequences, gate answers and
//! completion orderings: DRR fairness, liveness with a completing window, the capped latency
//! share, and chunk framing.

use std::collections::{HashMap, VecDeque};

use byteexpress_flow::sched::{Class, ConnId, Grant, MsgId, SchedConfig, SchedError, Scheduler};
use byteexpress_flow::window::{DeviceWindow, Window};
use proptest::prelude::*;

fn config(max_chunk: u32, quantum_extra: u32, burst: u32) -> SchedConfig {
    SchedConfig::new(max_chunk + quantum_extra, max_chunk, burst).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Over any interval in which two connections of one class stay backlogged, the bytes
    /// granted to them differ by less than quantum + 2 × max_chunk, whatever their message
    /// sizes, the gate's refusals, and the other class's traffic.
    #[test]
    fn drr_fairness_between_backlogged_connections(
        max_chunk in 1u32..5000,
        quantum_extra in 0u32..10_000,
        burst in 1u32..6,
        class_is_bulk in any::<bool>(),
        sizes in proptest::collection::vec((1u64..15_000, 0u64..15_000), 2..6),
        seq in proptest::collection::vec((any::<u64>(), any::<bool>(), any::<bool>()), 50..600),
    ) {
        let cfg = config(max_chunk, quantum_extra, burst);
        let class = if class_is_bulk { Class::Bulk } else { Class::Latency };
        let other = if class_is_bulk { Class::Latency } else { Class::Bulk };
        let mut s = Scheduler::new(cfg);
        let conns: Vec<ConnId> = sizes.iter().map(|_| s.open()).collect();
        let side = s.open();
        // Queued messages per connection (to keep each at >= 2, so never empty).
        let mut queued = vec![0usize; conns.len()];
        let mut cum = vec![0i64; conns.len()];
        // Per pair: running max and min of cum_i - cum_j.
        let n = conns.len();
        let mut hi = vec![0i64; n * n];
        let mut lo = vec![0i64; n * n];
        let mut rng = 0u64;
        for (r, gate, side_traffic) in seq {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(r | 1);
            for (i, &c) in conns.iter().enumerate() {
                while queued[i] < 2 {
                    let (base, spread) = sizes[i];
                    let len = base + (rng >> 17) % (spread + 1);
                    s.enqueue(c, class, len).unwrap();
                    queued[i] += 1;
                }
            }
            if side_traffic {
                s.enqueue(side, other, 1 + r % 20_000).unwrap();
            }
            let Some(g) = s.next(|_| gate) else { continue };
            if g.class != class {
                continue;
            }
            let i = conns.iter().position(|&c| c == g.conn).unwrap();
            cum[i] += i64::from(g.len);
            if g.last {
                queued[i] -= 1;
            }
            for a in 0..n {
                for b in 0..n {
                    let d = cum[a] - cum[b];
                    hi[a * n + b] = hi[a * n + b].max(d);
                    lo[a * n + b] = lo[a * n + b].min(d);
                }
            }
        }
        let bound = i64::from(cfg.quantum()) + 2 * i64::from(cfg.max_chunk());
        for k in 0..n * n {
            prop_assert!(hi[k] - lo[k] < bound, "spread {} >= bound {bound}", hi[k] - lo[k]);
        }
    }

    /// With a window whose completions keep arriving (in random order, window possibly smaller
    /// than a chunk), every enqueued message is granted entirely: chunks in order, contiguous,
    /// at most max_chunk, the last one flagged, messages FIFO per connection and class.
    #[test]
    fn every_message_is_eventually_granted_when_the_window_completes(
        max_chunk in 1u32..5000,
        quantum_extra in 0u32..5000,
        burst in 1u32..6,
        cap in 1u64..20_000,
        ops in proptest::collection::vec((0usize..4, any::<bool>(), 1u64..12_000, any::<u8>()), 1..200),
    ) {
        let mut s = Scheduler::new(config(max_chunk, quantum_extra, burst));
        let conns: Vec<ConnId> = (0..4).map(|_| s.open()).collect();
        let mut dev = DeviceWindow::unlimited();
        let mut w = Window::fixed(cap).unwrap();
        let mut in_flight: Vec<u64> = Vec::new();
        // Expected FIFO per (conn, class): (msg, len); progress per msg: bytes granted.
        let mut expect: HashMap<(ConnId, Class), VecDeque<(MsgId, u64)>> = HashMap::new();
        let mut progress: HashMap<MsgId, u64> = HashMap::new();
        let mut total = 0u64;
        let check = |g: Grant,
                     expect: &mut HashMap<(ConnId, Class), VecDeque<(MsgId, u64)>>,
                     progress: &mut HashMap<MsgId, u64>|
         -> Result<(), TestCaseError> {
            prop_assert!(g.len >= 1 && g.len <= max_chunk);
            let q = expect.get_mut(&(g.conn, g.class)).unwrap();
            let &(msg, len) = q.front().unwrap();
            prop_assert_eq!(g.msg, msg, "FIFO per connection and class");
            let done = progress.entry(msg).or_default();
            prop_assert_eq!(g.offset, *done, "contiguous");
            *done += u64::from(g.len);
            prop_assert_eq!(g.last, *done == len);
            if g.last {
                q.pop_front();
            }
            Ok(())
        };
        for (c, latency, len, action) in ops {
            let class = if latency { Class::Latency } else { Class::Bulk };
            let id = s.enqueue(conns[c], class, len).unwrap();
            expect.entry((conns[c], class)).or_default().push_back((id, len));
            total += len;
            // Random completions, then as many grants as the window allows.
            for _ in 0..(action % 3) {
                if !in_flight.is_empty() {
                    let b = in_flight.swap_remove(usize::from(action) % in_flight.len());
                    w.on_complete(&mut dev, b, 1, 0).unwrap();
                }
            }
            for _ in 0..(action % 5) {
                let mut ticket = None;
                let Some(g) = s.next(|len| {
                    ticket = w.try_post(&mut dev, u64::from(len)).ok();
                    ticket.is_some()
                }) else { break };
                in_flight.push(ticket.unwrap().bytes);
                check(g, &mut expect, &mut progress)?;
            }
        }
        // Drain: the window keeps completing; bounded number of steps.
        let mut granted: u64 = progress.values().sum();
        let mut steps = 0u64;
        while !s.is_empty() {
            steps += 1;
            prop_assert!(steps <= 2 * total + 10, "no progress");
            let mut ticket = None;
            match s.next(|len| {
                ticket = w.try_post(&mut dev, u64::from(len)).ok();
                ticket.is_some()
            }) {
                Some(g) => {
                    in_flight.push(ticket.unwrap().bytes);
                    granted += u64::from(g.len);
                    check(g, &mut expect, &mut progress)?;
                }
                None => {
                    prop_assert!(!in_flight.is_empty(), "blocked with nothing in flight");
                    let b = in_flight.remove(0);
                    w.on_complete(&mut dev, b, 1, 0).unwrap();
                }
            }
        }
        prop_assert_eq!(granted, total);
        prop_assert!(expect.values().all(VecDeque::is_empty));
    }

    /// While bulk is backlogged, at most `latency_burst` latency chunks go in a row, and a
    /// latency message arriving at an empty latency class waits behind at most one bulk chunk.
    #[test]
    fn latency_share_is_capped_and_latency_waits_behind_at_most_one_chunk(
        max_chunk in 1u32..5000,
        burst in 1u32..6,
        ops in proptest::collection::vec((0usize..3, any::<bool>(), 1u64..12_000, any::<bool>()), 1..400),
    ) {
        let mut s = Scheduler::new(config(max_chunk, 0, burst));
        let conns: Vec<ConnId> = (0..3).map(|_| s.open()).collect();
        let mut streak = 0u32;
        // Latency messages enqueued into an empty latency class: bulk grants seen since.
        let mut watched: HashMap<MsgId, u32> = HashMap::new();
        for (c, latency, len, gate) in ops {
            let class = if latency { Class::Latency } else { Class::Bulk };
            let latency_was_empty = s.backlog(Class::Latency) == 0;
            let id = s.enqueue(conns[c], class, len).unwrap();
            if latency && latency_was_empty {
                watched.insert(id, 0);
            }
            let bulk_backlogged = s.backlog(Class::Bulk) > 0;
            let Some(g) = s.next(|_| gate) else { continue };
            match g.class {
                Class::Latency if bulk_backlogged => streak += 1,
                Class::Latency => streak = 0,
                Class::Bulk => {
                    streak = 0;
                    for n in watched.values_mut() {
                        *n += 1;
                    }
                }
            }
            prop_assert!(streak <= burst, "{streak} latency chunks in a row");
            if g.class == Class::Latency
                && let Some(n) = watched.remove(&g.msg)
            {
                prop_assert!(n <= 1, "latency message waited behind {n} bulk chunks");
            }
        }
    }
}

/// A connection of [`RefSched`]: open, then per class its queue of (msg, len, sent) and its
/// deficit.
type RefConn = (bool, [VecDeque<(MsgId, u64, u64)>; 2], [u64; 2]);

/// Textbook DRR with the same rules, written for clarity (per-class `VecDeque` of connection
/// indices, quantum added lazily at the first look of a turn), to check the scheduler's
/// intrusive rounds and eager charging grant exactly the same chunks.
#[derive(Debug, Default)]
struct RefSched {
    conns: Vec<RefConn>,
    order: [VecDeque<usize>; 2],
    charged: [bool; 2],
    streak: u32,
}

impl RefSched {
    fn next(
        &mut self,
        cfg: SchedConfig,
        gate: bool,
    ) -> Option<(usize, Class, MsgId, u64, u32, bool)> {
        let latency = !self.order[0].is_empty();
        let bulk = !self.order[1].is_empty();
        let c = if latency && (!bulk || self.streak < cfg.latency_burst()) {
            0
        } else if bulk {
            1
        } else {
            return None;
        };
        loop {
            let i = *self.order[c].front()?;
            let (_, queues, deficits) = &mut self.conns[i];
            if !self.charged[c] {
                deficits[c] += u64::from(cfg.quantum());
                self.charged[c] = true;
            }
            let &(msg, len, sent) = queues[c].front().unwrap();
            let chunk = (len - sent).min(u64::from(cfg.max_chunk()));
            if chunk > deficits[c] {
                self.order[c].rotate_left(1);
                self.charged[c] = false;
                continue;
            }
            if !gate {
                return None;
            }
            deficits[c] -= chunk;
            let last = sent + chunk == len;
            queues[c].front_mut().unwrap().2 += chunk;
            if last {
                queues[c].pop_front();
                if queues[c].is_empty() {
                    deficits[c] = 0;
                    self.order[c].pop_front();
                    self.charged[c] = false;
                }
            }
            self.streak = if c == 0 && bulk { self.streak + 1 } else { 0 };
            let class = Class::ALL[c];
            return Some((i, class, msg, sent, chunk as u32, last));
        }
    }

    fn close(&mut self, i: usize) -> (u64, u64) {
        let (open, queues, deficits) = &mut self.conns[i];
        *open = false;
        let mut dropped = (0, 0);
        for c in 0..2 {
            dropped.0 += queues[c].len() as u64;
            dropped.1 += queues[c]
                .iter()
                .map(|&(_, len, sent)| len - sent)
                .sum::<u64>();
            queues[c].clear();
            deficits[c] = 0;
            if self.order[c].front() == Some(&i) {
                self.charged[c] = false;
            }
            self.order[c].retain(|&j| j != i);
        }
        dropped
    }
}

#[derive(Debug, Clone, Copy)]
enum SchedOp {
    Open,
    Close(usize),
    Enqueue(usize, bool, u64),
    Next(bool),
}

fn sched_op() -> impl Strategy<Value = SchedOp> {
    prop_oneof![
        1 => Just(SchedOp::Open),
        1 => (0usize..8).prop_map(SchedOp::Close),
        6 => (0usize..8, any::<bool>(), 1u64..12_000).prop_map(|(i, l, n)| SchedOp::Enqueue(i, l, n)),
        6 => any::<bool>().prop_map(SchedOp::Next),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// Opening, closing (anywhere in a round: head, middle, tail), enqueueing and granting in
    /// any order, the scheduler grants exactly what textbook DRR with the same rules grants,
    /// and its backlog counters and close reports agree with it.
    #[test]
    fn grants_match_textbook_drr_under_open_and_close(
        max_chunk in 1u32..5000,
        quantum_extra in 0u32..5000,
        burst in 1u32..4,
        ops in proptest::collection::vec(sched_op(), 1..400),
    ) {
        let cfg = config(max_chunk, quantum_extra, burst);
        let mut s = Scheduler::new(cfg);
        let mut r = RefSched::default();
        // Open connections: (scheduler id, reference index); closed ones kept to test staleness.
        let mut open: Vec<(ConnId, usize)> = Vec::new();
        let mut closed: Vec<ConnId> = Vec::new();
        let mut by_slot: HashMap<usize, usize> = HashMap::new();
        for op in ops {
            match op {
                SchedOp::Open => {
                    let id = s.open();
                    r.conns.push((true, Default::default(), [0; 2]));
                    by_slot.insert(id.index(), r.conns.len() - 1);
                    open.push((id, r.conns.len() - 1));
                }
                SchedOp::Close(k) if !open.is_empty() => {
                    let (id, i) = open.remove(k % open.len());
                    let got = s.close(id).unwrap();
                    let want = r.close(i);
                    prop_assert_eq!((got.messages, got.bytes), want);
                    closed.push(id);
                }
                SchedOp::Close(_) => {}
                SchedOp::Enqueue(k, latency, len) => {
                    let class = if latency { Class::Latency } else { Class::Bulk };
                    if let Some(&stale) = closed.get(k) {
                        prop_assert_eq!(s.enqueue(stale, class, len), Err(SchedError::UnknownConn(stale)));
                    }
                    if open.is_empty() {
                        continue;
                    }
                    let (id, i) = open[k % open.len()];
                    let msg = s.enqueue(id, class, len).unwrap();
                    r.conns[i].1[class_index(class)].push_back((msg, len, 0));
                    if r.conns[i].1[class_index(class)].len() == 1 {
                        r.order[class_index(class)].push_back(i);
                    }
                }
                SchedOp::Next(gate) => {
                    let got = s.next(|_| gate);
                    let want = r.next(cfg, gate);
                    let got = got.map(|g| (by_slot[&g.conn.index()], g.class, g.msg, g.offset, g.len, g.last));
                    prop_assert_eq!(got, want);
                    if let Some((i, ..)) = got {
                        prop_assert!(r.conns[i].0, "granted on a closed connection");
                    }
                }
            }
            for class in Class::ALL {
                let c = class_index(class);
                prop_assert_eq!(s.backlogged(class), r.order[c].len());
                let backlog: u64 = r.conns.iter().flat_map(|x| x.1[c].iter()).map(|&(_, l, sent)| l - sent).sum();
                prop_assert_eq!(s.backlog(class), backlog);
                for &(id, i) in &open {
                    let q: u64 = r.conns[i].1[c].iter().map(|&(_, l, sent)| l - sent).sum();
                    prop_assert_eq!(s.queued_bytes(id, class), q);
                }
            }
            prop_assert_eq!(s.is_empty(), r.order.iter().all(VecDeque::is_empty));
        }
    }
}

fn class_index(class: Class) -> usize {
    match class {
        Class::Latency => 0,
        Class::Bulk => 1,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// `offer` is `enqueue` plus, on an idle scheduler, an immediate grant: two schedulers fed
    /// the same messages and gate answers, one through `offer` (then `next`) and one through
    /// `enqueue` then `next`, grant the same chunks in the same order and stay equal.
    #[test]
    fn offer_grants_exactly_what_enqueue_then_next_grants(
        max_chunk in 1u32..5000,
        quantum_extra in 0u32..5000,
        burst in 1u32..6,
        ops in proptest::collection::vec(
            (0usize..3, any::<bool>(), 1u64..12_000, any::<bool>(), 0usize..3, any::<u8>()),
            1..300,
        ),
    ) {
        let cfg = config(max_chunk, quantum_extra, burst);
        let (mut a, mut b) = (Scheduler::new(cfg), Scheduler::new(cfg));
        let mut ca: Vec<ConnId> = (0..3).map(|_| a.open()).collect();
        let mut cb: Vec<ConnId> = (0..3).map(|_| b.open()).collect();
        for (conn, bulk, len, admit, drains, close) in ops {
            if close < 20 {
                // A connection closes with whatever it has queued (a bulk backlog may go
                // with it, leaving a latency streak behind), and a new one takes its slot.
                prop_assert_eq!(a.close(ca[conn]), b.close(cb[conn]));
                ca[conn] = a.open();
                cb[conn] = b.open();
                continue;
            }
            let class = if bulk { Class::Bulk } else { Class::Latency };
            let was_idle = a.is_empty();
            // a: offer; the gate may grant at once.
            let offered = a.offer(ca[conn], class, len, |l, c| {
                assert_eq!((u64::from(l), c), (len, class), "the whole message, its class");
                admit
            }).unwrap();
            // b: enqueue, then one `next` only where the bypass could have applied.
            b.enqueue(cb[conn], class, len).unwrap();
            let bypass = was_idle && len <= u64::from(max_chunk);
            let expected = if bypass { b.next_by_class(|_, _| admit) } else { None };
            match offered {
                byteexpress_flow::sched::Offer::Granted(g) => {
                    let e = expected.expect("enqueue + next grants it too");
                    prop_assert_eq!((g.conn.index(), g.class, g.msg, g.offset, g.len, g.last),
                        (e.conn.index(), e.class, e.msg, e.offset, e.len, e.last));
                }
                byteexpress_flow::sched::Offer::Queued(_) => prop_assert!(expected.is_none()),
            }
            // Then both drain some chunks with an admitting gate: same grants.
            for _ in 0..drains {
                let (ga, gb) = (a.next(|_| true), b.next(|_| true));
                prop_assert_eq!(ga.map(|g| (g.conn.index(), g.class, g.msg, g.offset, g.len, g.last)),
                    gb.map(|g| (g.conn.index(), g.class, g.msg, g.offset, g.len, g.last)));
            }
            for c in Class::ALL {
                prop_assert_eq!(a.backlog(c), b.backlog(c));
            }
        }
    }
}

#[test]
fn offer_rejects_what_enqueue_rejects_and_changes_nothing() {
    let mut s = Scheduler::new(SchedConfig::default());
    let conn = s.open();
    let stale = s.open();
    s.close(stale).unwrap();
    let mut asked = false;
    let mut gate = |_, _| {
        asked = true;
        true
    };
    assert_eq!(
        s.offer(conn, Class::Latency, 0, &mut gate),
        Err(SchedError::EmptyMessage)
    );
    assert_eq!(
        s.offer(stale, Class::Latency, 10, &mut gate),
        Err(SchedError::UnknownConn(stale))
    );
    assert!(!asked, "the gate is not asked for a rejected message");
    assert!(s.is_empty());
}
