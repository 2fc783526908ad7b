//! Per-message cost of the flow-control hot path: credits (`try_send_data` + `on_receive`),
//! window (`try_post` + `on_complete`) and scheduler (`enqueue` + `next`), alone and together
//! (`all_one_msg`, where the peer's data message returns each credit, and
//! `all_one_msg_one_way`, where explicit updates do), and together with the send-slot and
//! CQ-entry accounting of `QueueBudget` (`all_one_msg_sq_cq`).
//!
//! Run: `cargo bench -p byteexpress-flow --bench accounting`

use std::hint::black_box;

use byteexpress_flow::credit::{CreditConfig, Credits, MsgKind, QueueBudget, QueueConfig};
use byteexpress_flow::sched::{Class, ConnId, SchedConfig, Scheduler};
use byteexpress_flow::window::{AdaptiveConfig, DeviceWindow, Window};
use criterion::{Criterion, criterion_group, criterion_main};

/// Two ends of a link in steady state: one data message each way per iteration, so each
/// message costs one `try_send_data`, one `on_receive` and one `on_reposted`.
struct CreditPair {
    a: Credits,
    b: Credits,
}

impl CreditPair {
    fn new() -> Self {
        let cfg = CreditConfig::new(64).unwrap();
        Self {
            a: Credits::new(cfg),
            b: Credits::new(cfg),
        }
    }

    /// Sends one data message from `a` to `b` and back; returns credits carried.
    #[inline]
    fn ping_pong(&mut self) -> u32 {
        let pb = self.a.try_send_data().unwrap();
        self.b.on_receive(MsgKind::Data, pb).unwrap();
        self.b.on_reposted(MsgKind::Data).unwrap();
        let pb2 = self.b.try_send_data().unwrap();
        self.a.on_receive(MsgKind::Data, pb2).unwrap();
        self.a.on_reposted(MsgKind::Data).unwrap();
        pb.credits + pb2.credits
    }
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

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("per_message");

    let mut pair = CreditPair::new();
    // Two messages per iteration: the reported time is for two.
    g.bench_function("credit_2msgs", |b| b.iter(|| black_box(pair.ping_pong())));

    let mut dev = DeviceWindow::new(16 << 20).unwrap();
    let mut w = Window::fixed(1 << 20).unwrap();
    g.bench_function("window_static", |b| {
        b.iter(|| {
            let t = w.try_post(&mut dev, black_box(4096)).unwrap();
            w.on_complete(&mut dev, t.bytes, black_box(10), black_box(1000))
                .unwrap()
        })
    });

    let mut w = adaptive_window();
    let mut now = 0u64;
    g.bench_function("window_adaptive", |b| {
        b.iter(|| {
            now += 1;
            let t = w.try_post(&mut dev, black_box(4096)).unwrap();
            // Alternate below and above the 20 µs target.
            let rtt = if now & 1 == 0 { 10 } else { 30 };
            w.on_complete(&mut dev, t.bytes, rtt, now).unwrap()
        })
    });

    let (mut s, conns) = warm_sched(8);
    let mut i = 0usize;
    g.bench_function("sched_8conns", |b| {
        b.iter(|| {
            i = (i + 1) & 7;
            let class = if i == 0 { Class::Latency } else { Class::Bulk };
            s.enqueue(conns[i], class, black_box(4096)).unwrap();
            s.next(|len| black_box(len) > 0).unwrap()
        })
    });

    // The whole hot path for one message: enqueue, schedule gated by window and credits,
    // post (window + credit), then the completion and the peer's credit return.
    let (mut s, conns) = warm_sched(8);
    let mut pair = CreditPair::new();
    let mut w = adaptive_window();
    let mut dev = DeviceWindow::new(16 << 20).unwrap();
    let mut i = 0usize;
    let mut now = 0u64;
    g.bench_function("all_one_msg", |b| {
        b.iter(|| {
            i = (i + 1) & 7;
            now += 1;
            s.enqueue(conns[i], Class::Bulk, black_box(4096)).unwrap();
            let grant = s
                .next(|len| w.can_post(&dev, len.into()) && pair.a.can_send())
                .unwrap();
            let t = w.try_post(&mut dev, grant.len.into()).unwrap();
            let pb = pair.a.try_send_data().unwrap();
            // Peer receives and re-posts; its next message returns the credit.
            pair.b.on_receive(MsgKind::Data, pb).unwrap();
            pair.b.on_reposted(MsgKind::Data).unwrap();
            let back = pair.b.try_send_data().unwrap();
            pair.a.on_receive(MsgKind::Data, back).unwrap();
            pair.a.on_reposted(MsgKind::Data).unwrap();
            w.on_complete(&mut dev, t.bytes, 10, now).unwrap()
        })
    });

    // One-way bulk traffic, as on a push: the same hot path for one message, but the credit
    // comes back the way the protocol returns it when the receiver has nothing to send, in an
    // explicit update every `update_threshold` messages (its cost shared by those messages),
    // instead of on a data message of the peer's that `all_one_msg` charges to this one.
    let (mut s, conns) = warm_sched(8);
    let CreditPair {
        a: mut tx,
        b: mut rx,
    } = CreditPair::new();
    let mut w = adaptive_window();
    let mut dev = DeviceWindow::new(16 << 20).unwrap();
    let mut i = 0usize;
    let mut now = 0u64;
    g.bench_function("all_one_msg_one_way", |b| {
        b.iter(|| {
            i = (i + 1) & 7;
            now += 1;
            s.enqueue(conns[i], Class::Bulk, black_box(4096)).unwrap();
            let grant = s
                .next(|len| w.can_post(&dev, len.into()) && tx.can_send())
                .unwrap();
            let t = w.try_post(&mut dev, grant.len.into()).unwrap();
            let pb = tx.try_send_data().unwrap();
            rx.on_receive(MsgKind::Data, pb).unwrap();
            rx.on_reposted(MsgKind::Data).unwrap();
            if let Some(update) = rx.poll_update() {
                tx.on_receive(MsgKind::CreditUpdate, update).unwrap();
                tx.on_reposted(MsgKind::CreditUpdate).unwrap();
            }
            w.on_complete(&mut dev, t.bytes, 10, now).unwrap()
        })
    });
    assert!(
        tx.stats().data_sent < 64 || rx.stats().updates_sent > 0,
        "credits came back in updates"
    );

    // The same, with the second and third credits: the SEND also takes a send slot and its
    // CQ entry; each side's receive completion frees a receive entry and the re-post takes
    // it again; the send completions free the slots.
    let (mut s, conns) = warm_sched(8);
    let mut pair = CreditPair::new();
    let mut w = adaptive_window();
    let mut dev = DeviceWindow::new(16 << 20).unwrap();
    let qcfg = QueueConfig::new(128, 65, 128 + 65).unwrap();
    let (mut qa, mut qb) = (QueueBudget::new(qcfg), QueueBudget::new(qcfg));
    for _ in 0..65 {
        qa.try_post_recv().unwrap();
        qb.try_post_recv().unwrap();
    }
    let mut i = 0usize;
    let mut now = 0u64;
    g.bench_function("all_one_msg_sq_cq", |b| {
        b.iter(|| {
            i = (i + 1) & 7;
            now += 1;
            s.enqueue(conns[i], Class::Bulk, black_box(4096)).unwrap();
            let grant = s
                .next(|len| w.can_post(&dev, len.into()) && pair.a.can_send() && qa.can_post_send())
                .unwrap();
            let t = w.try_post(&mut dev, grant.len.into()).unwrap();
            let pb = pair.a.try_send_data().unwrap();
            qa.try_post_send().unwrap();
            // Peer polls the receive, re-posts; its next message returns the credit.
            qb.on_recv_completion().unwrap();
            pair.b.on_receive(MsgKind::Data, pb).unwrap();
            qb.try_post_recv().unwrap();
            pair.b.on_reposted(MsgKind::Data).unwrap();
            let back = pair.b.try_send_data().unwrap();
            qb.try_post_send().unwrap();
            qa.on_recv_completion().unwrap();
            pair.a.on_receive(MsgKind::Data, back).unwrap();
            qa.try_post_recv().unwrap();
            pair.a.on_reposted(MsgKind::Data).unwrap();
            // Both send completions.
            qb.on_send_completion().unwrap();
            qa.on_send_completion().unwrap();
            w.on_complete(&mut dev, t.bytes, 10, now).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
