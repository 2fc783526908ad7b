//! Per-message cost of the flow-control hot path: credits (`try_send_data` + `on_receive`),
//! window (`try_post` + `on_complete`) and scheduler (`enqueue` + `next`), alone and together.
//!
//! Together (`all_*`), each message is accounted for at both ends of a link, each end with a
//! scheduler of 8 connections, its QP window (static 256 KiB, the RDMA link's default) and a
//! capped device window:
//! - `all_one_msg_two_way`: the ends taking turns (one message each way per iteration), each
//!   message's header returning the credit of the one before;
//! - `all_one_msg_one_way`: every message one way, credits back in explicit updates;
//! - `all_one_msg_two_way_sq_cq`: two-way, with the send-slot and CQ-entry accounting of
//!   `QueueBudget`;
//! - `all_one_msg_two_way_adaptive`: two-way, with adaptive windows;
//! - under a standing backlog, one message at a time through DRR
//!   (`all_one_msg_two_way_backlogged`), and as the RDMA engine of `byteexpress-rpc` accounts
//!   for it: in rounds of 8 chunks whose credits are taken at once and whose send
//!   completions, polled together, release the windows once (`all_batch8_two_way_backlogged`);
//! - bulk chunks, one per round (`all_bulk_chunk_two_way_backlogged`).
//!
//! Time is reported per message (a case may run several per iteration, `Case::messages`).
//!
//! The loops live in [`hot_path`], shared with `examples/ir_count.rs` (instruction counts).
//!
//! After criterion's report, one line per `all_*` case measured compares its mean time per
//! message (every timed iteration, warm-up included) with the target of 20 ns, saying whether
//! the case is on the hot path ([`HOT_PATH`]) or the gate-bound one.
//!
//! Run: `cargo bench -p byteexpress-flow --bench accounting`

mod hot_path;

use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group};
use hot_path::{
    AllOne, Case, Credit2, Sched8, Sched8Backlogged, TWO_WAY, TWO_WAY_ADAPTIVE, TWO_WAY_BACKLOGGED,
    TWO_WAY_WITH_QUEUES, UPDATE,
};
use hot_path::{Batched, BulkChunks, WindowAdaptive, WindowStatic};

/// The cases of the hot path: what the RDMA engine does per message when it is not waiting
/// for its peer (crate README, Cost). Their target: at most [`TARGET_NS`] per message.
const HOT_PATH: [&str; 6] = [
    "all_one_msg_two_way",
    "all_one_msg_one_way",
    "all_one_msg_two_way_sq_cq",
    "all_one_msg_two_way_adaptive",
    "all_batch8_two_way_backlogged",
    "all_bulk_chunk_two_way_backlogged",
];

/// Target per message on the hot path (ns).
const TARGET_NS: f64 = 20.0;

/// Per case: the time and the messages of every timed iteration.
static MEASURED: Mutex<Vec<(&'static str, Duration, u64)>> = Mutex::new(Vec::new());

/// Benchmarks `case` as `name` (monomorphised: the step inlines into the timed loop), the
/// time reported per message ([`Case::messages`] per step), and keeps the totals for the
/// target lines.
fn run<C: Case>(g: &mut BenchmarkGroup<'_, WallTime>, name: &'static str, mut case: C) {
    let per_step = case.messages();
    let (mut spent, mut done) = (Duration::ZERO, 0u64);
    g.bench_function(name, |b| {
        b.iter_custom(|messages| {
            let steps = messages.div_ceil(per_step);
            let start = Instant::now();
            for _ in 0..steps {
                black_box(case.step());
            }
            let took = start.elapsed();
            spent += took;
            done += steps * per_step;
            took.mul_f64(messages as f64 / (steps * per_step) as f64)
        });
    });
    case.check();
    MEASURED.lock().unwrap().push((name, spent, done));
}

/// Prints, for each `all_*` case measured, its mean time per message against the target.
fn report_targets() {
    for &(name, spent, done) in MEASURED.lock().unwrap().iter() {
        // Criterion's test mode (`cargo test --benches`) runs each case once: nothing to judge.
        if !name.starts_with("all_") || done < 1_000_000 {
            continue;
        }
        let ns = spent.as_nanos() as f64 / done as f64;
        let met = if ns <= TARGET_NS { "met" } else { "missed" };
        let path = if HOT_PATH.contains(&name) {
            "hot path"
        } else {
            "gate-bound"
        };
        println!("target ({path}): {name} {ns:.1} ns <= {TARGET_NS} ns per message: {met}");
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("per_message");
    run(&mut g, "credit_2msgs", Credit2::new());
    run(&mut g, "window_static", WindowStatic::new());
    run(&mut g, "window_adaptive", WindowAdaptive::new());
    run(&mut g, "sched_8conns", Sched8::new());
    run(&mut g, "sched_8conns_backlogged", Sched8Backlogged::new());
    run(&mut g, "all_one_msg_two_way", AllOne::<TWO_WAY>::new());
    run(&mut g, "all_one_msg_one_way", AllOne::<UPDATE>::new());
    run(
        &mut g,
        "all_one_msg_two_way_backlogged",
        AllOne::<TWO_WAY_BACKLOGGED>::new(),
    );
    run(
        &mut g,
        "all_one_msg_two_way_sq_cq",
        AllOne::<TWO_WAY_WITH_QUEUES>::new(),
    );
    run(&mut g, "all_batch8_two_way_backlogged", Batched::new());
    run(
        &mut g,
        "all_bulk_chunk_two_way_backlogged",
        BulkChunks::new(),
    );
    run(
        &mut g,
        "all_one_msg_two_way_adaptive",
        AllOne::<TWO_WAY_ADAPTIVE>::new(),
    );
    g.finish();
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    report_targets();
}
