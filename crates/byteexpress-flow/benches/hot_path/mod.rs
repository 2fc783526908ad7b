//! The per-message loops of the flow-control hot path, written once for the criterion bench
//! (`benches/accounting.rs`) and the instruction counter (`examples/ir_count.rs`).
//!
//! Each case is a state built once and a `step` that does the work of one iteration; the
//! names are the bench names.

use std::hint::black_box;

use byteexpress_flow::credit::{CreditConfig, Credits, MsgKind, QueueBudget, QueueConfig};
use byteexpress_flow::sched::{Class, ConnId, SchedConfig, Scheduler};
use byteexpress_flow::window::{AdaptiveConfig, DeviceWindow, Window};

/// One benchmarked loop body.
pub trait Case {
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

/// How the credit a message took comes back (the `R` of [`AllOne`]), and what else is counted:
/// on the peer's next data message (charged to this one).
pub const PEER_DATA: u8 = 0;
/// In an explicit update every `update_threshold` messages, as on a one-way push.
pub const UPDATE: u8 = 1;
/// On the peer's data message, with send slots and CQ entries on both sides.
pub const PEER_DATA_WITH_QUEUES: u8 = 2;

/// The whole hot path for one message: enqueue, schedule gated by window and credits, post
/// (window + credit), then the completion and the credit's return as `R` says
/// (`all_one_msg`: [`PEER_DATA`]; `all_one_msg_one_way`: [`UPDATE`]; `all_one_msg_sq_cq`:
/// [`PEER_DATA_WITH_QUEUES`], where every SEND also takes a send slot and its CQ entry, each
/// side's receive completion frees a receive entry that the re-post takes again, and the send
/// completions free the slots).
pub struct AllOne<const R: u8> {
    s: Scheduler,
    conns: Vec<ConnId>,
    a: Credits,
    b: Credits,
    qa: QueueBudget,
    qb: QueueBudget,
    w: Window,
    dev: DeviceWindow,
    i: usize,
    now: u64,
}

impl<const R: u8> AllOne<R> {
    pub fn new() -> Self {
        let (s, conns) = warm_sched(8);
        let (a, b) = credits();
        let qcfg = QueueConfig::new(128, 65, 128 + 65).unwrap();
        let (mut qa, mut qb) = (QueueBudget::new(qcfg), QueueBudget::new(qcfg));
        for _ in 0..65 {
            qa.try_post_recv().unwrap();
            qb.try_post_recv().unwrap();
        }
        Self {
            s,
            conns,
            a,
            b,
            qa,
            qb,
            w: adaptive_window(),
            dev: DeviceWindow::new(16 << 20).unwrap(),
            i: 0,
            now: 0,
        }
    }
}

impl<const R: u8> Case for AllOne<R> {
    #[inline]
    fn step(&mut self) -> u64 {
        let queues = R == PEER_DATA_WITH_QUEUES;
        self.i = (self.i + 1) & 7;
        self.now += 1;
        self.s
            .enqueue(self.conns[self.i], Class::Bulk, black_box(4096))
            .unwrap();
        let (w, dev, a, qa) = (&self.w, &self.dev, &self.a, &self.qa);
        let grant = self
            .s
            .next(|len| {
                w.can_post(dev, len.into()) && a.can_send() && (!queues || qa.can_post_send())
            })
            .unwrap();
        let t = self.w.try_post(&mut self.dev, grant.len.into()).unwrap();
        let pb = self.a.try_send_data().unwrap();
        if queues {
            self.qa.try_post_send().unwrap();
            self.qb.on_recv_completion().unwrap();
        }
        self.b.on_receive(MsgKind::Data, pb).unwrap();
        if queues {
            self.qb.try_post_recv().unwrap();
        }
        self.b.on_reposted(MsgKind::Data).unwrap();
        if R == UPDATE {
            if let Some(update) = self.b.poll_update() {
                self.a.on_receive(MsgKind::CreditUpdate, update).unwrap();
                self.a.on_reposted(MsgKind::CreditUpdate).unwrap();
            }
        } else {
            // The peer's next message returns the credit.
            let back = self.b.try_send_data().unwrap();
            if queues {
                self.qb.try_post_send().unwrap();
                self.qa.on_recv_completion().unwrap();
            }
            self.a.on_receive(MsgKind::Data, back).unwrap();
            if queues {
                self.qa.try_post_recv().unwrap();
            }
            self.a.on_reposted(MsgKind::Data).unwrap();
            if queues {
                self.qb.on_send_completion().unwrap();
                self.qa.on_send_completion().unwrap();
            }
        }
        self.w
            .on_complete(&mut self.dev, t.bytes, 10, self.now)
            .unwrap();
        t.bytes
    }

    fn check(&self) {
        if R == UPDATE {
            assert!(
                self.a.stats().data_sent < 64 || self.b.stats().updates_sent > 0,
                "credits came back in updates"
            );
        }
    }
}
