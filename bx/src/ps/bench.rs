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
//! `clients::shard_channel`, and its counters read in one, [`FleetCounts::of`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use byteexpress::{Config, ReplicaSet, ServiceConfig};
use byteexpress_ps::native;
use byteexpress_ps::store::MAX_KEYS;
use byteexpress_ps::{Call, KeyRing, Workload, cpu, decode_f32s, init_value};
use bytes::Bytes;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::clients::{Failure, TableClient, connect, connect_fleet, is_tls};
pub use super::fleet::Fault;
use super::fleet::Servers;
use super::floor;
use super::report::cdf;
use super::size::{WIRE_LIMIT, show_size};
use super::usage::{Usage, Used};

/// Table the bench uses (the server's default table).
pub(super) const TABLE: &str = "emb";
/// Keys checked against the init before measuring; taken above `--keys`, which the workload
/// never reaches.
const CHECK_KEYS: u64 = 64;
/// Per-call deadline of a fleet bench unless `--deadline-ms` says otherwise.
const FLEET_DEADLINE: Duration = Duration::from_millis(1000);
/// Every row, in the order a `--config` run without `--transports` runs them.
pub const ALL_TRANSPORTS: [&str; 7] = [
    "floor/tcp",
    "native/rdma",
    "native/tcp",
    "rdma",
    "tcp",
    "h2",
    "tonic/inproc",
];
/// Rows that run against one server the bench starts (its native and floor ports, or none).
const SINGLE_ONLY: [&str; 4] = ["floor/tcp", "native/rdma", "native/tcp", "tonic/inproc"];

/// A preset of `bx ps bench --config` (issue 25's three shapes): calls in flight and keys per
/// call, the rest of the workload fixed (1 M keys, Zipf 1.05, dim 64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// 64 calls in flight, 2 keys per call: 512-byte rows in every Pull answer.
    #[value(name = "c64_512")]
    C64_512,
    /// 64 calls in flight, 64 keys per call: 16 KiB answers.
    #[value(name = "c64_16k")]
    C64_16k,
    /// 1 call in flight, 64 keys per call: 16 KiB answers, latency alone.
    #[value(name = "c1_16k")]
    C1_16k,
}

impl Preset {
    /// (calls in flight, keys per call).
    pub fn shape(self) -> (usize, usize) {
        match self {
            Preset::C64_512 => (64, 2),
            Preset::C64_16k => (64, 64),
            Preset::C1_16k => (1, 64),
        }
    }
}

/// Settings of `bx ps bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Distinct keys the workload draws from (Zipf ranks 1..=keys map to keys 0..keys).
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Values (f32) per key.
    #[arg(long, default_value_t = 64)]
    pub dim: usize,
    /// Keys per Pull or Push.
    #[arg(long, default_value_t = 64)]
    pub keys_per_call: usize,
    /// Zipf exponent of key popularity.
    #[arg(long, default_value_t = 1.05)]
    pub skew: f64,
    /// Client connections (each a logical connection, or an HTTP/2 connection for tonic); a
    /// fleet has one replica set per shard instead, shared by all calls.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Calls in flight in total, spread over the workers.
    #[arg(long, default_value_t = 64)]
    pub in_flight: usize,
    /// Measured seconds per transport.
    #[arg(long, default_value_t = 8.0)]
    pub duration: f64,
    /// Warm-up seconds per transport (not measured).
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Fraction of calls that are Push (SGD with small gradients) instead of Pull.
    #[arg(long, default_value_t = 0.0)]
    pub push_ratio: f64,
    /// Transports to run, comma-separated: rdma or bx/rdma (ByteExpress on RDMA through the
    /// tonic facade), tcp or bx/tcp (ByteExpress on TCP), h2 or grpc/h2 (tonic over HTTP/2);
    /// native/rdma and native/tcp (the same service on `byteexpress-rpc`'s native API, no
    /// tonic, the server's native port); tonic/inproc (tonic's generated client calling the
    /// generated server in this process, no transport: what tonic's code costs; its CPU is
    /// all client CPU); floor/tcp (4 multiplexed TCP connections answered in line, one write
    /// per read: the floor of kernel TCP); and with TLS (`--tls-ca`; a server started with
    /// `--tls-cert`/`--tls-key`): tcp+tls (ByteExpress over `https://`, TCP inside TLS),
    /// rdma+tls (RDMA, its set-up and control connection inside TLS) and h2+tls (tonic with
    /// `ClientTlsConfig`). The bench starts a second server, with TLS, for the +tls rows.
    /// Default: rdma,tcp,h2; with --config, every row but the TLS ones.
    #[arg(long, value_delimiter = ',')]
    pub transports: Option<Vec<String>>,
    /// A preset of calls in flight and keys per call, overriding --in-flight and
    /// --keys-per-call: c64_512 (64 in flight, 2 keys: 512-byte answers), c64_16k (64 in
    /// flight, 64 keys: 16 KiB), c1_16k (1 in flight, 64 keys).
    #[arg(long, value_enum, value_name = "PRESET")]
    pub config: Option<Preset>,
    /// Runs every transport this many times, interleaved (one row of each per round), and
    /// prints per-row medians over the rounds with ratios to floor/tcp.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Keys in the ring of Zipf keys drawn before any row (8 bytes each); a call takes the
    /// next keys-per-call of it, wrapping around at the end (the bench says if it did).
    #[arg(long, default_value_t = 1 << 23)]
    pub ring_keys: usize,
    /// Also write the settings and every row as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Bench the server at this address (`host:port`, a `bx ps serve` started elsewhere)
    /// instead of starting one; its CPU is then not measured.
    #[arg(long, value_name = "ADDR")]
    pub server: Option<String>,
    /// Draw each row's latency CDF into this SVG file, one curve per row.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Serve this process's metrics in Prometheus text format at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Fleet mode: each row starts N shards (`bx ps serve --shard I --shards N`) of
    /// --replicas processes each, and splits every call over its keys' shards, one concurrent
    /// sub-call per shard to that shard's replica set; a call succeeds when all its sub-calls
    /// do, and a failed call is counted, not fatal. rdma and tcp rows balance each shard over
    /// a byteexpress replica set (power of two choices, outlier ejection); h2 rows over
    /// tonic's `Channel::balance_list` (no ejection: its ejections column is `-`).
    #[arg(long, value_name = "N", conflicts_with = "server", value_parser = clap::value_parser!(u32).range(1..))]
    pub servers: Option<u32>,
    /// Replicas per shard in fleet mode, each its own `bx ps serve` process.
    #[arg(long, value_name = "R", default_value_t = 1, requires = "servers", value_parser = clap::value_parser!(u32).range(1..))]
    pub replicas: u32,
    /// Fault injected into replica 0 of shard 0 during each row's measured phase: kill
    /// (SIGKILL), stall (SIGSTOP, SIGCONT 2 s later) or slow (answers 20 ms late from then on).
    #[arg(long, value_enum, requires = "servers")]
    pub fault: Option<Fault>,
    /// Seconds into the measured phase when the fault strikes (default: a third of
    /// --duration). A stall lasts 2 s from then: keep it inside --duration.
    #[arg(long, value_name = "SECS", requires = "fault")]
    pub fault_at: Option<f64>,
    /// Deadline of every call, ms (gRPC's, sent as `grpc-timeout`); a call past it fails
    /// DEADLINE_EXCEEDED (counted in fleet mode, ending the bench otherwise). Default: 1000
    /// in fleet mode, none otherwise.
    #[arg(long, value_name = "MS")]
    pub deadline_ms: Option<u64>,
    /// Attempt policy of a fleet's Pull calls on its rdma and tcp rows (a gRPC service config,
    /// A6; see `--service-config`): none; retries (4 attempts, backoff 0.1 s ×2 up to 1 s, on
    /// UNAVAILABLE; retryThrottling 100 tokens, ratio 0.1: a killed replica fails every call in
    /// flight on it at once, up to --in-flight of them, and A6's example of 10 tokens stops
    /// retrying after 5); hedging (up to 3 attempts in flight, the next
    /// after `--hedging-delay-ms`, UNAVAILABLE non-fatal). Push has no policy (not idempotent).
    /// h2 rows ignore it: tonic does not implement A6.
    #[arg(long, value_enum, default_value = "none", requires = "servers")]
    pub policy: Policy,
    /// Hedging delay of `--policy hedging`, ms (set it at the healthy p95).
    #[arg(long, value_name = "MS", default_value_t = 20)]
    pub hedging_delay_ms: u64,
    /// A gRPC service-config JSON file for a fleet's rdma and tcp channels, in place of
    /// `--policy`.
    #[arg(
        long,
        value_name = "FILE",
        requires = "servers",
        conflicts_with = "policy"
    )]
    pub service_config: Option<PathBuf>,
    /// Dense pushes instead of the Zipf workload: sizes of the gradient one Push carries,
    /// comma-separated, bytes with an optional KiB/MiB/GiB suffix (e.g. `4MiB,64MiB`), each a
    /// multiple of dim × 4 and at most 65536 rows (a call's key limit: 16 MiB at the default
    /// dim 64; `--dim 256` for 64 MiB). Each transport gets one row per size: every call pushes that many
    /// bytes of gradient (size / (dim × 4) consecutive keys, above those the Zipf workload and
    /// the check use) with one call in flight per worker (`--workers`; `--in-flight` caps it),
    /// from a buffer per worker allocated and written before the warm-up. The rows add the
    /// push size and MiB/s: gradient bytes pushed per second, one way (client to server; the
    /// keys and the empty reply are not counted), in MiB (2^20 bytes). The server the bench
    /// starts gets a `--max-message` that fits the largest push and a `--memory-budget` that
    /// holds one per call in flight; a push above the wire limit
    /// (a message of 4 GiB − 1 bytes) is refused before anything starts. With `--server`, start
    /// that server with such flags yourself.
    #[arg(long, value_name = "SIZES", value_delimiter = ',', value_parser = super::size::parse_size)]
    pub push_bytes: Vec<u64>,
    /// Certificate chain (PEM) of the TLS server the bench starts for its +tls rows
    /// (`bx ps serve --tls-cert`).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of that server (`bx ps serve --tls-key`).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The CA (PEM) the +tls rows' clients trust.
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// The server name the +tls rows' clients ask for (SNI) and check the certificate
    /// against.
    #[arg(long, value_name = "NAME", default_value = "localhost")]
    pub tls_domain: String,
}

/// A fleet's attempt policy for Pull ([`BenchArgs::policy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Policy {
    /// One attempt per call (transparent retries only).
    None,
    /// A6 retryPolicy.
    Retries,
    /// A6 hedgingPolicy.
    Hedging,
}

/// The method a fleet's policy applies to.
const PULL_NAME: &str = r#"[{"service": "ps.ParameterServer", "method": "Pull"}]"#;

impl BenchArgs {
    /// The settings with `--config`'s preset applied (calls in flight and keys per call).
    pub fn resolved(&self) -> BenchArgs {
        let mut a = self.clone();
        if let Some(p) = self.config {
            (a.in_flight, a.keys_per_call) = p.shape();
        }
        a
    }

    /// The transports to run, by their short names (`bx/rdma` is `rdma`, `bx/tcp` `tcp`,
    /// `grpc/h2` `h2`): `--transports`, else every row of [`ALL_TRANSPORTS`] with
    /// `--config`, else rdma, tcp and h2.
    pub fn transports(&self) -> Vec<String> {
        match (&self.transports, self.config) {
            (Some(t), _) => t
                .iter()
                .map(|t| {
                    match t.as_str() {
                        "bx/rdma" => "rdma",
                        "bx/tcp" => "tcp",
                        "grpc/h2" => "h2",
                        other => other,
                    }
                    .to_string()
                })
                .collect(),
            (None, Some(_)) => ALL_TRANSPORTS.iter().map(|t| t.to_string()).collect(),
            (None, None) => ["rdma", "tcp", "h2"].map(String::from).to_vec(),
        }
    }

    /// The per-call deadline: `--deadline-ms`, else 1 s for a fleet, else none.
    pub(super) fn deadline(&self) -> Option<Duration> {
        match (self.deadline_ms, self.servers) {
            (Some(ms), _) => Some(Duration::from_millis(ms)),
            (None, Some(_)) => Some(FLEET_DEADLINE),
            (None, None) => None,
        }
    }

    /// The service config a fleet's bx channels get: `--service-config`'s file, else the one
    /// `--policy` names; `None` for no policy. Errors: an unreadable file, or JSON that is not
    /// a valid service config (A6's rules).
    pub(super) fn service_config(&self) -> Result<Option<ServiceConfig>, String> {
        let json = match (&self.service_config, self.policy) {
            (Some(path), _) => std::fs::read_to_string(path)
                .map_err(|e| format!("--service-config {}: {e}", path.display()))?,
            (None, Policy::None) => return Ok(None),
            (None, Policy::Retries) => format!(
                r#"{{"methodConfig": [{{"name": {PULL_NAME}, "retryPolicy": {{"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}}}], "retryThrottling": {{"maxTokens": 100, "tokenRatio": 0.1}}}}"#
            ),
            (None, Policy::Hedging) => format!(
                r#"{{"methodConfig": [{{"name": {PULL_NAME}, "hedgingPolicy": {{"maxAttempts": 3, "hedgingDelay": "{}s", "nonFatalStatusCodes": ["UNAVAILABLE"]}}}}]}}"#,
                self.hedging_delay_ms as f64 / 1000.0
            ),
        };
        ServiceConfig::from_json(&json)
            .map(Some)
            .map_err(|e| format!("service config: {e}"))
    }

    /// When the fault strikes, from the start of the measured phase.
    pub(super) fn fault_at(&self) -> Duration {
        Duration::from_secs_f64(self.fault_at.unwrap_or(self.duration / 3.0).max(0.0))
    }

    /// Keys of one dense push of `bytes` bytes (a whole number of rows).
    fn push_keys(&self, bytes: u64) -> u64 {
        bytes / (self.dim.max(1) as u64 * 4)
    }

    /// The largest message the dense pushes need: `Some` (bytes) when `--push-bytes` is given.
    /// The gradient, plus at most 10 bytes per key (a varint) and 64 KiB for the rest of the
    /// request, its metadata and the headers. Errors, before anything starts: a size that is no
    /// whole number of rows (dim × 4 bytes), more rows than a call may name (`MAX_KEYS`), or a
    /// push above the wire limit.
    pub fn push_max_message(&self) -> Result<Option<u64>, String> {
        let row = self.dim.max(1) as u64 * 4;
        let mut max = None;
        for &b in &self.push_bytes {
            if !b.is_multiple_of(row) {
                return Err(format!(
                    "--push-bytes {}: not a whole number of rows of dim {} x 4 = {row} bytes",
                    show_size(b),
                    self.dim
                ));
            }
            let keys = self.push_keys(b);
            let need = keys
                .saturating_mul(10)
                .saturating_add(b)
                .saturating_add(64 << 10);
            if need > WIRE_LIMIT {
                return Err(format!(
                    "--push-bytes {}: a push of {b} bytes of gradient needs a message of up to {need} bytes, above the wire limit of {WIRE_LIMIT} bytes (4 GiB - 1)",
                    show_size(b)
                ));
            }
            if keys > MAX_KEYS as u64 {
                return Err(format!(
                    "--push-bytes {}: {keys} rows of dim {} in one push, above the {MAX_KEYS} keys a call may name; raise --dim to {} or more",
                    show_size(b),
                    self.dim,
                    b.div_ceil(MAX_KEYS as u64 * 4)
                ));
            }
            max = max.max(Some(need));
        }
        Ok(max)
    }

    /// Calls a dense push row keeps in flight: one per worker, at most `--in-flight`.
    pub(super) fn push_loops(&self) -> usize {
        self.workers.min(self.in_flight).max(1)
    }

    /// Flags of the `bx ps serve` children for the dense pushes: `--max-message` fitting the
    /// largest, and a `--memory-budget` (at least the library's 256 MiB) holding one such
    /// message per call in flight.
    pub fn serve_flags(&self) -> Result<Vec<String>, String> {
        let Some(m) = self.push_max_message()? else {
            return Ok(Vec::new());
        };
        let budget = (m.saturating_mul(self.push_loops() as u64))
            .max(Config::default().memory_budget as u64);
        Ok(vec![
            "--max-message".to_string(),
            m.to_string(),
            "--memory-budget".to_string(),
            budget.to_string(),
        ])
    }

    /// The workloads each transport runs, one row each: the dense push sizes, or the Zipf
    /// workload (`None`).
    pub(super) fn loads(&self) -> Vec<Option<u64>> {
        if self.push_bytes.is_empty() {
            vec![None]
        } else {
            self.push_bytes.iter().map(|&b| Some(b)).collect()
        }
    }
}

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

/// What a fleet's row counts besides its calls ([`FleetCounts::of`]).
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
    }
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
    Ok(row_of(
        label,
        outcome.calls,
        &hist,
        took,
        used,
        transport == "tonic/inproc",
        fleet,
        push,
    ))
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
    Ok(row_of(
        t.into(),
        calls,
        &hist,
        took,
        used,
        false,
        None,
        None,
    ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ps::clients::bx_config;

    fn parse(argv: &[&str]) -> Result<BenchArgs, clap::Error> {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct A {
            #[command(flatten)]
            b: BenchArgs,
        }
        A::try_parse_from(std::iter::once("bench").chain(argv.iter().copied())).map(|a| a.b)
    }

    #[test]
    fn push_bytes_parse_as_a_list_of_sizes_and_garbage_zero_or_overflow_is_refused() {
        let a = parse(&["--push-bytes", "64KiB,1MiB,4096"]).unwrap();
        assert_eq!(a.push_bytes, vec![64 << 10, 1 << 20, 4096]);
        assert_eq!(a.loads(), vec![Some(64 << 10), Some(1 << 20), Some(4096)]);
        assert!(parse(&[]).unwrap().push_bytes.is_empty());
        assert_eq!(parse(&[]).unwrap().loads(), vec![None]);
        for bad in ["1MiB,x", "0", "1MiB,,2MiB", "99999999999999999999", "4MB"] {
            assert!(parse(&["--push-bytes", bad]).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn push_sizes_must_be_whole_rows_within_the_key_and_wire_limits() {
        let a = parse(&["--push-bytes", "4MiB,16MiB"]).unwrap();
        let m = a.push_max_message().unwrap().expect("a limit");
        assert!(m > 16 << 20 && m <= WIRE_LIMIT, "{m}");
        assert_eq!(
            a.serve_flags().unwrap(),
            [
                "--max-message",
                &m.to_string(),
                "--memory-budget",
                "268435456"
            ]
        );
        // four 64 MiB pushes in flight need more than the library's 256 MiB budget
        let big = parse(&["--push-bytes", "64MiB", "--dim", "256"]).unwrap();
        let big_m = big.push_max_message().unwrap().unwrap();
        assert_eq!(big.serve_flags().unwrap()[3], (4 * big_m).to_string());
        assert_eq!(bx_config("tcp", &a).max_message as u64, m);
        // no pushes: the library's limits, no flag for the server
        let none = parse(&[]).unwrap();
        assert_eq!(none.push_max_message(), Ok(None));
        assert!(none.serve_flags().unwrap().is_empty());
        assert_eq!(
            bx_config("tcp", &none).max_message,
            Config::default().max_message
        );
        let e = parse(&["--push-bytes", "1000"])
            .unwrap()
            .push_max_message()
            .unwrap_err();
        assert!(e.contains("not a whole number of rows"), "{e}");
        let e = parse(&["--push-bytes", "64MiB"])
            .unwrap()
            .push_max_message()
            .unwrap_err();
        assert!(e.contains("raise --dim to 256"), "{e}");
        let big = parse(&["--push-bytes", "64MiB", "--dim", "256"]).unwrap();
        assert!(big.push_max_message().unwrap().unwrap() > 64 << 20);
        let e = parse(&["--push-bytes", "4GiB", "--dim", "16384"])
            .unwrap()
            .push_max_message()
            .unwrap_err();
        assert!(
            e.contains("above the wire limit of 4294967295 bytes"),
            "{e}"
        );
    }

    #[test]
    fn presets_set_calls_in_flight_and_keys_per_call_and_bring_every_transport_row() {
        for (name, shape) in [
            ("c64_512", (64, 2)),
            ("c64_16k", (64, 64)),
            ("c1_16k", (1, 64)),
        ] {
            let a = parse(&["--config", name, "--in-flight", "7", "--keys-per-call", "9"])
                .unwrap()
                .resolved();
            assert_eq!((a.in_flight, a.keys_per_call), shape, "{name}");
            assert_eq!((a.keys, a.dim, a.skew), (1_000_000, 64, 1.05));
            assert_eq!(a.transports(), ALL_TRANSPORTS.map(String::from).to_vec());
        }
        assert!(parse(&["--config", "c64_1k"]).is_err());
        // without a preset: the flags as given, the three classic rows
        let a = parse(&["--in-flight", "7"]).unwrap().resolved();
        assert_eq!((a.in_flight, a.keys_per_call), (7, 64));
        assert_eq!(a.transports(), ["rdma", "tcp", "h2"]);
        // the rows' own names work as transport names
        let a = parse(&["--transports", "bx/rdma,grpc/h2,bx/tcp,floor/tcp"]).unwrap();
        assert_eq!(a.transports(), ["rdma", "h2", "tcp", "floor/tcp"]);
        assert!(parse(&["--rounds", "0"]).is_err());
    }
}
