//! The target check of `benches/accounting.rs`: is each `all_*` case at most 20 ns per
//! message?
//!
//! The cases run in interleaved slices: round after round, each case runs one slice of about
//! [`SLICE`] (the same number of messages every time), timed, until each has [`SLICES`]
//! slices. Each case is judged on the lower decile of its slices' time per message, and its
//! median and mean are printed beside it.
//!
//! Why interleaved, and why the lower decile. The loops are deterministic: every slice of a
//! case runs the same instructions (callgrind: `examples/ir_count.rs`). On a shared machine
//! other work only ever adds time, and on the 2-vCPU VM of this project it comes in phases of
//! seconds to minutes that slow every loop by up to 1.8× (2026-11-30: the gate-bound loop of
//! one `ir_count` binary took 16.4 and 28.1 ns per message a few seconds apart, and a
//! credit-only loop run beside it 6.8 and 10.0 ns; within one criterion run, the samples of
//! `all_one_msg_two_way` formed two clusters, about 8.8 and 15.9 ns). Run one after another,
//! as criterion runs them, a case that falls wholly into a slow phase reports the phase;
//! interleaved, every case meets the same phases, and the lower decile is the cost with the
//! least interference seen (minimum-type estimators suit one-sided noise: Chen & Revels,
//! "Robust benchmarking in noisy environments", 2016). The median and the mean are printed
//! beside it, so a run's exposure to slow phases shows. A check that ran wholly in a slow
//! phase shows it in every case at once (`all_one_msg_two_way`, the cheapest, well above its
//! figure in the crate README's table): run it again then.
//!
//! A filter (criterion's, the first argument that is not an option or an option's value) is
//! matched here as a substring of the case names (exactly with `--exact`); `--list`, `--test`
//! and `--profile-time` skip the check.

use std::hint::black_box;
use std::time::{Duration, Instant};

use super::hot_path::{
    AllOne, Batched, BulkChunks, Case, TWO_WAY, TWO_WAY_ADAPTIVE, TWO_WAY_BACKLOGGED, UPDATE,
};

/// Target per message (ns), for every `all_*` case.
pub const TARGET_NS: f64 = 20.0;

/// Slices per case.
const SLICES: usize = 100;

/// Wall time of one slice (about; its message count is fixed per case after a calibration
/// slice).
const SLICE: Duration = Duration::from_millis(60);

/// Runs `steps` iterations of `case`, timed (monomorphised: the step inlines into the loop).
#[inline(never)]
pub fn time_steps<C: Case>(case: &mut C, steps: u64) -> Duration {
    let start = Instant::now();
    for _ in 0..steps {
        black_box(case.step());
    }
    start.elapsed()
}

/// A case behind a trait object, so cases of different types take turns.
trait Sliced {
    /// Runs at least `messages` messages; their time and the messages run.
    fn slice(&mut self, messages: u64) -> (Duration, u64);
    /// The case's own check of what its loop did.
    fn check(&self);
}

struct S<C>(C);

impl<C: Case> Sliced for S<C> {
    fn slice(&mut self, messages: u64) -> (Duration, u64) {
        let per_step = self.0.messages();
        let steps = messages.div_ceil(per_step);
        (time_steps(&mut self.0, steps), steps * per_step)
    }

    fn check(&self) {
        self.0.check();
    }
}

/// The `all_*` cases, by bench name.
fn cases() -> Vec<(&'static str, Box<dyn Sliced>)> {
    vec![
        ("all_one_msg_two_way", Box::new(S(AllOne::<TWO_WAY>::new()))),
        ("all_one_msg_one_way", Box::new(S(AllOne::<UPDATE>::new()))),
        (
            "all_one_msg_two_way_adaptive",
            Box::new(S(AllOne::<TWO_WAY_ADAPTIVE>::new())),
        ),
        ("all_batch8_two_way_backlogged", Box::new(S(Batched::new()))),
        (
            "all_bulk_chunk_two_way_backlogged",
            Box::new(S(BulkChunks::new())),
        ),
        (
            "all_one_msg_two_way_backlogged",
            Box::new(S(AllOne::<TWO_WAY_BACKLOGGED>::new())),
        ),
    ]
}

/// Time per message (ns) of `took` over `messages`.
fn per_message(took: Duration, messages: u64) -> f64 {
    took.as_nanos() as f64 / messages as f64
}

/// Options of criterion's command line that take a value (`--name value`; `--name=value` is
/// one argument).
const TAKE_VALUE: [&str; 17] = [
    "-c",
    "--color",
    "--sample-size",
    "--warm-up-time",
    "--measurement-time",
    "--nresamples",
    "--noise-threshold",
    "--confidence-level",
    "--significance-level",
    "--save-baseline",
    "-s",
    "--baseline",
    "-b",
    "--baseline-lenient",
    "--load-baseline",
    "--output-format",
    "--plotting-backend",
];

/// From the bench's arguments (without the program name): whether to run the check (under
/// `cargo bench`, which passes `--bench`; not when listing, testing, profiling or running
/// ignored benchmarks), the filter if any (the filter `target` selects every case), and
/// whether it must match exactly.
pub fn wanted(args: &[String]) -> Option<(Option<&str>, bool)> {
    let skip = |a: &String| {
        ["--list", "--test", "--ignored"].contains(&a.as_str()) || a.starts_with("--profile-time")
    };
    if !args.iter().any(|a| a == "--bench") || args.iter().any(skip) {
        return None;
    }
    let mut filter = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if TAKE_VALUE.contains(&a.as_str()) {
            it.next();
        } else if !a.starts_with('-') && filter.is_none() {
            filter = Some(a.as_str());
        }
    }
    let exact = args.iter().any(|a| a == "--exact");
    Some((filter.filter(|&f| f != "target"), exact))
}

/// Runs the check on the `all_*` cases `filter` names (a substring of the name, or the whole
/// name when `exact`; all of them when there is none) and prints a `target` line per case.
pub fn run(filter: Option<&str>, exact: bool) {
    let mut cases: Vec<_> = cases()
        .into_iter()
        .filter(|(name, _)| {
            filter.is_none_or(|f| if exact { *name == f } else { name.contains(f) })
        })
        .collect();
    if cases.is_empty() {
        println!(
            "target check: no all_* case matches {:?} (a substring here, not a regex)",
            filter.unwrap_or_default()
        );
        return;
    }
    // Calibration (and warm-up): the messages of a slice of about `SLICE`.
    let sizes: Vec<u64> = cases
        .iter_mut()
        .map(|(_, case)| {
            let (took, n) = case.slice(200_000);
            let ns = per_message(took, n).max(0.1);
            (SLICE.as_nanos() as f64 / ns) as u64
        })
        .collect();
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(SLICES); cases.len()];
    let mut totals = vec![(Duration::ZERO, 0u64); cases.len()];
    for round in 0..SLICES {
        // Each round starts with the next case, so none always runs first.
        for k in 0..cases.len() {
            let i = (round + k) % cases.len();
            let (took, n) = cases[i].1.slice(sizes[i]);
            times[i].push(per_message(took, n));
            totals[i].0 += took;
            totals[i].1 += n;
        }
    }
    println!(
        "target check: {SLICES} interleaved slices of about {} ms per case, each case judged \
         on the lower decile of its slices (time per message)",
        SLICE.as_millis()
    );
    for (i, (name, case)) in cases.iter().enumerate() {
        case.check();
        let t = &mut times[i];
        t.sort_by(f64::total_cmp);
        let low = t[t.len() / 10];
        let median = t[t.len() / 2];
        let mean = per_message(totals[i].0, totals[i].1);
        let met = if low <= TARGET_NS { "met" } else { "missed" };
        println!(
            "target: {name} {low:.1} ns per message (lower decile; median {median:.1}, \
             mean {mean:.1}) <= {TARGET_NS} ns: {met}"
        );
    }
}
