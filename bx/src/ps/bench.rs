//! `bx ps bench`: starts `bx ps serve` as a child process (or takes the server at
//! `--server ADDR`) and drives it with Pull (and optionally Push) calls whose keys follow a
//! Zipf law, over each transport one after the other on the same server ([`super::clients`],
//! [`super::floor`]). Reports latency (hdrhistogram), throughput, CPU per call of client and
//! server (`/proc/<pid>/stat`; the server's only when the bench started it) and syscalls per
//! call ([`super::usage`]). With `--rounds N` the transports run interleaved N times and
//! [`super::rounds`] takes per-row medians.
//!
//! The workload measures transports, not itself: the Zipf keys are drawn before any row, into
//! a ring per worker ([`byteexpress_ps::KeyRing`]), and the server's store gathers rows without
//! locks ([`byteexpress_ps::Store`]).
//!
//! The client side runs on one current-thread tokio runtime (the caller's). Before measuring,
//! each transport must return rows equal to the deterministic init for keys the workload never
//! touches, and every measured call is checked for shape: a failed or malformed call aborts
//! the bench, so broken calls are never measured.
//!
//! The child server dies with the bench: SIGINT and SIGTERM stop the bench, which kills the
//! child before it exits ([`run_until_signal`]); for SIGKILL, which no process can handle, the
//! child asked the kernel for SIGKILL when its parent dies (`--parent-pid`, `PR_SET_PDEATHSIG`).
//!
//! Fleet mode (`--servers N --replicas R`): each row starts a fleet of its own, N shards of R
//! replicas, each a `bx ps serve` child ([`super::fleet`]). Each call is split over its keys'
//! shards ([`byteexpress_ps::shard`]) into concurrent sub-calls, one per shard, to that
//! shard's replica set; the call succeeds when all of them do. Calls run under a deadline
//! (`--deadline-ms`); a failed call is counted, not fatal. `--fault` strikes replica 0 of
//! shard 0 during the measured phase. The channels of a fleet are built in one place,
//! `clients::shard_channel`, and its counters read in one, `FleetCounts::of`.

use std::time::Duration;

use byteexpress::ReplicaSet;
use byteexpress_ps::native;
use byteexpress_ps::{Call, KeyRing, Workload, cpu, decode_f32s, init_value};
use bytes::Bytes;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

pub use super::args::{ALL_TRANSPORTS, BenchArgs, Fault, Policy, Preset};
use super::clients::{Failure, TableClient, connect, connect_fleet, is_tls};
use super::fleet::Servers;
use super::floor;
use super::report::cdf;
use super::size::show_size;
use super::usage::{Usage, Used};

/// Table the bench uses (the server's default table).
pub(super) const TABLE: &str = "emb";
/// Keys checked against the init before measuring; taken above `--keys`, which the workload
/// never reaches.
const CHECK_KEYS: u64 = 64;
/// Rows that run against one server the bench starts (its native and floor ports, or none).
const SINGLE_ONLY: [&str; 4] = ["floor/tcp", "native/rdma", "native/tcp", "tonic/inproc"];

/// One transport's results.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The transport as negotiated, with the device of an RDMA link: `bx/rdma(rxe0)`,
    /// `bx/rdma(soft0)`, `bx/tcp` or `grpc/h2`.
    pub transport: String,
    /// Calls completed in the measured phase.
    pub calls: u64,
    /// Mean latency, µs.
    pub mean_us: f64,
    /// Median latency, µs.
    pub p50_us: u64,
    /// 99th percentile latency, µs.
    pub p99_us: u64,
    /// 95th percentile latency, µs (JSON only: e.g. a hedging delay at the healthy p95).
    pub p95_us: u64,
    /// 99.9th percentile latency, µs.
    pub p999_us: u64,
    /// Throughput, calls per second.
    pub calls_per_sec: f64,
    /// Client process CPU time (user + system) per call, µs.
    pub client_cpu_us: f64,
    /// Server process CPU time per call, µs (a fleet's: all its processes together); `None`
    /// for a server the bench did not start, and for tonic/inproc (its server runs in the
    /// client process: all its CPU is client CPU).
    pub server_cpu_us: Option<f64>,
    /// System calls of the client process per call in the measured phase (`perf stat -e
    /// raw_syscalls:sys_enter`); `None` without perf.
    pub client_syscalls: Option<f64>,
    /// System calls of the server process per call; `None` without perf, for a server the
    /// bench did not start, for a fleet, and for tonic/inproc.
    pub server_syscalls: Option<f64>,
    /// The round (from 0) the row ran in (`--rounds`).
    pub round: u32,
    /// Latency CDF: (latency µs, fraction of calls at or below it), rising in both.
    pub cdf: Vec<(f64, f64)>,
    /// A fleet's counters; `None` for a single server (the table and JSON then have no
    /// fleet columns). In fleet mode the latencies are those of every call that ended, failed
    /// ones included (a failed call's caller waited that long too); `calls` and `calls/s`
    /// count only the successful ones.
    pub fleet: Option<FleetCounts>,
    /// Gradient bytes per call of a dense push row (`--push-bytes`); `None` for the Zipf
    /// workload (the table and JSON then have no push columns).
    pub push_bytes: Option<u64>,
    /// Of a dense push row: gradient MiB (2^20 bytes) pushed per second, one way.
    pub mib_per_sec: Option<f64>,
    /// What the row's connections cost while idle after its calls (`--idle`); `None` without
    /// an idle phase.
    pub idle: Option<Idle>,
}

/// CPU while a row's connections (`--workers` of them; 4 for `floor/tcp`) stay open without
/// calls (`--idle`), in % of one core: CPU time (user + system, `/proc`, clock ticks) over the
/// idle phase's wall time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Idle {
    /// Wall time of the idle phase, s.
    pub seconds: f64,
    /// The client process, % of one core.
    pub client_core_pct: f64,
    /// The server process, % of one core; `None` as for [`Row::server_cpu_us`].
    pub server_core_pct: Option<f64>,
}

impl Row {
    /// The row's name in a plot: the transport, with the push size of a dense push row.
    pub fn label(&self) -> String {
        match self.push_bytes {
            Some(b) => format!("{} push {}", self.transport, show_size(b)),
            None => self.transport.clone(),
        }
    }
}

/// What a fleet's row counts besides its calls (`FleetCounts::of`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FleetCounts {
    /// Calls that failed in the measured phase (a sub-call's status, or the deadline).
    pub failed: u64,
    /// Ejections by outlier detection during the measured phase, summed over the shards' replica sets;
    /// `None` for an h2 row (tonic's balancer has none).
    pub ejections: Option<u64>,
    /// Retries (by the policy, and transparent ones) summed over the shards' channels; `None`
    /// for an h2 row.
    pub retried: Option<u64>,
    /// Hedged attempts after the first, summed as `retried`.
    pub hedged: Option<u64>,
}

impl FleetCounts {
    /// The counters of the shards' replica `sets` now (`ejections` `None` without sets: an
    /// h2 row; `failed` 0: the call loops count those): the one place a fleet's counters are
    /// read.
    pub(super) fn of(sets: &[ReplicaSet]) -> FleetCounts {
        let sum =
            |f: &dyn Fn(&ReplicaSet) -> u64| (!sets.is_empty()).then(|| sets.iter().map(f).sum());
        FleetCounts {
            failed: 0,
            ejections: sum(&|s| s.stats().ejections),
            retried: sum(&|s| {
                let r = s.retry_stats();
                r.retries + r.transparent_retries
            }),
            hedged: sum(&|s| s.retry_stats().hedges),
        }
    }

    /// What was counted from `before` to `self`.
    fn since(self, before: FleetCounts) -> FleetCounts {
        let diff = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| a - b);
        FleetCounts {
            failed: self.failed - before.failed,
            ejections: diff(self.ejections, before.ejections),
            retried: diff(self.retried, before.retried),
            hedged: diff(self.hedged, before.hedged),
        }
    }
}

/// Why [`run_until_signal`] ended without rows.
#[derive(Debug)]
#[non_exhaustive]
pub enum BenchError {
    /// A signal stopped the bench: its name and the exit code to use (128 + number).
    Signal(&'static str, u8),
    /// The bench failed.
    Failed(String),
}

/// The keys the check pulls: above `--keys`, which the workload never reaches.
fn check_keys(args: &BenchArgs) -> Vec<u64> {
    (0..CHECK_KEYS).map(|i| args.keys + i * 7919).collect()
}

/// Compares pulled `values` of `keys` with the deterministic init.
fn check_values(keys: &[u64], values: &[u8], dim: usize) -> Result<(), String> {
    let v = decode_f32s(values);
    if v.len() != keys.len() * dim {
        return Err(format!(
            "check pull: {} values for {} keys of dim {dim}",
            v.len(),
            keys.len()
        ));
    }
    for (j, &k) in keys.iter().enumerate() {
        for i in 0..dim {
            let want = init_value(TABLE, k, i as u32);
            if v[j * dim + i] != want {
                return Err(format!(
                    "check pull: key {k} value {i} is {} not {want}",
                    v[j * dim + i]
                ));
            }
        }
    }
    Ok(())
}

/// Pulls keys the workload never touches and compares every value with the init.
async fn check(client: &TableClient, args: &BenchArgs) -> Result<(), String> {
    let keys = check_keys(args);
    let values = client.pull(keys.clone()).await.map_err(|e| match e {
        Failure::Status(e) => format!("check pull: {e}"),
        Failure::Malformed(e) => format!("check {e}"),
    })?;
    check_values(&keys, &values, args.dim)
}

/// What a phase (or one of its loops) did.
#[derive(Debug, Default)]
struct Outcome {
    /// Calls that succeeded.
    calls: u64,
    /// Calls that failed (in fleet mode; otherwise a failure ends the bench).
    failed: u64,
}

/// One loop of sequential calls until `until`, the keys of each the next of `ring` (drawn
/// before the phase); latencies go to `hist` when given. A failed call is counted when
/// `tolerate` (a fleet), else it ends the bench; a malformed answer always does.
#[allow(clippy::too_many_arguments)]
async fn call_loop(
    client: TableClient,
    args: &BenchArgs,
    ring: &KeyRing,
    grads: Bytes,
    seed: u64,
    until: Instant,
    mut hist: Option<&mut Histogram<u64>>,
    dense: Option<&[u64]>,
) -> Result<Outcome, String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let tolerate = args.servers.is_some();
    let mut out = Outcome::default();
    while Instant::now() < until {
        let call = match dense {
            Some(keys) => Call::Push(keys.to_vec()),
            None => {
                let keys = ring.next_keys().to_vec();
                if rng.random::<f64>() < args.push_ratio {
                    Call::Push(keys)
                } else {
                    Call::Pull(keys)
                }
            }
        };
        let t0 = Instant::now();
        let (what, res) = match call {
            Call::Push(keys) => ("push", client.push(keys, &grads).await),
            Call::Pull(keys) => ("pull", client.pull(keys).await.map(drop)),
        };
        match res {
            Ok(()) => out.calls += 1,
            Err(Failure::Status(e)) if tolerate => {
                tracing::debug!(code = ?e.code(), message = e.message(), "{what} failed");
                out.failed += 1;
            }
            Err(Failure::Status(e)) => return Err(format!("{what}: {e}")),
            Err(Failure::Malformed(e)) => return Err(e),
        }
        let us = t0.elapsed().as_micros() as u64;
        if let Some(h) = hist.as_deref_mut() {
            h.saturating_record(us.max(1));
        }
    }
    Ok(out)
}

/// The buffers of a dense push row: its keys and one gradient per call loop.
struct Dense {
    keys: Vec<u64>,
    grads: Vec<Bytes>,
}

impl Dense {
    /// `bytes` of gradient per call, `loops` buffers (one per worker, at most `--in-flight`),
    /// each allocated once and written in full here, so every page is faulted in before any
    /// call is timed.
    fn new(args: &BenchArgs, bytes: u64) -> Dense {
        let loops = args.push_loops();
        let base = args.keys + CHECK_KEYS * 7919;
        let keys = (base..base + args.push_keys(bytes)).collect();
        let grads = (0..loops)
            .map(|_| {
                let mut v = vec![0u8; bytes as usize];
                for c in v.chunks_exact_mut(4) {
                    c.copy_from_slice(&0.001f32.to_le_bytes());
                }
                Bytes::from(v)
            })
            .collect();
        Dense { keys, grads }
    }
}

/// The Zipf keys of the bench, drawn before any row: one ring of `--ring-keys` keys shared by
/// every call loop (and floor connection) of every row and round, each call taking the next
/// keys of it (one `fetch_add`; the client runs on one thread, so it is never contended).
/// One ring for all, not one per worker: a run with one call in flight goes through it as
/// fast as one with 64.
#[derive(Debug)]
pub(super) struct Rings {
    ring: KeyRing,
    /// Calls the ring holds before it wraps.
    calls: usize,
}

impl Rings {
    /// Draws the ring of `args`; prints what the drawing cost. Errors: the workload's
    /// settings.
    fn draw(args: &BenchArgs) -> Result<Rings, String> {
        let workload = Workload::new(args.keys, args.skew, args.keys_per_call, args.push_ratio)
            .map_err(|e| e.to_string())?;
        let t0 = std::time::Instant::now();
        let ring = workload.ring(args.ring_keys, &mut SmallRng::seed_from_u64(1));
        let took = t0.elapsed();
        eprintln!(
            "bx ps bench: keys drawn before measuring: a ring of {} keys (zipf {} over {} keys) in {:.2} s ({:.0} ns per key); no key is drawn in a measured phase",
            ring.len(),
            args.skew,
            args.keys,
            took.as_secs_f64(),
            took.as_nanos() as f64 / ring.len().max(1) as f64
        );
        Ok(Rings {
            calls: ring.len() / args.keys_per_call.max(1),
            ring,
        })
    }

    /// The ring of call loop or connection `i` (the one ring).
    pub(super) fn of(&self, _i: usize) -> &KeyRing {
        &self.ring
    }

    /// Times the ring has wrapped so far.
    fn wraps(&self) -> usize {
        self.ring.calls_taken() / self.calls.max(1)
    }
}

/// Runs `in_flight` call loops over `clients` for `secs` (a dense push row: one loop per
/// gradient buffer); returns what they did, latencies and the time taken. Loop `i` uses
/// client `i % clients` and that worker's key ring.
async fn phase(
    clients: &[TableClient],
    args: &BenchArgs,
    rings: &Rings,
    secs: f64,
    record: bool,
    seed: u64,
    dense: Option<&Dense>,
) -> Result<(Outcome, Histogram<u64>, Duration), String> {
    let workload = Workload::new(args.keys, args.skew, args.keys_per_call, args.push_ratio)
        .map_err(|e| e.to_string())?;
    let grads = workload.grads(args.dim);
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(secs);
    let loops = dense.map_or(args.in_flight.max(1), |d| d.grads.len());
    let mut hists: Vec<Histogram<u64>> = (0..loops)
        .map(|_| Histogram::new_with_bounds(1, 60_000_000, 3).expect("static bounds"))
        .collect();
    let runs = hists.iter_mut().enumerate().map(|(i, h)| {
        let w = i % clients.len();
        call_loop(
            clients[w].clone(),
            args,
            rings.of(w),
            dense.map_or_else(|| grads.clone(), |d| d.grads[i].clone()),
            seed.wrapping_mul(1000).wrapping_add(i as u64),
            until,
            record.then_some(h),
            dense.map(|d| &d.keys[..]),
        )
    });
    let outcome =
        futures::future::try_join_all(runs)
            .await?
            .into_iter()
            .fold(Outcome::default(), |a, b| Outcome {
                calls: a.calls + b.calls,
                failed: a.failed + b.failed,
            });
    let took = t0.elapsed();
    let mut total = Histogram::new_with_bounds(1, 60_000_000, 3).expect("static bounds");
    for h in &hists {
        total.add(h).map_err(|e| e.to_string())?;
    }
    Ok((outcome, total, took))
}

/// A row's numbers from its measured phase: `calls` in `took`, latencies `hist`, costs `used`.
#[allow(clippy::too_many_arguments)]
fn row_of(
    label: String,
    calls: u64,
    hist: &Histogram<u64>,
    took: Duration,
    used: Used,
    in_process_server: bool,
    fleet: Option<FleetCounts>,
    push: Option<u64>,
) -> Row {
    let per_sec = cpu::clock_ticks_per_sec();
    let per_call = |ticks: u64| {
        cpu::ticks_to_duration(ticks, per_sec).as_secs_f64() * 1e6 / calls.max(1) as f64
    };
    let per_call_n = |n: u64| n as f64 / calls.max(1) as f64;
    Row {
        transport: label,
        calls,
        mean_us: hist.mean(),
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        p95_us: hist.value_at_quantile(0.95),
        p999_us: hist.value_at_quantile(0.999),
        calls_per_sec: calls as f64 / took.as_secs_f64(),
        client_cpu_us: per_call(used.client_ticks),
        server_cpu_us: if in_process_server {
            None
        } else {
            used.server_ticks.map(per_call)
        },
        client_syscalls: used.client_syscalls.map(per_call_n),
        server_syscalls: if in_process_server {
            None
        } else {
            used.server_syscalls.map(per_call_n)
        },
        round: 0,
        cdf: cdf(hist),
        fleet,
        push_bytes: push,
        mib_per_sec: push.map(|b| (b * calls) as f64 / took.as_secs_f64() / f64::from(1u32 << 20)),
        idle: None,
    }
}

/// Holds the connections of a row open and idle for `--idle` seconds (the caller keeps them)
/// and measures both processes' CPU meanwhile; `None` without `--idle` and for a fleet. For a
/// server the bench did not start (`--server`) only the client's CPU is known (the server's is
/// `None`).
/// Errors: `/proc`.
async fn idle_phase(
    servers: &Servers,
    args: &BenchArgs,
    in_process_server: bool,
) -> Result<Option<Idle>, String> {
    if args.idle <= 0.0 || servers.is_fleet() {
        return Ok(None);
    }
    let usage = Usage::start(servers.single_pid(), servers.cpu_ticks(None), false).await?;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.idle)).await;
    let used = usage.stop(servers.cpu_ticks(None)).await?;
    let seconds = t0.elapsed().as_secs_f64();
    let per_sec = cpu::clock_ticks_per_sec();
    let pct = |ticks: u64| cpu::ticks_to_duration(ticks, per_sec).as_secs_f64() / seconds * 100.0;
    Ok(Some(Idle {
        seconds,
        client_core_pct: pct(used.client_ticks),
        server_core_pct: if in_process_server {
            None
        } else {
            used.server_ticks.map(pct)
        },
    }))
}

async fn run_transport(
    transport: &str,
    servers: &mut Servers,
    args: &BenchArgs,
    rings: &Rings,
    seed: u64,
    push: Option<u64>,
) -> Result<Row, String> {
    if transport == "floor/tcp" {
        return run_floor(servers, args, rings, seed).await;
    }
    let (clients, sets, label) = if servers.is_fleet() {
        let (table, sets, label) = connect_fleet(transport, servers, args).await?;
        (vec![table], sets, label)
    } else {
        let first = servers.first();
        let (clients, label) = connect(
            transport,
            &first.addr,
            first.native.as_deref(),
            args.workers,
            args,
        )
        .await?;
        (clients, Vec::new(), label)
    };
    check(&clients[0], args).await?;
    let dense = push.map(|b| Dense::new(args, b));
    phase(
        &clients,
        args,
        rings,
        args.warmup,
        false,
        seed,
        dense.as_ref(),
    )
    .await?;
    let counted0 = FleetCounts::of(&sets);
    let usage = Usage::start(
        servers.single_pid(),
        servers.cpu_ticks(None),
        !servers.is_fleet(),
    )
    .await?;
    let measured = phase(
        &clients,
        args,
        rings,
        args.duration,
        true,
        seed + 1,
        dense.as_ref(),
    );
    let ((outcome, hist, took), injected) = match args.fault {
        Some(f) if servers.is_fleet() => {
            let (m, i) = tokio::join!(measured, servers.inject(f, args.fault_at()));
            (m?, Some(i?))
        }
        _ => (measured.await?, None),
    };
    let used = usage
        .stop(servers.cpu_ticks(injected.as_ref().and_then(|i| i.killed())))
        .await?;
    if let Some(i) = &injected {
        let line = servers.report(i).await;
        eprintln!("bx ps bench: {transport}: {line}");
    }
    let fleet = servers.is_fleet().then(|| FleetCounts {
        failed: outcome.failed,
        ..FleetCounts::of(&sets).since(counted0)
    });
    let in_process = transport == "tonic/inproc";
    let idle = idle_phase(servers, args, in_process).await?;
    drop(clients);
    Ok(Row {
        idle,
        ..row_of(
            label,
            outcome.calls,
            &hist,
            took,
            used,
            in_process,
            fleet,
            push,
        )
    })
}

/// The `floor/tcp` row ([`super::floor`]): checks a pull against the init on a connection of
/// its own, then drives `--workers` connections with `--in-flight` calls spread over them,
/// for the warm-up and then the measured phase.
async fn run_floor(
    servers: &Servers,
    args: &BenchArgs,
    rings: &Rings,
    seed: u64,
) -> Result<Row, String> {
    let t = "floor/tcp";
    let addr = servers.first().floor.clone().ok_or_else(|| {
        format!(
            "{t}: --transports {t}: the server has no floor port (a server the bench starts has)"
        )
    })?;
    let fail = |e: floor::FloorError| format!("{t}: {e}");
    let mut one = floor::connect(&addr)
        .await
        .map_err(|e| format!("{t}: --transports {t}: {e}"))?;
    let keys = check_keys(args);
    let answer = floor::call(
        &mut one,
        native::Method::Pull,
        &native::pull_request(TABLE, keys.clone()),
    )
    .await
    .map_err(fail)?;
    let (_, values) = native::pull_response(answer).map_err(|e| format!("{t}: check: {e}"))?;
    check_values(&keys, &values, args.dim)?;
    drop(one);
    let n = args.workers.max(1).min(args.in_flight.max(1));
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(floor::connect(&addr).await.map_err(fail)?);
    }
    let workload = Workload::new(args.keys, args.skew, args.keys_per_call, args.push_ratio)
        .map_err(|e| e.to_string())?;
    let load = floor::Load {
        table: TABLE,
        dim: args.dim,
        push_ratio: args.push_ratio,
        grads: workload.grads(args.dim),
    };
    drive_floor(&mut conns, args, rings, &load, args.warmup, seed).await?;
    let usage = Usage::start(servers.single_pid(), servers.cpu_ticks(None), true).await?;
    let t0 = Instant::now();
    let driven = drive_floor(&mut conns, args, rings, &load, args.duration, seed + 1).await?;
    let took = t0.elapsed();
    let used = usage.stop(servers.cpu_ticks(None)).await?;
    let mut hist = Histogram::new_with_bounds(1, 60_000_000, 3).expect("static bounds");
    let mut calls = 0;
    for d in &driven {
        hist.add(&d.hist).map_err(|e| e.to_string())?;
        calls += d.calls;
    }
    let idle = idle_phase(servers, args, false).await?;
    drop(conns);
    Ok(Row {
        idle,
        ..row_of(t.into(), calls, &hist, took, used, false, None, None)
    })
}

/// Drives the floor connections `conns` for `secs`, `--in-flight` calls spread over them,
/// connection `i` with worker `i`'s key ring. Errors: a connection's, or answers still
/// missing [`floor::DRAIN_LIMIT`] after the phase.
async fn drive_floor(
    conns: &mut [tokio::net::TcpStream],
    args: &BenchArgs,
    rings: &Rings,
    load: &floor::Load,
    secs: f64,
    seed: u64,
) -> Result<Vec<floor::Driven>, String> {
    let t = "floor/tcp";
    let n = conns.len().max(1);
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let runs = conns.iter_mut().enumerate().map(|(i, c)| async move {
        let slots = args.in_flight / n + usize::from(i < args.in_flight % n);
        tokio::time::timeout_at(
            until + floor::DRAIN_LIMIT,
            floor::drive(c, slots, rings.of(i), load, until, seed * 1000 + i as u64),
        )
        .await
        .map_err(|_| {
            format!(
                "{t}: answers still missing {:?} after the phase",
                floor::DRAIN_LIMIT
            )
        })?
        .map_err(|e| format!("{t}: {e}"))
    });
    futures::future::try_join_all(runs).await
}

/// [`run`], stopped by SIGINT or SIGTERM: the handlers are in place before the server child
/// starts, and stopping drops the bench, whose child is killed on drop (`kill_on_drop`).
pub async fn run_until_signal(args: &BenchArgs) -> Result<Vec<Row>, BenchError> {
    use tokio::signal::unix::{SignalKind, signal};
    let handler =
        |kind| signal(kind).map_err(|e| BenchError::Failed(format!("signal handler: {e}")));
    let mut term = handler(SignalKind::terminate())?;
    let mut int = handler(SignalKind::interrupt())?;
    tokio::select! {
        rows = run(args) => rows.map_err(BenchError::Failed),
        _ = term.recv() => Err(BenchError::Signal("SIGTERM", 128 + 15)),
        _ = int.recv() => Err(BenchError::Signal("SIGINT", 128 + 2)),
    }
}

/// Runs the bench: one row per transport that could be set up (one that cannot, e.g. RDMA
/// without a device, is reported on stderr and left out), each transport once per round
/// (`--rounds`), the transports interleaved within a round (row `round` says which). Errors:
/// the server did not start, a check or a measured call failed.
pub async fn run(args: &BenchArgs) -> Result<Vec<Row>, String> {
    let args = &args.resolved();
    if args.keys == 0 || args.keys_per_call == 0 || !(0.0..=1.0).contains(&args.push_ratio) {
        return Err(
            "--keys and --keys-per-call must be positive, --push-ratio within 0..=1".into(),
        );
    }
    if !(args.idle.is_finite() && args.idle >= 0.0 && args.idle <= 3600.0) {
        return Err("--idle must be a number of seconds within 0..=3600".into());
    }
    if args.fault.is_some() && args.fault_at() >= Duration::from_secs_f64(args.duration) {
        return Err("--fault-at must fall within the measured phase (--duration)".into());
    }
    args.push_max_message()?;
    let transports = args.transports();
    let tls_rows = transports.iter().any(|t| is_tls(t));
    if tls_rows && args.servers.is_some() {
        return Err("+tls rows run against one server (not with --servers)".into());
    }
    if let Some(t) = transports
        .iter()
        .find(|t| SINGLE_ONLY.contains(&t.as_str()))
    {
        if args.servers.is_some() {
            return Err(format!("{t} runs against one server (not with --servers)"));
        }
        if !args.push_bytes.is_empty() && t == "floor/tcp" {
            return Err("floor/tcp runs the Zipf workload (not with --push-bytes)".into());
        }
    }
    if tls_rows && args.server.is_none() && args.tls_cert.is_none() {
        return Err(
            "+tls rows need --tls-cert and --tls-key (the server's identity) and --tls-ca".into(),
        );
    }
    if tls_rows && args.tls_ca.is_none() {
        return Err("+tls rows need --tls-ca (the CA the clients trust)".into());
    }
    // a single server serves every row (a second one, with TLS, the +tls rows); a fleet is
    // started afresh for each row
    let mut single = match args.servers {
        Some(_) => None,
        None => Some(Servers::single(args).await?),
    };
    let mut single_tls = match (&args.tls_cert, &args.tls_key, &args.server) {
        (Some(cert), Some(key), None) if tls_rows => {
            Some(Servers::single_tls(args, cert, key).await?)
        }
        _ => None,
    };
    let who = match (&single, args.servers) {
        (Some(s), _) => match s.first().pid {
            Some(pid) => format!("server pid {pid} at {}", s.first().addr),
            None => format!("server (started elsewhere) at {}", s.first().addr),
        },
        (None, n) => format!(
            "a fleet of {} shards x {} replicas per transport{}, deadline {:?}",
            n.unwrap_or(1),
            args.replicas,
            args.fault.map_or_else(String::new, |f| format!(
                ", fault {} at {:.2} s",
                f.name(),
                args.fault_at().as_secs_f64()
            )),
            args.deadline().unwrap_or_default()
        ),
    };
    if !args.push_bytes.is_empty() {
        let sizes: Vec<String> = args.push_bytes.iter().map(|&b| show_size(b)).collect();
        eprintln!(
            "bx ps bench: {who}; dense pushes of {} (dim {}), {} in flight (one per worker), {:.1}+{:.1} s per size and transport",
            sizes.join(", "),
            args.dim,
            args.push_loops(),
            args.warmup,
            args.duration
        );
    } else {
        eprintln!(
            "bx ps bench: {who}; {} keys, dim {}, {} keys/call, zipf {}, {} workers, {} in flight, {:.1}+{:.1} s per transport, push ratio {}, {} round(s)",
            args.keys,
            args.dim,
            args.keys_per_call,
            args.skew,
            args.workers,
            args.in_flight,
            args.warmup,
            args.duration,
            args.push_ratio,
            args.rounds
        );
    }
    let rings = Rings::draw(args)?;
    let bar = progress_bar(args);
    let ticker = {
        let bar = bar.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(200));
            loop {
                every.tick().await;
                bar.set_position(bar.elapsed().as_millis() as u64);
            }
        })
    };
    let mut rows = Vec::new();
    let mut failed = None;
    let mut skipped: Vec<String> = Vec::new();
    let runs: Vec<(u32, &String, Option<u64>)> = (0..args.rounds.max(1))
        .flat_map(|round| {
            transports
                .iter()
                .flat_map(move |t| args.loads().into_iter().map(move |l| (round, t, l)))
        })
        .collect();
    for (i, (round, t, load)) in runs.into_iter().enumerate() {
        if skipped.contains(t) {
            continue;
        }
        bar.set_message(t.clone());
        let mut fleet = None;
        let servers = match (&mut single, args.servers) {
            (Some(_), _) if is_tls(t) && single_tls.is_some() => {
                single_tls.as_mut().expect("checked")
            }
            (Some(s), _) => s,
            (None, n) => {
                match Servers::fleet(args, n.unwrap_or(1), args.replicas, args.fault).await {
                    Ok(f) => {
                        bar.suspend(|| eprintln!("bx ps bench: {t}: fleet {}", f.describe()));
                        fleet.insert(f)
                    }
                    Err(e) => {
                        failed = Some(format!("{t}: {e}"));
                        break;
                    }
                }
            }
        };
        match run_transport(t, servers, args, &rings, i as u64 * 7 + 1, load).await {
            Ok(row) => rows.push(Row { round, ..row }),
            Err(e) if e.starts_with(&format!("{t}: ")) => {
                bar.suspend(|| {
                    eprintln!(
                        "bx ps bench: skipping {t}: cannot connect: {}",
                        &e[t.len() + 2..]
                    )
                });
                skipped.push(t.clone());
            }
            Err(e) => {
                failed = Some(format!("{t}: {e}"));
                break;
            }
        }
    }
    ticker.abort();
    bar.finish_and_clear();
    if rings.wraps() > 0 && args.push_bytes.is_empty() {
        eprintln!(
            "bx ps bench: the key ring wrapped {} time(s) over the bench (it holds {} calls; --ring-keys for more)",
            rings.wraps(),
            rings.calls
        );
    }
    drop(single); // kills a child server
    drop(single_tls);
    match failed {
        Some(e) => Err(e),
        None => Ok(rows),
    }
}

/// The progress bar on stderr (drawn only on a terminal): time through the whole bench,
/// with the transport running now.
fn progress_bar(args: &BenchArgs) -> indicatif::ProgressBar {
    let rows = args.transports().len() * args.loads().len() * args.rounds.max(1) as usize;
    let total = (args.warmup + args.duration) * rows as f64;
    let bar = indicatif::ProgressBar::with_draw_target(
        Some((total * 1000.0) as u64),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("bx ps bench {msg:>5} [{bar:40}] {percent:>3}%")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
