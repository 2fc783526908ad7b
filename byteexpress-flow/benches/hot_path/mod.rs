//! The per-message loops of the flow-control hot path, written once for the criterion bench
//! (`benches/accounting.rs`) and the instruction counter (`examples/ir_count.rs`).
//!
//! Each case is a state built once and a `step` that does the work of one iteration; the
//! names are the bench names.

use std::hint::black_box;

use byteexpress_flow::credit::{
    CreditConfig, Credits, MsgKind, Piggyback, QueueBudget, QueueConfig,
};
use byteexpress_flow::gate::{Gate, Refusals, Room, admit_chunk, admit_round, admit_update};
use byteexpress_flow::sched::{Class, ConnId, Offer, SchedConfig, Scheduler};
use byteexpress_flow::window::{AdaptiveConfig, DeviceWindow, Window};

/// One benchmarked loop body.
pub trait Case {
    /// Messages one iteration accounts for (the reported time is divided by it).
    fn messages(&self) -> u64 {
        1
    }
    /// One iteration; the result goes to `black_box`.
    fn step(&mut self) -> u64;
    /// Checks, after the runs, that the loop did what it claims.
    fn check(&self) {}
}

fn credits() -> (Credits, Credits) {
    let cfg = CreditConfig::new(64).unwrap();
    (Credits::new(cfg), Credits::new(cfg))
}

fn adaptive_window() -> Window {
    Window::adaptive(AdaptiveConfig::new(64 * 1024, 4 << 20, 20).unwrap())
}

/// A scheduler with `n` connections, warmed so its queues do not allocate.
fn warm_sched(n: usize) -> (Scheduler, Vec<ConnId>) {
    let mut s = Scheduler::new(SchedConfig::default());
    let conns: Vec<ConnId> = (0..n).map(|_| s.open()).collect();
    for _ in 0..64 {
        for &c in &conns {
            s.enqueue(c, Class::Bulk, 4096).unwrap();
            s.enqueue(c, Class::Latency, 256).unwrap();
        }
    }
    while s.next(|_| true).is_some() {}
    (s, conns)
}

/// Two ends of a link in steady state: one data message each way per iteration, so each
/// message costs one `try_send_data`, one `on_receive` and one `on_reposted` (the reported time
/// is for two messages).
pub struct Credit2 {
    a: Credits,
    b: Credits,
}

impl Credit2 {
    pub fn new() -> Self {
        let (a, b) = credits();
        Self { a, b }
    }
}

impl Case for Credit2 {
    #[inline]
    fn step(&mut self) -> u64 {
        let pb = self.a.try_send_data().unwrap();
        self.b.on_receive(MsgKind::Data, pb).unwrap();
        self.b.on_reposted(MsgKind::Data).unwrap();
        let pb2 = self.b.try_send_data().unwrap();
        self.a.on_receive(MsgKind::Data, pb2).unwrap();
        self.a.on_reposted(MsgKind::Data).unwrap();
        u64::from(pb.credits + pb2.credits)
    }
}

/// A static window: one post and its completion.
pub struct WindowStatic {
    w: Window,
    dev: DeviceWindow,
}

impl WindowStatic {
    pub fn new() -> Self {
        Self {
            w: Window::fixed(1 << 20).unwrap(),
            dev: DeviceWindow::new(16 << 20).unwrap(),
        }
    }
}

impl Case for WindowStatic {
    #[inline]
    fn step(&mut self) -> u64 {
        let t = self.w.try_post(&mut self.dev, black_box(4096)).unwrap();
        self.w
            .on_complete(&mut self.dev, t.bytes, black_box(10), black_box(1000))
            .unwrap();
        t.bytes
    }
}

/// The adaptive window: one post and its completion, RTTs alternating below and above the
/// 20 µs target.
pub struct WindowAdaptive {
    w: Window,
    dev: DeviceWindow,
    now: u64,
}

impl WindowAdaptive {
    pub fn new() -> Self {
        Self {
            w: adaptive_window(),
            dev: DeviceWindow::new(16 << 20).unwrap(),
            now: 0,
        }
    }
}

impl Case for WindowAdaptive {
    #[inline]
    fn step(&mut self) -> u64 {
        self.now += 1;
        let t = self.w.try_post(&mut self.dev, black_box(4096)).unwrap();
        let rtt = if self.now & 1 == 0 { 10 } else { 30 };
        self.w
            .on_complete(&mut self.dev, t.bytes, rtt, self.now)
            .unwrap();
        t.bytes
    }
}

/// The scheduler alone: enqueue and grant one message over 8 connections, one in 8 latency.
pub struct Sched8 {
    s: Scheduler,
    conns: Vec<ConnId>,
    i: usize,
}

impl Sched8 {
    pub fn new() -> Self {
        let (s, conns) = warm_sched(8);
        Self { s, conns, i: 0 }
    }
}

impl Case for Sched8 {
    #[inline]
    fn step(&mut self) -> u64 {
        self.i = (self.i + 1) & 7;
        let class = if self.i == 0 {
            Class::Latency
        } else {
            Class::Bulk
        };
        self.s
            .enqueue(self.conns[self.i], class, black_box(4096))
            .unwrap();
        u64::from(self.s.next(|len| black_box(len) > 0).unwrap().len)
    }
}

/// The scheduler alone behind a standing backlog: 8 messages of 4 KiB queued on each of 8
/// connections; each iteration enqueues one more (a message joins the back of its queue) and
/// grants one (the head of the connection whose turn it is), so the backlog stays put.
pub struct Sched8Backlogged {
    s: Scheduler,
    conns: Vec<ConnId>,
    i: usize,
}

impl Sched8Backlogged {
    pub fn new() -> Self {
        let (mut s, conns) = warm_sched(8);
        for _ in 0..8 {
            for &c in &conns {
                s.enqueue(c, Class::Bulk, 4096).unwrap();
            }
        }
        Self { s, conns, i: 0 }
    }
}

impl Case for Sched8Backlogged {
    #[inline]
    fn step(&mut self) -> u64 {
        self.i = (self.i + 1) & 7;
        self.s
            .enqueue(self.conns[self.i], Class::Bulk, black_box(4096))
            .unwrap();
        u64::from(self.s.next(|len| black_box(len) > 0).unwrap().len)
    }
}

/// How the credit a message took comes back (the `R` of [`AllOne`]), and what else is counted:
/// on the next data message the other way; the ends take turns sending, each message through
/// its sender's scheduler and window.
pub const TWO_WAY: u8 = 0;
/// In an explicit update every `update_threshold` messages, as on a one-way push.
pub const UPDATE: u8 = 1;
/// As [`TWO_WAY`] in the gate-bound state: each end's scheduler holds a standing backlog of 8
/// messages on each of its 8 connections (a message joins the back of its queue; the one
/// granted is the head of the connection whose turn it is), and each end holds one credit
/// (a grant of 1), so a round grants one message and then, more being queued and no credit
/// left, ends (as the RDMA engine's round ends: it checks for a credit before it asks the
/// scheduler).
pub const TWO_WAY_BACKLOGGED: u8 = 3;
/// As [`TWO_WAY`], the QP windows adaptive (`Config::window_target_delay` set) instead of the
/// default static cap.
pub const TWO_WAY_ADAPTIVE: u8 = 4;

/// One end of a link: its scheduler (8 connections), QP window and device window, credits
/// (a grant of `grant` buffers) and queue budget (send slots, receives and CQ entries). The QP
/// window is the RDMA link's default (`byteexpress-rpc`'s `Config::window_bytes`, static
/// 256 KiB) or the adaptive one; the device window is capped (16 MiB), so its account is
/// kept too.
struct End {
    s: Scheduler,
    conns: Vec<ConnId>,
    credits: Credits,
    queues: QueueBudget,
    w: Window,
    dev: DeviceWindow,
    /// Rounds (and credit updates) the gates refused, by gate (the engine's per-gate
    /// counters, `LinkStats::gate_refusals`).
    refusals: Refusals,
}

impl End {
    /// An end granting `grant` receive buffers to its peer, with `sq_depth` send slots.
    fn new(adaptive: bool, grant: u32, sq_depth: u32) -> Self {
        let (s, conns) = warm_sched(8);
        let qcfg = QueueConfig::new(sq_depth, grant + 1, sq_depth + grant + 1).unwrap();
        let mut queues = QueueBudget::new(qcfg);
        for _ in 0..=grant {
            queues.try_post_recv().unwrap();
        }
        Self {
            s,
            conns,
            credits: Credits::new(CreditConfig::new(grant).unwrap()),
            queues,
            w: if adaptive {
                adaptive_window()
            } else {
                Window::fixed(256 << 10).unwrap()
            },
            dev: DeviceWindow::new(16 << 20).unwrap(),
            refusals: Refusals::default(),
        }
    }

    /// The SEND of a message of `kind` from this end, carrying `pb`, lands at `to`: the send
    /// slot (and its CQ entry) taken here; at `to`, the receive completion frees its receive
    /// and CQ entry, the header's credits are applied, and the buffer is re-posted.
    #[inline(always)]
    fn land(&mut self, to: &mut End, kind: MsgKind, pb: Piggyback) {
        self.queues.try_post_send().unwrap();
        to.queues.on_recv_completion().unwrap();
        to.credits.on_receive(kind, pb).unwrap();
        to.queues.try_post_recv().unwrap();
        to.credits.on_reposted(kind).unwrap();
    }

    /// The room the gates read at the start of a round (as the engine reads it: the queue
    /// budget, the credits, the free send buffers; every SEND of the bench completes within
    /// its iteration, so all [`SEND_BUFS`] are free).
    #[inline(always)]
    fn room(&self) -> Room {
        Room::new(&self.queues, &self.credits, SEND_BUFS)
    }

    /// The end of one of this end's rounds, as the engine ends it: an explicit credit update
    /// if one is due and its gates admit it (`admit_update`), sent to `to` (received, its
    /// slot re-posted, its send completion polled).
    #[inline(always)]
    fn end_round(&mut self, to: &mut End) {
        if !self.credits.update_due() {
            return;
        }
        if let Err(g) = admit_update(&self.room()) {
            self.refusals.record(g);
            return;
        }
        let update = self.credits.poll_update().unwrap();
        self.land(to, MsgKind::CreditUpdate, black_box(update));
        self.queues.on_send_completion().unwrap();
    }

    /// One 4 KiB message on connection `i` from this end to `to` in a round of its own, every
    /// account it touches on both ends, its completion reported at `now` (µs). When
    /// `GATE_BOUND`, a message granted from the queue leaves the round without a credit for
    /// another, so it ends there. Returns the bytes the window charged.
    #[inline]
    fn send<const GATE_BOUND: bool>(&mut self, to: &mut End, i: usize, now: u64) -> u64 {
        // As the RDMA engine's round: it asks the scheduler only while gates 1-4 admit one
        // more chunk (`admit_round`); the scheduler's gate is `admit_chunk` (for a latency
        // message, the windows), charged as it admits. An idle scheduler grants the message
        // at once (`offer`); behind a backlog it is queued and `next` grants the chunk whose
        // turn it is.
        let room = self.room();
        admit_round(&room, 0).expect("a slot, a CQ entry, a buffer and a credit");
        let (w, dev) = (&mut self.w, &mut self.dev);
        let mut ticket = None;
        let mut gate = |len: u32, class| match admit_chunk(&room, 0, class, w, dev, len.into()) {
            Ok(a) => {
                ticket = Some(w.charge(dev, a));
                true
            }
            Err(_) => false,
        };
        match self
            .s
            .offer(self.conns[i], Class::Latency, black_box(4096), &mut gate)
            .unwrap()
        {
            Offer::Granted(_) => {}
            Offer::Queued(_) => {
                self.s.next_by_class(&mut gate).unwrap();
                // More is queued, but the batch holds the one credit there was: the round
                // ends without asking the scheduler, the credit gate's refusal counted.
                if GATE_BOUND && let Err(g) = admit_round(&room, 1) {
                    self.refusals.record(g);
                }
            }
        }
        let t = ticket.unwrap();
        // The receiver reads the piggyback from the wire.
        let pb = black_box(self.credits.try_send_data_batch(1).unwrap());
        self.land(to, MsgKind::Data, pb);
        self.end_round(to);
        // The sender's CQ poll: the send completion frees the slot and releases the windows.
        self.queues.on_send_completion().unwrap();
        self.w.on_complete(&mut self.dev, t.bytes, 10, now).unwrap();
        t.bytes
    }
}

/// The two ends of a link, with adaptive QP windows or the default static ones, a grant of
/// `grant` and `sq_depth` send slots each, each with `per_conn` messages of `len` bytes in
/// `class` queued on every connection.
fn ends(
    adaptive: bool,
    grant: u32,
    sq_depth: u32,
    per_conn: usize,
    class: Class,
    len: u64,
) -> (End, End) {
    let end = || End::new(adaptive, grant, sq_depth);
    let (mut a, mut b) = (end(), end());
    for end in [&mut a, &mut b] {
        for _ in 0..per_conn {
            for &c in &end.conns {
                end.s.enqueue(c, class, len).unwrap();
            }
        }
    }
    (a, b)
}

/// Asserts that the ends took turns, at most `per_turn` data messages apart, and that credits
/// came back on data messages only.
fn assert_took_turns(a: &End, b: &End, per_turn: u64) {
    let (a, b) = (a.credits.stats(), b.credits.stats());
    assert!(
        a.data_sent.abs_diff(b.data_sent) <= per_turn && a.updates_sent + b.updates_sent == 0,
        "the ends took turns, and credits came back on data messages"
    );
}

/// The whole hot path of a message, two messages per iteration (the loop's own work shared by
/// two; time per message), each in a round of its own as the RDMA engine runs it: enqueue,
/// schedule gated by the windows (while a credit and a send slot are left), post (window, credit,
/// send slot), the receiver's receive completion, receive and re-post, the end of the round
/// (an explicit update if due), the send completion. The credit comes back as `R` says:
/// - `all_one_msg_two_way` ([`TWO_WAY`]): the ends take turns, so each message's header
///   returns the credit of the one before it;
/// - `all_one_msg_one_way` ([`UPDATE`]): every message goes one way and the receiver returns
///   credits in explicit updates at the end of its rounds (their SEND, receive and re-post
///   counted too);
/// - `all_one_msg_two_way_adaptive` ([`TWO_WAY_ADAPTIVE`]): as two-way, with adaptive windows;
/// - `all_one_msg_two_way_backlogged` ([`TWO_WAY_BACKLOGGED`]): as two-way in the gate-bound
///   state: behind a standing backlog, one credit per end, so one message per round, the
///   round ending for want of a credit.
pub struct AllOne<const R: u8> {
    a: End,
    b: End,
    i: usize,
    now: u64,
}

impl<const R: u8> AllOne<R> {
    pub fn new() -> Self {
        let per_conn = if R == TWO_WAY_BACKLOGGED { 8 } else { 0 };
        // The engine's default grant (16), or for the gate-bound state one credit per end.
        let grant = if R == TWO_WAY_BACKLOGGED { 1 } else { 16 };
        let (a, b) = ends(
            R == TWO_WAY_ADAPTIVE,
            grant,
            SQ_DEPTH,
            per_conn,
            Class::Latency,
            4096,
        );
        Self { a, b, i: 0, now: 0 }
    }
}

impl<const R: u8> Case for AllOne<R> {
    /// Two messages per iteration, so the loop's own work is shared by two.
    fn messages(&self) -> u64 {
        2
    }

    #[inline]
    fn step(&mut self) -> u64 {
        self.i = (self.i + 2) & 7;
        self.now += 1;
        if R == UPDATE {
            let mut bytes = 0;
            for i in [self.i, self.i + 1] {
                bytes += self.a.send::<false>(&mut self.b, i, self.now);
                // The receiver's round: nothing to send but, once due, an update.
                self.b.end_round(&mut self.a);
            }
            return bytes;
        }
        // The ends take turns: one message each way.
        let gate_bound = R == TWO_WAY_BACKLOGGED;
        if gate_bound {
            self.a.send::<true>(&mut self.b, self.i, self.now)
                + self.b.send::<true>(&mut self.a, self.i + 1, self.now)
        } else {
            self.a.send::<false>(&mut self.b, self.i, self.now)
                + self.b.send::<false>(&mut self.a, self.i + 1, self.now)
        }
    }

    fn check(&self) {
        let (a, b) = (self.a.credits.stats(), self.b.credits.stats());
        if R == UPDATE {
            assert!(
                a.data_sent < 64 || b.updates_sent > 0,
                "credits came back in updates"
            );
        } else {
            assert_took_turns(&self.a, &self.b, 1);
        }
        if R == TWO_WAY_BACKLOGGED {
            assert_eq!(
                self.a.refusals.get(Gate::Credit) + self.b.refusals.get(Gate::Credit),
                a.data_sent + b.data_sent,
                "every round ended for want of a credit"
            );
            assert_eq!(
                self.a.refusals.total() + self.b.refusals.total(),
                a.data_sent + b.data_sent,
                "and for nothing else"
            );
        }
    }
}

/// Messages per turn of [`Batched`].
pub const BATCH: usize = 8;

/// Send slots of each end: the RDMA link's default (`Config::max_send_wr`).
const SQ_DEPTH: u32 = 64;

/// Send buffers of each end: as many as send slots (the RDMA link's send pool).
const SEND_BUFS: usize = SQ_DEPTH as usize;

impl End {
    /// One turn of the RDMA engine under a standing backlog, as `byteexpress-rpc` batches it:
    /// [`BATCH`] single-chunk messages join the back of their connections' queues (one per
    /// connection); while gates 1-4 admit one more beside those the batch holds
    /// (`gate::admit_round`: a send slot, CQ entry, send buffer and credit; this end has a
    /// grant of [`BATCH`], so the round ends there, the credit gate's refusal counted), the
    /// scheduler grants the chunk whose turn it is through `gate::admit_chunk` (room in both
    /// windows, charged as each chunk is admitted, `Window::charge`); the batch takes
    /// its credits at once (`Credits::try_send_data_batch`); each SEND takes a slot and lands
    /// (the first returning credits, the receiver re-posting each buffer); the sender's CQ
    /// poll returns the batch's send completions together, which release the windows once
    /// (at `now`, µs). Returns the bytes charged.
    #[inline(never)]
    fn send_batch(&mut self, to: &mut End, now: u64) -> u64 {
        for &c in &self.conns[..BATCH] {
            self.s.enqueue(c, Class::Latency, black_box(4096)).unwrap();
        }
        let mut bytes = 0u64;
        let mut taken = 0u32;
        let room = self.room();
        loop {
            if let Err(g) = admit_round(&room, taken) {
                self.refusals.record(g);
                break;
            }
            let (w, dev) = (&mut self.w, &mut self.dev);
            let mut refused = None;
            let Some(g) = self.s.next_by_class(|len, class| {
                match admit_chunk(&room, taken, class, w, dev, len.into()) {
                    Ok(a) => {
                        let _ = w.charge(dev, a);
                        true
                    }
                    Err(g) => {
                        refused = Some(g);
                        false
                    }
                }
            }) else {
                if let Some(g) = refused {
                    self.refusals.record(g);
                }
                break;
            };
            bytes += u64::from(g.len);
            taken += 1;
        }
        // The headers: the first message's piggyback, the others empty; opaque to the
        // optimiser, as the receiver reads them from the wire.
        let mut headers = [Piggyback::default(); BATCH];
        headers[0] = self.credits.try_send_data_batch(taken).unwrap();
        for &pb in &black_box(headers)[..taken as usize] {
            self.land(to, MsgKind::Data, pb);
        }
        self.end_round(to);
        for _ in 0..taken {
            self.queues.on_send_completion().unwrap();
        }
        self.w.on_complete(&mut self.dev, bytes, 10, now).unwrap();
        bytes
    }
}

/// Size of the bulk messages of [`BulkChunks`] (bytes): 16 chunks of 64 KiB.
const BULK_MESSAGE: u64 = 1 << 20;

impl End {
    /// One chunk of a bulk message from this end to `to`, as the RDMA engine posts bulk
    /// chunks (one per round, so nothing is batched): with a send slot free, the scheduler
    /// grants the chunk whose turn it is through the gate (a credit above the latency
    /// reserve, the window post); the credit is taken, the SEND takes a slot and lands (the
    /// receiver re-posting the buffer), the round ends, and the send completion frees the
    /// slot and releases the window (at `now`, µs). A connection whose message's last chunk
    /// went queues another, so the backlog stands. Returns the bytes charged.
    #[inline(never)]
    fn send_bulk_chunk(&mut self, to: &mut End, now: u64) -> u64 {
        let room = self.room();
        admit_round(&room, 0).expect("a slot, a CQ entry, a buffer and a credit");
        let (w, dev) = (&mut self.w, &mut self.dev);
        let mut ticket = None;
        let g = self
            .s
            .next_by_class(
                |len, class| match admit_chunk(&room, 0, class, w, dev, len.into()) {
                    Ok(a) => {
                        ticket = Some(w.charge(dev, a));
                        true
                    }
                    Err(_) => false,
                },
            )
            .unwrap();
        let t = ticket.unwrap();
        if g.last {
            self.s
                .enqueue(g.conn, Class::Bulk, black_box(BULK_MESSAGE))
                .unwrap();
        }
        let pb = black_box(self.credits.try_send_data_batch(1).unwrap());
        self.land(to, MsgKind::Data, pb);
        self.end_round(to);
        self.queues.on_send_completion().unwrap();
        self.w.on_complete(&mut self.dev, t.bytes, 10, now).unwrap();
        t.bytes
    }
}

/// What an end sends in its turn of [`Turns`]: [`End::send_batch`].
pub const TURN_BATCH: u8 = 0;
/// [`End::send_bulk_chunk`].
pub const TURN_BULK_CHUNK: u8 = 1;

/// Two backlogged ends taking turns, a turn being what `T` says; the time is reported per
/// message.
pub struct Turns<const T: u8> {
    a: End,
    b: End,
    now: u64,
}

/// `all_batch8_two_way_backlogged`: both ends hold a standing backlog of 8 single-chunk
/// messages on each of their 8 connections (latency class, as the RDMA engine classes a
/// message that fits one chunk; a chunk of a larger message ends the engine's batch); a turn
/// is [`End::send_batch`]: [`BATCH`] messages queued, granted (each charging the windows),
/// credited at once, received, and completed together (the windows released once).
pub type Batched = Turns<TURN_BATCH>;

/// `all_bulk_chunk_two_way_backlogged`: each end keeps two 1 MiB bulk messages queued on
/// each of its 8 connections, one chunk (64 KiB) per turn: [`End::send_bulk_chunk`]. The
/// per-chunk accounting of a bulk push; a message is queued once per 16 chunks.
pub type BulkChunks = Turns<TURN_BULK_CHUNK>;

impl<const T: u8> Turns<T> {
    pub fn new() -> Self {
        let (a, b) = if T == TURN_BATCH {
            // A grant of BATCH: the round ends when the credits run out.
            ends(false, BATCH as u32, SQ_DEPTH, 8, Class::Latency, 4096)
        } else {
            ends(false, 16, SQ_DEPTH, 2, Class::Bulk, BULK_MESSAGE)
        };
        Self { a, b, now: 0 }
    }

    /// One turn from `from` to `to` at `now` (µs); the bytes charged.
    #[inline]
    fn send(from: &mut End, to: &mut End, now: u64) -> u64 {
        if T == TURN_BATCH {
            from.send_batch(to, now)
        } else {
            from.send_bulk_chunk(to, now)
        }
    }
}

impl<const T: u8> Case for Turns<T> {
    /// Two turns per iteration, one each way, so the loop's own work is shared.
    fn messages(&self) -> u64 {
        2 * if T == TURN_BATCH { BATCH as u64 } else { 1 }
    }

    #[inline]
    fn step(&mut self) -> u64 {
        self.now += 1;
        Self::send(&mut self.a, &mut self.b, self.now)
            + Self::send(&mut self.b, &mut self.a, self.now)
    }

    fn check(&self) {
        assert_took_turns(&self.a, &self.b, self.messages() / 2);
    }
}
