//! The loops of `benches/accounting.rs` ([`hot_path`]), run a fixed number of times, for
//! instruction counts: `valgrind --tool=callgrind target/release/examples/ir_count NAME N` for
//! N = 0 and N = n messages; the difference of the totals over n is the cost of one message
//! (plus a call per iteration).
//!
//! Run: `cargo build --release -p byteexpress-flow --example ir_count`

#[path = "../benches/hot_path/mod.rs"]
mod hot_path;

use std::hint::black_box;

use hot_path::{
    AllOne, Case, Credit2, Sched8, Sched8Backlogged, TWO_WAY, TWO_WAY_ADAPTIVE, TWO_WAY_BACKLOGGED,
    UPDATE,
};
use hot_path::{Batched, BulkChunks, WindowAdaptive, WindowStatic};

/// Runs `case` for `n` messages (`n / messages()` iterations, rounded up) through a reference
/// the optimiser cannot see through, so the state stays in memory between iterations (as
/// between messages in a transport).
fn run(n: u64, case: &mut dyn Case) {
    let case = black_box(case);
    for _ in 0..n.div_ceil(case.messages()) {
        black_box(case.step());
    }
    case.check();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(name), Some(n)) = (args.get(1), args.get(2).and_then(|n| n.parse().ok())) else {
        eprintln!("usage: ir_count NAME N, NAME one of {:?}", NAMES);
        std::process::exit(2);
    };
    if !with_case(name, &mut |case| run(n, case)) {
        eprintln!("unknown case {name}; one of {:?}", NAMES);
        std::process::exit(2);
    }
}

/// Every case by name, in report order.
const NAMES: [&str; 11] = [
    "credit_2msgs",
    "window_static",
    "window_adaptive",
    "sched_8conns",
    "sched_8conns_backlogged",
    "all_one_msg_two_way",
    "all_one_msg_one_way",
    "all_one_msg_two_way_backlogged",
    "all_batch8_two_way_backlogged",
    "all_bulk_chunk_two_way_backlogged",
    "all_one_msg_two_way_adaptive",
];

/// Runs `f` with the case called `name`, if there is one.
fn with_case(name: &str, f: &mut dyn FnMut(&mut dyn Case)) -> bool {
    match name {
        "credit_2msgs" => f(&mut Credit2::new()),
        "window_static" => f(&mut WindowStatic::new()),
        "window_adaptive" => f(&mut WindowAdaptive::new()),
        "sched_8conns" => f(&mut Sched8::new()),
        "sched_8conns_backlogged" => f(&mut Sched8Backlogged::new()),
        "all_one_msg_two_way" => f(&mut AllOne::<TWO_WAY>::new()),
        "all_one_msg_one_way" => f(&mut AllOne::<UPDATE>::new()),
        "all_one_msg_two_way_backlogged" => f(&mut AllOne::<TWO_WAY_BACKLOGGED>::new()),
        "all_batch8_two_way_backlogged" => f(&mut Batched::new()),
        "all_bulk_chunk_two_way_backlogged" => f(&mut BulkChunks::new()),
        "all_one_msg_two_way_adaptive" => f(&mut AllOne::<TWO_WAY_ADAPTIVE>::new()),
        _ => return false,
    }
    true
}
