//! Per-message cost of the flow-control hot path: credits (`try_send_data` + `on_receive`),
//! window (`try_post` + `on_complete`) and scheduler (`enqueue` + `next`), alone and together
//! (one message per iteration: `all_one_msg_two_way`, where the ends take turns and each
//! message's header returns the credit of the one before, and `all_one_msg_one_way`, where
//! explicit updates do), and together with the send-slot and CQ-entry accounting of
//! `QueueBudget` (`all_one_msg_two_way_sq_cq`). The loops live in
//! [`hot_path`], shared with `examples/ir_count.rs` (instruction counts).
//!
//! Run: `cargo bench -p byteexpress-flow --bench accounting`

mod hot_path;

use std::hint::black_box;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use hot_path::{
    AllOne, Case, Credit2, Sched8, Sched8Backlogged, TWO_WAY, TWO_WAY_BACKLOGGED,
    TWO_WAY_WITH_QUEUES, UPDATE,
};
use hot_path::{WindowAdaptive, WindowStatic};

/// Benchmarks `case` as `name` (monomorphised: the step inlines into criterion's loop).
fn run<C: Case>(g: &mut BenchmarkGroup<'_, WallTime>, name: &str, mut case: C) {
    g.bench_function(name, |b| b.iter(|| black_box(case.step())));
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
    run(
        &mut g,
        "all_one_msg_two_way_sq_cq",
        AllOne::<TWO_WAY_WITH_QUEUES>::new(),
    );
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
