//! The loops of `benches/accounting.rs`, run a fixed number of times, for instruction counts:
//! `valgrind --tool=callgrind target/release/examples/ir_count NAME N` for N = 0 and N = n;
//! the difference of the totals over n is the cost of one iteration (plus a call).
//!
//! Run: `cargo build --release -p byteexpress-flow --example ir_count`

use std::hint::black_box;

use byteexpress_flow::credit::{CreditConfig, Credits, MsgKind, QueueBudget, QueueConfig};
use byteexpress_flow::sched::{Class, ConnId, SchedConfig, Scheduler};
use byteexpress_flow::window::{AdaptiveConfig, DeviceWindow, Window};

fn credits() -> (Credits, Credits) {
    let cfg = CreditConfig::new(64).unwrap();
    (Credits::new(cfg), Credits::new(cfg))
}

#[inline]
fn ping_pong(a: &mut Credits, b: &mut Credits) -> u32 {
    let pb = a.try_send_data().unwrap();
    b.on_receive(MsgKind::Data, pb).unwrap();
    b.on_reposted(MsgKind::Data).unwrap();
    let pb2 = b.try_send_data().unwrap();
    a.on_receive(MsgKind::Data, pb2).unwrap();
    a.on_reposted(MsgKind::Data).unwrap();
    pb.credits + pb2.credits
}

fn adaptive_window() -> Window {
    Window::adaptive(AdaptiveConfig::new(64 * 1024, 4 << 20, 20).unwrap())
}

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

/// Runs `f` `n` times through a reference the optimiser cannot see through, so the state
/// stays in memory between iterations (as between messages in a transport).
fn run(n: u64, f: &mut dyn FnMut()) {
    let f = black_box(f);
    for _ in 0..n {
        f();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let name = args[1].as_str();
    let n: u64 = args[2].parse().unwrap();
    match name {
        "credit_2msgs" => {
            let (mut a, mut b) = credits();
            run(n, &mut || {
                black_box(ping_pong(&mut a, &mut b));
            });
        }
        "window_static" => {
            let mut dev = DeviceWindow::new(16 << 20).unwrap();
            let mut w = Window::fixed(1 << 20).unwrap();
            run(n, &mut || {
                let t = w.try_post(&mut dev, black_box(4096)).unwrap();
                black_box(
                    w.on_complete(&mut dev, t.bytes, black_box(10), black_box(1000))
                        .unwrap(),
                );
            });
        }
        "window_adaptive" => {
            let mut dev = DeviceWindow::new(16 << 20).unwrap();
            let mut w = adaptive_window();
            let mut now = 0u64;
            run(n, &mut || {
                now += 1;
                let t = w.try_post(&mut dev, black_box(4096)).unwrap();
                let rtt = if now & 1 == 0 { 10 } else { 30 };
                black_box(w.on_complete(&mut dev, t.bytes, rtt, now).unwrap());
            });
        }
        "sched_8conns" => {
            let (mut s, conns) = warm_sched(8);
            let mut i = 0usize;
            run(n, &mut || {
                i = (i + 1) & 7;
                let class = if i == 0 { Class::Latency } else { Class::Bulk };
                s.enqueue(conns[i], class, black_box(4096)).unwrap();
                black_box(s.next(|len| black_box(len) > 0).unwrap());
            });
        }
        "all_one_msg" => {
            let (mut s, conns) = warm_sched(8);
            let (mut a, mut b) = credits();
            let mut w = adaptive_window();
            let mut dev = DeviceWindow::new(16 << 20).unwrap();
            let (mut i, mut now) = (0usize, 0u64);
            run(n, &mut || {
                i = (i + 1) & 7;
                now += 1;
                s.enqueue(conns[i], Class::Bulk, black_box(4096)).unwrap();
                let grant = s
                    .next(|len| w.can_post(&dev, len.into()) && a.can_send())
                    .unwrap();
                let t = w.try_post(&mut dev, grant.len.into()).unwrap();
                let pb = a.try_send_data().unwrap();
                b.on_receive(MsgKind::Data, pb).unwrap();
                b.on_reposted(MsgKind::Data).unwrap();
                let back = b.try_send_data().unwrap();
                a.on_receive(MsgKind::Data, back).unwrap();
                a.on_reposted(MsgKind::Data).unwrap();
                black_box(w.on_complete(&mut dev, t.bytes, 10, now).unwrap());
            });
        }
        "all_one_msg_one_way" => {
            let (mut s, conns) = warm_sched(8);
            let (mut tx, mut rx) = credits();
            let mut w = adaptive_window();
            let mut dev = DeviceWindow::new(16 << 20).unwrap();
            let (mut i, mut now) = (0usize, 0u64);
            run(n, &mut || {
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
                black_box(w.on_complete(&mut dev, t.bytes, 10, now).unwrap());
            });
        }
        "all_one_msg_sq_cq" => {
            let (mut s, conns) = warm_sched(8);
            let (mut a, mut b) = credits();
            let mut w = adaptive_window();
            let mut dev = DeviceWindow::new(16 << 20).unwrap();
            let qcfg = QueueConfig::new(128, 65, 128 + 65).unwrap();
            let (mut qa, mut qb) = (QueueBudget::new(qcfg), QueueBudget::new(qcfg));
            for _ in 0..65 {
                qa.try_post_recv().unwrap();
                qb.try_post_recv().unwrap();
            }
            let (mut i, mut now) = (0usize, 0u64);
            run(n, &mut || {
                i = (i + 1) & 7;
                now += 1;
                s.enqueue(conns[i], Class::Bulk, black_box(4096)).unwrap();
                let grant = s
                    .next(|len| w.can_post(&dev, len.into()) && a.can_send() && qa.can_post_send())
                    .unwrap();
                let t = w.try_post(&mut dev, grant.len.into()).unwrap();
                let pb = a.try_send_data().unwrap();
                qa.try_post_send().unwrap();
                qb.on_recv_completion().unwrap();
                b.on_receive(MsgKind::Data, pb).unwrap();
                qb.try_post_recv().unwrap();
                b.on_reposted(MsgKind::Data).unwrap();
                let back = b.try_send_data().unwrap();
                qb.try_post_send().unwrap();
                qa.on_recv_completion().unwrap();
                a.on_receive(MsgKind::Data, back).unwrap();
                qa.try_post_recv().unwrap();
                a.on_reposted(MsgKind::Data).unwrap();
                qb.on_send_completion().unwrap();
                qa.on_send_completion().unwrap();
                black_box(w.on_complete(&mut dev, t.bytes, 10, now).unwrap());
            });
        }
        other => panic!("unknown bench {other}"),
    }
}
