//! One QP shared by two bulk pushers and a latency-critical puller, driven by the three
//! state machines of this crate against a simulated link (no RDMA, no threads, no clock):
//! the scheduler picks chunks, the adaptive window and the credits gate them, completions
//! come back from a single-server queue model of the link.
//!
//! Run: `cargo run -p byteexpress-flow --example qp_sim`

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use byteexpress_flow::credit::{CreditConfig, Credits, MsgKind, Piggyback};
use byteexpress_flow::sched::{Class, SchedConfig, Scheduler};
use byteexpress_flow::window::{AdaptiveConfig, DeviceWindow, Window};

/// Link: 12 500 bytes/µs (100 Gbit/s), 5 µs base round trip.
const BYTES_PER_US: u64 = 12_500;
const BASE_RTT_US: u64 = 5;

/// A simulated event.
#[derive(Debug)]
enum Ev {
    /// A chunk reached the peer and its completion came back.
    Completion {
        posted_us: u64,
        bytes: u64,
        msg: u64,
        last: bool,
        latency: bool,
        /// Flow-control fields of its header.
        pb: Piggyback,
    },
    /// A `CREDIT_UPDATE` from the peer arrived.
    Update(Piggyback),
}

/// Events by time (µs): a min-heap of (time, index into `store`).
#[derive(Debug, Default)]
struct Queue {
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    store: Vec<Option<Ev>>,
}

impl Queue {
    fn push(&mut self, at_us: u64, ev: Ev) {
        self.heap.push(Reverse((at_us, self.store.len())));
        self.store.push(Some(ev));
    }

    fn pop_due(&mut self, now_us: u64) -> Option<(u64, Ev)> {
        let &Reverse((t, i)) = self.heap.peek()?;
        if t > now_us {
            return None;
        }
        self.heap.pop();
        Some((t, self.store[i].take().expect("popped once")))
    }
}

fn main() {
    let mut sched = Scheduler::new(SchedConfig::default());
    let mut window = Window::adaptive(
        AdaptiveConfig::new(16 * 1024, 1 << 20, 15) // [16 KiB, 1 MiB], target 15 µs
            .and_then(|c| c.with_initial(64 * 1024))
            .expect("valid parameters"),
    );
    let mut device = DeviceWindow::unlimited();
    let grant = CreditConfig::new(32).expect("grant >= 1");
    let (mut us, mut peer) = (Credits::new(grant), Credits::new(grant));

    let pushers = [sched.open(), sched.open()];
    let puller = sched.open();
    for &p in &pushers {
        for _ in 0..8 {
            sched.enqueue(p, Class::Bulk, 1 << 20).expect("open"); // 8 × 1 MiB each
        }
    }

    let mut events = Queue::default();
    let mut link_free_at = 0u64;
    let mut now = 0u64;
    let mut pull_enqueued = std::collections::HashMap::new();
    let mut pull_latency = Vec::new();
    let mut bulk_bytes = [0u64; 2];
    let mut max_in_flight = 0u64;
    while now < 2_000 {
        // A 256-byte pull every 20 µs.
        if now.is_multiple_of(20) && now < 1_500 {
            let id = sched.enqueue(puller, Class::Latency, 256).expect("open");
            pull_enqueued.insert(id.0, now);
        }
        // Post everything the window and the credits admit.
        while let Some(g) = sched.next(|len| window.can_post(&device, len.into()) && us.can_send())
        {
            let ticket = window
                .try_post(&mut device, g.len.into())
                .expect("admitted");
            let pb = us.try_send_data().expect("credit checked");
            // Single-server link: serialisation after what is queued, then propagation.
            link_free_at = link_free_at.max(now) + ticket.bytes.div_ceil(BYTES_PER_US);
            let done = link_free_at + BASE_RTT_US;
            events.push(
                done,
                Ev::Completion {
                    posted_us: now,
                    bytes: ticket.bytes,
                    msg: g.msg.0,
                    last: g.last,
                    latency: g.class == Class::Latency,
                    pb,
                },
            );
            if let Some(i) = pushers.iter().position(|&p| p == g.conn) {
                bulk_bytes[i] += ticket.bytes;
            }
            max_in_flight = max_in_flight.max(window.in_flight());
        }
        // Deliver what is due by the next microsecond.
        now += 1;
        while let Some((t, ev)) = events.pop_due(now) {
            match ev {
                Ev::Completion {
                    posted_us,
                    bytes,
                    msg,
                    last,
                    latency,
                    pb,
                } => {
                    window
                        .on_complete(&mut device, bytes, t - posted_us, t)
                        .expect("posted");
                    // The peer applies the header, consumes and re-posts the buffer, and
                    // (having no data of its own) returns credits by explicit update.
                    peer.on_receive(MsgKind::Data, pb).expect("credited");
                    peer.on_reposted(MsgKind::Data).expect("received");
                    if let Some(update) = peer.poll_update() {
                        events.push(t + BASE_RTT_US / 2, Ev::Update(update));
                    }
                    if latency && last {
                        pull_latency.push(t - pull_enqueued[&msg]);
                    }
                }
                Ev::Update(pb) => {
                    us.on_receive(MsgKind::CreditUpdate, pb)
                        .expect("valid update");
                    // Re-post the update slot; our next data message returns it.
                    us.on_reposted(MsgKind::CreditUpdate)
                        .expect("slot consumed");
                }
            }
        }
    }
    pull_latency.sort_unstable();
    let s = window.stats();
    println!("bulk bytes sent per pusher: {bulk_bytes:?}");
    println!(
        "pulls: {} done, latency p50 {} µs, max {} µs",
        pull_latency.len(),
        pull_latency[pull_latency.len() / 2],
        pull_latency[pull_latency.len() - 1]
    );
    println!(
        "window: cap now {} B, max in flight {} B, {} increases, {} decreases",
        window.cap(),
        max_in_flight,
        s.increases,
        s.decreases
    );
}
