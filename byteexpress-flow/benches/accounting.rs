//! Per-message cost of the flow-control hot path: credits (`try_send_data` + `on_receive`),
//! window (`try_post` + `on_complete`) and scheduler (`enqueue` + `next`), alone, and together
//! as the RDMA engine uses them (`offer` or `enqueue` + `next_by_class`, the admission gates of
//! `byteexpress_flow::gate` that the engine calls, `admit_round` before the scheduler is asked
//! and `admit_chunk` as its gate, `Window::charge`, `try_send_data_batch`, the queue budget,
//! the end of each round with `admit_update`, refusals counted per gate).
//!
//! Together (`all_*`), each message is accounted for at both ends of a link, as the RDMA engine
//! of `byteexpress-rpc` accounts for it, each end with a scheduler of 8 connections, its QP
//! window (static 256 KiB, the RDMA link's default), a capped device window, credits and a
//! queue budget (send slots, receives, CQ entries):
//! - `all_one_msg_two_way`: the ends taking turns (one message each way per iteration), each
//!   message's header returning the credit of the one before;
//! - `all_one_msg_one_way`: every message one way, credits back in explicit updates;
//! - `all_one_msg_two_way_adaptive`: two-way, with adaptive windows;
//! - under a standing backlog, every message through DRR: in the gate-bound state, one credit
//!   per end, so a round grants one message and ends for want of a credit
//!   (`all_one_msg_two_way_backlogged`); and in rounds of 8 chunks (as many as there are send
//!   slots) whose credits are taken at once and whose send completions, polled together,
//!   release the windows once (`all_batch8_two_way_backlogged`), as the RDMA engine of
//!   `byteexpress-rpc` batches them;
//! - bulk chunks, one per round (`all_bulk_chunk_two_way_backlogged`).
//!
//! Time is reported per message (a case may run several per iteration, `Case::messages`).
//!
//! The loops live in [`hot_path`], shared with `examples/ir_count.rs` (instruction counts).
//!
//! After criterion's report, the bench checks the target of 20 ns per message for every
//! `all_*` case (the per-message paths of the RDMA engine: the idle bypass, batched rounds,
//! bulk chunks, and one queued message per round) in interleaved slices, and prints one
//! `target` line per case: see [`target_check`] for how, and why the lower decile is judged.
//! `cargo bench -p byteexpress-flow --bench accounting -- target` runs the check alone.
//!
//! Run: `cargo bench -p byteexpress-flow --bench accounting`

mod hot_path;
mod target_check;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group};
use hot_path::{
    AllOne, Case, Credit2, Sched8, Sched8Backlogged, TWO_WAY, TWO_WAY_ADAPTIVE, TWO_WAY_BACKLOGGED,
    UPDATE,
};
use hot_path::{Batched, BulkChunks, WindowAdaptive, WindowStatic};

/// Benchmarks `case` as `name` (monomorphised: the step inlines into the timed loop), the
/// time reported per message ([`Case::messages`] per step).
fn run<C: Case>(g: &mut BenchmarkGroup<'_, WallTime>, name: &'static str, mut case: C) {
    let per_step = case.messages();
    g.bench_function(name, |b| {
        b.iter_custom(|messages| {
            let steps = messages.div_ceil(per_step);
            let took = target_check::time_steps(&mut case, steps);
            took.mul_f64(messages as f64 / (steps * per_step) as f64)
        });
    });
    case.check();
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
    // Under `cargo bench` (`cargo test --benches` runs each case once, without `--bench`).
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some((filter, exact)) = target_check::wanted(&args) {
        target_check::run(filter, exact);
    }
}
