//! `bx ps bench`: starts `bx ps serve` as a child process (or takes the server at
//! `--server ADDR`) and drives it with Pull (and optionally Push) calls whose keys follow a
//! Zipf law, over ByteExpress on RDMA, ByteExpress on TCP and tonic over HTTP/2, one after the
//! other on the same server. Reports latency (hdrhistogram), throughput and CPU per call of
//! client and server (`/proc/<pid>/stat`; the server's only when the bench started it).
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
//! [`shard_channel`], and its counters read in one, [`FleetCounts::of`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use byteexpress::{
    BalanceConfig, Channel, Config, EndpointState, ReplicaSet, ServiceConfig, TransportPref,
};
use byteexpress_ps::pb::ps::parameter_server_client::ParameterServerClient;
use byteexpress_ps::pb::ps::{PullRequest, PushRequest};
use byteexpress_ps::shard::{merge_rows, split_keys};
use byteexpress_ps::store::MAX_KEYS;
use byteexpress_ps::{Call, Workload, cpu, decode_f32s, init_value};
use bytes::Bytes;
use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::time::Instant;

pub use super::fleet::Fault;
use super::fleet::Servers;
use super::size::{WIRE_LIMIT, show_size};

/// Table the bench uses (the server's default table).
const TABLE: &str = "emb";
/// Keys checked against the init before measuring; taken above `--keys`, which the workload
/// never reaches.
const CHECK_KEYS: u64 = 64;
/// Per-call deadline of a fleet bench unless `--deadline-ms` says otherwise.
const FLEET_DEADLINE: Duration = Duration::from_millis(1000);

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
    /// Transports to run, comma-separated: rdma (ByteExpress on RDMA), tcp (ByteExpress on
    /// TCP), h2 (tonic over HTTP/2), and with TLS (`--tls-ca`; a server started with
    /// `--tls-cert`/`--tls-key`): tcp+tls (ByteExpress over `https://`, TCP inside TLS),
    /// rdma+tls (RDMA, its set-up and control connection inside TLS) and h2+tls (tonic with
    /// `ClientTlsConfig`). The bench starts a second server, with TLS, for the +tls rows.
    #[arg(long, default_value = "rdma,tcp,h2", value_delimiter = ',')]
    pub transports: Vec<String>,
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
    /// Hybrid polling of the RDMA rows, a fixed budget in µs on both ends (`Config::busy_poll`;
    /// passed to the server the bench starts). Default: the library's (0 = adaptive).
    #[arg(long, value_name = "US")]
    pub busy_poll_us: Option<u64>,
    /// Adaptive polling of the RDMA rows: the wake-up cost in µs on both ends
    /// (`Config::poll_wake_cost`; 0 = always sleep at once; passed to the server the bench
    /// starts). Default: the library's (8 µs).
    #[arg(long, value_name = "US")]
    pub poll_wake_us: Option<u64>,
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
    /// The per-call deadline: `--deadline-ms`, else 1 s for a fleet, else none.
    fn deadline(&self) -> Option<Duration> {
        match (self.deadline_ms, self.servers) {
            (Some(ms), _) => Some(Duration::from_millis(ms)),
            (None, Some(_)) => Some(FLEET_DEADLINE),
            (None, None) => None,
        }
    }

    /// The service config a fleet's bx channels get: `--service-config`'s file, else the one
    /// `--policy` names; `None` for no policy. Errors: an unreadable file, or JSON that is not
    /// a valid service config (A6's rules).
    fn service_config(&self) -> Result<Option<ServiceConfig>, String> {
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
    fn fault_at(&self) -> Duration {
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
    fn push_loops(&self) -> usize {
        self.workers.min(self.in_flight).max(1)
    }

    /// Flags of the `bx ps serve` children: for the dense pushes `--max-message` fitting the
    /// largest, and a `--memory-budget` (at least the library's 256 MiB) holding one such
    /// message per call in flight; the polling flags when given.
    pub fn serve_flags(&self) -> Result<Vec<String>, String> {
        let mut flags = Vec::new();
        if let Some(m) = self.push_max_message()? {
            let budget = (m.saturating_mul(self.push_loops() as u64))
                .max(Config::default().memory_budget as u64);
            flags.extend([
                "--max-message".to_string(),
                m.to_string(),
                "--memory-budget".to_string(),
                budget.to_string(),
            ]);
        }
        for (flag, v) in [
            ("--busy-poll-us", self.busy_poll_us),
            ("--poll-wake-us", self.poll_wake_us),
        ] {
            if let Some(v) = v {
                flags.extend([flag.to_string(), v.to_string()]);
            }
        }
        Ok(flags)
    }

    /// The workloads each transport runs, one row each: the dense push sizes, or the Zipf
    /// workload (`None`).
    fn loads(&self) -> Vec<Option<u64>> {
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
    /// for a server the bench did not start.
    pub server_cpu_us: Option<f64>,
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
    fn of(sets: &[ReplicaSet]) -> FleetCounts {
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

/// A Pull/Push client over either kind of channel.
#[derive(Debug, Clone)]
enum PsClient {
    Bx(ParameterServerClient<Channel>),
    H2(ParameterServerClient<tonic::transport::Channel>),
}

/// `msg` as a request carrying `deadline` (`grpc-timeout`).
fn request<T>(msg: T, deadline: Option<Duration>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Some(d) = deadline {
        req.set_timeout(d);
    }
    req
}

impl PsClient {
    async fn pull(
        &mut self,
        keys: Vec<u64>,
        deadline: Option<Duration>,
    ) -> Result<(u32, Bytes), tonic::Status> {
        let req = request(
            PullRequest {
                table: TABLE.into(),
                keys,
            },
            deadline,
        );
        let r = match self {
            PsClient::Bx(c) => c.pull(req).await?,
            PsClient::H2(c) => c.pull(req).await?,
        }
        .into_inner();
        Ok((r.dim, r.values))
    }

    async fn push(
        &mut self,
        keys: Vec<u64>,
        grads: Bytes,
        deadline: Option<Duration>,
    ) -> Result<(), tonic::Status> {
        let req = request(
            PushRequest {
                table: TABLE.into(),
                keys,
                grads,
                lr: 0.01,
            },
            deadline,
        );
        match self {
            PsClient::Bx(c) => c.push(req).await.map(drop),
            PsClient::H2(c) => c.push(req).await.map(drop),
        }
    }
}

/// Why a call failed.
#[derive(Debug)]
enum Failure {
    /// A (sub-)call's status, or the deadline: counted in a fleet, fatal otherwise.
    Status(tonic::Status),
    /// An answer of the wrong shape: always fatal, so broken calls are never measured.
    Malformed(String),
}

/// The table as the call loops see it: one client per shard (one shard for a single
/// server), the deadline of every call, the rows' dim.
#[derive(Debug, Clone)]
struct TableClient {
    shards: Vec<PsClient>,
    deadline: Option<Duration>,
    dim: usize,
}

impl TableClient {
    /// Runs `f` under the call's deadline (the whole call, all its sub-calls).
    async fn bounded<T>(&self, f: impl Future<Output = Result<T, Failure>>) -> Result<T, Failure> {
        match self.deadline {
            None => f.await,
            Some(d) => tokio::time::timeout(d, f).await.unwrap_or_else(|_| {
                Err(Failure::Status(tonic::Status::deadline_exceeded(format!(
                    "call deadline of {d:?}"
                ))))
            }),
        }
    }

    /// The rows of `keys` in key order (keys × dim × 4 bytes), checked for shape.
    async fn pull(&self, keys: Vec<u64>) -> Result<Bytes, Failure> {
        let row = self.dim * 4;
        let n = keys.len();
        let parts = split_keys(&keys, self.shards.len() as u32);
        let calls = parts.iter().map(|p| {
            let mut c = self.shards[p.shard as usize].clone();
            let keys = p.keys.clone();
            async move {
                let (dim, values) = c.pull(keys, self.deadline).await.map_err(Failure::Status)?;
                if dim as usize != self.dim {
                    return Err(Failure::Malformed(format!(
                        "pull: dim {dim} from shard {}, bench dim {}",
                        p.shard, self.dim
                    )));
                }
                Ok(values)
            }
        });
        let values = self
            .bounded(async {
                let mut answers = futures::future::try_join_all(calls).await?;
                if answers.len() == 1 {
                    return Ok(answers.pop().unwrap_or_default());
                }
                merge_rows(&parts, &answers, row)
                    .map_err(|e| Failure::Malformed(format!("pull: {e}")))
            })
            .await?;
        if values.len() != n * row {
            return Err(Failure::Malformed(format!(
                "pull: {} bytes for {n} keys x dim {}",
                values.len(),
                self.dim
            )));
        }
        Ok(values)
    }

    /// Pushes `grads` (keys × dim × 4 bytes) for `keys`.
    async fn push(&self, keys: Vec<u64>, grads: &Bytes) -> Result<(), Failure> {
        let row = self.dim * 4;
        let parts = split_keys(&keys, self.shards.len() as u32);
        let one = parts.len() == 1;
        let calls = parts.iter().map(|p| {
            let mut c = self.shards[p.shard as usize].clone();
            let grads = if one {
                grads.clone()
            } else {
                p.gather(grads, row)
            };
            let keys = p.keys.clone();
            async move {
                c.push(keys, grads, self.deadline)
                    .await
                    .map_err(Failure::Status)
            }
        });
        self.bounded(async { futures::future::try_join_all(calls).await.map(drop) })
            .await
    }
}

/// Whether `transport` is a TLS row (`tcp+tls`, `rdma+tls`, `h2+tls`).
fn is_tls(transport: &str) -> bool {
    transport.ends_with("+tls")
}

/// The TLS config of a ByteExpress +tls row's clients: `--tls-ca` trusted, `--tls-domain`
/// asked for. Errors: no `--tls-ca`.
fn bx_tls(args: &BenchArgs) -> Result<byteexpress::ClientTlsConfig, String> {
    let ca = args
        .tls_ca
        .as_ref()
        .ok_or("+tls rows need --tls-ca (the CA the clients trust)")?;
    Ok(byteexpress::ClientTlsConfig::new()
        .ca_certificate(byteexpress::Certificate::from_pem_file(ca))
        .domain_name(args.tls_domain.clone()))
}

/// The tonic TLS config of an h2+tls row: `--tls-ca` trusted, `--tls-domain` asked for.
/// Errors: no `--tls-ca`, or it cannot be read.
fn h2_tls(args: &BenchArgs) -> Result<tonic::transport::ClientTlsConfig, String> {
    let ca = args
        .tls_ca
        .as_ref()
        .ok_or("+tls rows need --tls-ca (the CA the clients trust)")?;
    let pem = std::fs::read(ca).map_err(|e| format!("--tls-ca {}: {e}", ca.display()))?;
    Ok(tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(pem))
        .domain_name(args.tls_domain.clone()))
}

/// The rpc settings of an rdma or tcp row, `max_message` raised to fit the dense pushes.
fn bx_config(transport: &str, args: &BenchArgs) -> Config {
    let transport = if transport.starts_with("rdma") {
        TransportPref::Rdma
    } else {
        TransportPref::Tcp
    };
    let d = Config::default();
    let max_message = match args.push_max_message() {
        Ok(Some(m)) => (m as usize).max(d.max_message),
        _ => d.max_message,
    };
    Config {
        transport,
        max_message,
        busy_poll: args
            .busy_poll_us
            .map_or(d.busy_poll, std::time::Duration::from_micros),
        poll_wake_cost: args
            .poll_wake_us
            .map_or(d.poll_wake_cost, std::time::Duration::from_micros),
        ..d
    }
}

/// The channel to one shard's replicas at `addrs` for `transport`, with the replica set of
/// an rdma or tcp row: the one place where a fleet's channels are built, with the service
/// config `sc` (retries or hedging) on rdma and tcp rows.
fn shard_channel(
    transport: &str,
    args: &BenchArgs,
    addrs: &[String],
    bal: &BalanceConfig,
    sc: Option<&ServiceConfig>,
) -> Result<(PsClient, Option<ReplicaSet>), String> {
    match transport {
        "rdma" | "tcp" => {
            let uris = addrs.iter().map(|a| format!("bx://{a}"));
            let mut ch = Channel::balance_list(uris, &bx_config(transport, args), bal)
                .map_err(|e| format!("{transport}: {e}"))?;
            if let Some(sc) = sc {
                ch = ch
                    .with_service_config(sc.clone())
                    .map_err(|e| format!("{transport}: service config: {e}"))?;
            }
            let set = ch.replica_set().cloned();
            Ok((PsClient::Bx(ParameterServerClient::new(ch)), set))
        }
        "h2" => {
            let mut eps = Vec::new();
            for a in addrs {
                eps.push(
                    tonic::transport::Endpoint::from_shared(format!("http://{a}"))
                        .map_err(|e| e.to_string())?
                        .tcp_nodelay(true),
                );
            }
            let ch = tonic::transport::Channel::balance_list(eps.into_iter());
            Ok((PsClient::H2(ParameterServerClient::new(ch)), None))
        }
        other => Err(format!("unknown transport {other:?} (rdma, tcp or h2)")),
    }
}

/// Connects every endpoint of `set` now and waits (at most 30 s) until all are READY.
/// Errors, prefixed `"{transport}: "` (a row that cannot be set up): an endpoint went to
/// TRANSIENT_FAILURE, or time ran out.
async fn all_ready(set: &ReplicaSet, transport: &str) -> Result<(), String> {
    set.connect_now();
    let limit = Instant::now() + Duration::from_secs(30);
    loop {
        let changed = set.changed();
        let eps = set.endpoints();
        if let Some(e) = eps
            .iter()
            .find(|e| e.state == EndpointState::TransientFailure)
        {
            return Err(format!(
                "{transport}: --transports {transport}: replica {} failed to connect",
                e.addr
            ));
        }
        if eps.iter().all(|e| e.state == EndpointState::Ready) {
            return Ok(());
        }
        tokio::time::timeout_at(limit, changed)
            .await
            .map_err(|_| format!("{transport}: replicas not ready within 30 s"))?;
    }
}

/// Connects a fleet's table for `transport`: one channel per shard over its replicas,
/// every replica connected. Returns the table, the shards' replica sets (none for h2) and
/// the row's label.
async fn connect_fleet(
    transport: &str,
    servers: &Servers,
    args: &BenchArgs,
) -> Result<(TableClient, Vec<ReplicaSet>, String), String> {
    let bal = BalanceConfig::default();
    let sc = args.service_config()?;
    let (mut shards, mut sets) = (Vec::new(), Vec::new());
    for replicas in &servers.shards {
        let addrs: Vec<String> = replicas.iter().map(|r| r.addr.clone()).collect();
        let (client, set) = shard_channel(transport, args, &addrs, &bal, sc.as_ref())?;
        if let Some(set) = set {
            all_ready(&set, transport).await?;
            sets.push(set);
        }
        shards.push(client);
    }
    let label = match sets.first().and_then(|s| s.endpoints().first()?.transport) {
        Some(t) => format!("bx/{t}"),
        None => "grpc/h2".into(),
    };
    let table = TableClient {
        shards,
        deadline: args.deadline(),
        dim: args.dim,
    };
    Ok((table, sets, label))
}

/// Connects `n` clients of one server for `transport`; returns them and the negotiated
/// transport's label.
async fn connect(
    transport: &str,
    addr: &str,
    n: usize,
    args: &BenchArgs,
) -> Result<(Vec<TableClient>, String), String> {
    let mut clients = Vec::with_capacity(n);
    let mut label = String::new();
    for _ in 0..n.max(1) {
        let c = match transport {
            "rdma" | "tcp" | "rdma+tls" | "tcp+tls" => {
                let mut cfg = bx_config(transport, args);
                let mut scheme = "bx";
                if is_tls(transport) {
                    cfg.tls = Some(bx_tls(args)?);
                    scheme = "https";
                }
                let ch = Channel::connect_with(&format!("{scheme}://{addr}"), &cfg)
                    .await
                    .map_err(|e| format!("{transport}: --transports {transport}: {e}"))?;
                label = format!("bx/{}", ch.transport());
                if is_tls(transport) {
                    label.push_str("+tls");
                }
                PsClient::Bx(ParameterServerClient::new(ch))
            }
            "h2+tls" => {
                let ch = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
                    .map_err(|e| e.to_string())?
                    .tls_config(h2_tls(args)?)
                    .map_err(|e| format!("h2+tls: {e}"))?
                    .tcp_nodelay(true)
                    .connect()
                    .await
                    .map_err(|e| format!("h2+tls: {e}"))?;
                label = "grpc/h2+tls".into();
                PsClient::H2(ParameterServerClient::new(ch))
            }
            "h2" => {
                let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                    .map_err(|e| e.to_string())?
                    .tcp_nodelay(true)
                    .connect()
                    .await
                    .map_err(|e| format!("h2: {e}"))?;
                label = "grpc/h2".into();
                PsClient::H2(ParameterServerClient::new(ch))
            }
            other => {
                return Err(format!(
                    "unknown transport {other:?} (rdma, tcp, h2, rdma+tls, tcp+tls or h2+tls)"
                ));
            }
        };
        clients.push(TableClient {
            shards: vec![c],
            deadline: args.deadline(),
            dim: args.dim,
        });
    }
    Ok((clients, label))
}

/// Pulls keys the workload never touches and compares every value with the init.
async fn check(client: &TableClient, args: &BenchArgs) -> Result<(), String> {
    let keys: Vec<u64> = (0..CHECK_KEYS).map(|i| args.keys + i * 7919).collect();
    let values = client.pull(keys.clone()).await.map_err(|e| match e {
        Failure::Status(e) => format!("check pull: {e}"),
        Failure::Malformed(e) => format!("check {e}"),
    })?;
    let v = decode_f32s(&values);
    for (j, &k) in keys.iter().enumerate() {
        for i in 0..args.dim {
            let want = init_value(TABLE, k, i as u32);
            if v[j * args.dim + i] != want {
                return Err(format!(
                    "check pull: key {k} value {i} is {} not {want}",
                    v[j * args.dim + i]
                ));
            }
        }
    }
    Ok(())
}

/// What a phase (or one of its loops) did.
#[derive(Debug, Default)]
struct Outcome {
    /// Calls that succeeded.
    calls: u64,
    /// Calls that failed (in fleet mode; otherwise a failure ends the bench).
    failed: u64,
}

/// One loop of sequential calls until `until`; latencies go to `hist` when given. A failed
/// call is counted when `tolerate` (a fleet), else it ends the bench; a malformed answer
/// always does.
async fn call_loop(
    client: TableClient,
    args: &BenchArgs,
    workload: Workload,
    seed: u64,
    until: Instant,
    mut hist: Option<&mut Histogram<u64>>,
    dense: Option<(&[u64], &Bytes)>,
) -> Result<Outcome, String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let grads = match dense {
        Some((_, g)) => g.clone(),
        None => workload.grads(args.dim),
    };
    let tolerate = args.servers.is_some();
    let mut out = Outcome::default();
    while Instant::now() < until {
        let call = match dense {
            Some((keys, _)) => Call::Push(keys.to_vec()),
            None => workload.next_call(&mut rng),
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

/// Runs `in_flight` call loops over `clients` for `secs` (a dense push row: one loop per
/// gradient buffer); returns what they did, latencies and the time taken.
async fn phase(
    clients: &[TableClient],
    args: &BenchArgs,
    secs: f64,
    record: bool,
    seed: u64,
    dense: Option<&Dense>,
) -> Result<(Outcome, Histogram<u64>, Duration), String> {
    let workload = Workload::new(args.keys, args.skew, args.keys_per_call, args.push_ratio)
        .map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(secs);
    let loops = dense.map_or(args.in_flight.max(1), |d| d.grads.len());
    let mut hists: Vec<Histogram<u64>> = (0..loops)
        .map(|_| Histogram::new_with_bounds(1, 60_000_000, 3).expect("static bounds"))
        .collect();
    let runs = hists.iter_mut().enumerate().map(|(i, h)| {
        let client = clients[i % clients.len()].clone();
        call_loop(
            client,
            args,
            workload,
            seed.wrapping_mul(1000).wrapping_add(i as u64),
            until,
            record.then_some(h),
            dense.map(|d| (&d.keys[..], &d.grads[i])),
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

async fn run_transport(
    transport: &str,
    servers: &mut Servers,
    args: &BenchArgs,
    seed: u64,
    push: Option<u64>,
) -> Result<Row, String> {
    let (clients, sets, label) = if servers.is_fleet() {
        let (table, sets, label) = connect_fleet(transport, servers, args).await?;
        (vec![table], sets, label)
    } else {
        let (clients, label) =
            connect(transport, &servers.first().addr, args.workers, args).await?;
        (clients, Vec::new(), label)
    };
    check(&clients[0], args).await?;
    let dense = push.map(|b| Dense::new(args, b));
    phase(&clients, args, args.warmup, false, seed, dense.as_ref()).await?;
    let per_sec = cpu::clock_ticks_per_sec();
    let counted0 = FleetCounts::of(&sets);
    let (c0, s0) = (
        cpu::cpu_ticks(None).map_err(|e| e.to_string())?,
        servers.cpu_ticks(None)?,
    );
    let measured = phase(
        &clients,
        args,
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
    let (c1, s1) = (
        cpu::cpu_ticks(None).map_err(|e| e.to_string())?,
        servers.cpu_ticks(injected.as_ref().and_then(|i| i.killed()))?,
    );
    if let Some(i) = &injected {
        let line = servers.report(i).await;
        eprintln!("bx ps bench: {transport}: {line}");
    }
    let calls = outcome.calls;
    let per_call = |ticks: u64| {
        cpu::ticks_to_duration(ticks, per_sec).as_secs_f64() * 1e6 / calls.max(1) as f64
    };
    let fleet = servers.is_fleet().then(|| FleetCounts {
        failed: outcome.failed,
        ..FleetCounts::of(&sets).since(counted0)
    });
    Ok(Row {
        transport: label,
        calls,
        mean_us: hist.mean(),
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        p95_us: hist.value_at_quantile(0.95),
        p999_us: hist.value_at_quantile(0.999),
        calls_per_sec: calls as f64 / took.as_secs_f64(),
        client_cpu_us: per_call(c1 - c0),
        server_cpu_us: s0.zip(s1).map(|(a, b)| per_call(b - a)),
        cdf: cdf(&hist),
        fleet,
        push_bytes: push,
        mib_per_sec: push.map(|b| (b * calls) as f64 / took.as_secs_f64() / f64::from(1u32 << 20)),
    })
}

/// Points of the latency CDF of `hist` (µs, fraction): every percent, then the tail.
fn cdf(hist: &Histogram<u64>) -> Vec<(f64, f64)> {
    if hist.is_empty() {
        return Vec::new();
    }
    let tail = [0.995, 0.999, 0.9995, 0.9999, 1.0];
    (0..100)
        .map(|i| f64::from(i) / 100.0)
        .chain(tail)
        .map(|q| (hist.value_at_quantile(q) as f64, q))
        .collect()
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
/// without a device, is reported on stderr and left out). Errors: the server did not start, a
/// check or a measured call failed.
pub async fn run(args: &BenchArgs) -> Result<Vec<Row>, String> {
    if args.keys == 0 || args.keys_per_call == 0 || !(0.0..=1.0).contains(&args.push_ratio) {
        return Err(
            "--keys and --keys-per-call must be positive, --push-ratio within 0..=1".into(),
        );
    }
    if args.fault.is_some() && args.fault_at() >= Duration::from_secs_f64(args.duration) {
        return Err("--fault-at must fall within the measured phase (--duration)".into());
    }
    args.push_max_message()?;
    let tls_rows = args.transports.iter().any(|t| is_tls(t));
    if tls_rows && args.servers.is_some() {
        return Err("+tls rows run against one server (not with --servers)".into());
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
            "bx ps bench: {who}; {} keys, dim {}, {} keys/call, zipf {}, {} workers, {} in flight, {:.1}+{:.1} s per transport, push ratio {}",
            args.keys,
            args.dim,
            args.keys_per_call,
            args.skew,
            args.workers,
            args.in_flight,
            args.warmup,
            args.duration,
            args.push_ratio
        );
    }
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
    let runs = args
        .transports
        .iter()
        .flat_map(|t| args.loads().into_iter().map(move |l| (t, l)));
    for (i, (t, load)) in runs.enumerate() {
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
        match run_transport(t, servers, args, i as u64 * 7 + 1, load).await {
            Ok(row) => rows.push(row),
            Err(e) if e.starts_with(&format!("{t}: ")) => bar.suspend(|| {
                eprintln!(
                    "bx ps bench: skipping {t}: cannot connect: {}",
                    &e[t.len() + 2..]
                )
            }),
            Err(e) => {
                failed = Some(format!("{t}: {e}"));
                break;
            }
        }
    }
    ticker.abort();
    bar.finish_and_clear();
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
    let total = (args.warmup + args.duration) * (args.transports.len() * args.loads().len()) as f64;
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

/// The rows as an aligned text table; rows of a fleet add the columns `failed` and
/// `ejections`, dense push rows the columns `push` (bytes per call) and `MiB/s`.
pub fn table(rows: &[Row]) -> String {
    let fleet = rows.iter().any(|r| r.fleet.is_some());
    let push = rows.iter().any(|r| r.push_bytes.is_some());
    let mut s = format!(
        "{:<20} {:>9} {:>9} {:>8} {:>8} {:>9} {:>10} {:>14} {:>14}",
        "transport",
        "calls",
        "mean µs",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "calls/s",
        "client CPU µs",
        "server CPU µs"
    );
    if fleet {
        s += &format!(
            " {:>8} {:>8} {:>8} {:>9}",
            "failed", "retried", "hedged", "ejections"
        );
    }
    if push {
        s += &format!(" {:>8} {:>9}", "push", "MiB/s");
    }
    s += "\n";
    for r in rows {
        let server_cpu = r
            .server_cpu_us
            .map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
        s += &format!(
            "{:<20} {:>9} {:>9.1} {:>8} {:>8} {:>9} {:>10.0} {:>14.1} {:>14}",
            r.transport,
            r.calls,
            r.mean_us,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.calls_per_sec,
            r.client_cpu_us,
            server_cpu
        );
        if fleet {
            let f = r.fleet.unwrap_or_default();
            s += &format!(
                " {:>8} {:>8} {:>8} {:>9}",
                f.failed,
                or_dash(f.retried),
                or_dash(f.hedged),
                or_dash(f.ejections)
            );
        }
        if push {
            s += &format!(
                " {:>8} {:>9}",
                r.push_bytes.map_or_else(|| "-".to_string(), show_size),
                r.mib_per_sec
                    .map_or_else(|| "-".to_string(), |v| format!("{v:.1}"))
            );
        }
        s += "\n";
    }
    s
}

/// `v`, or JSON's `null` for none.
fn or_null(v: Option<u64>) -> String {
    v.map_or_else(|| "null".to_string(), |v| v.to_string())
}

/// `v`, or `-` for none.
fn or_dash(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// The settings and every row as one JSON object: `{"settings": {...}, "rows": [...]}`, row
/// fields named as in [`Row`] (without the CDF), `server_cpu_us` null for a server the bench
/// did not start. A fleet bench adds the settings `servers`, `replicas`, `fault` (null
/// without), `fault_at_s` and `deadline_ms`, and the row fields of [`FleetCounts`]
/// (`ejections` null for h2). With `--push-bytes`, the settings add `push_bytes` (a list of
/// bytes) and every row its `push_bytes` and `mib_per_sec`.
pub fn json(args: &BenchArgs, rows: &[Row]) -> String {
    let transports: Vec<String> = args.transports.iter().map(|t| json_str(t)).collect();
    let fleet = match args.servers {
        None => String::new(),
        Some(n) => format!(
            ", \"servers\": {n}, \"replicas\": {}, \"fault\": {}, \"fault_at_s\": {}, \"deadline_ms\": {}, \"policy\": {}",
            args.replicas,
            args.fault
                .map_or_else(|| "null".to_string(), |f| json_str(f.name())),
            finite(args.fault_at().as_secs_f64()),
            args.deadline().unwrap_or_default().as_millis(),
            match (&args.service_config, args.policy) {
                (Some(p), _) => json_str(&p.display().to_string()),
                (None, Policy::None) => "null".to_string(),
                (None, Policy::Retries) => json_str("retries"),
                (None, Policy::Hedging) =>
                    json_str(&format!("hedging {} ms", args.hedging_delay_ms)),
            }
        ),
    };
    let push = if args.push_bytes.is_empty() {
        String::new()
    } else {
        let b: Vec<String> = args.push_bytes.iter().map(u64::to_string).collect();
        format!(", \"push_bytes\": [{}]", b.join(", "))
    };
    let settings = format!(
        "{{\"keys\": {}, \"dim\": {}, \"keys_per_call\": {}, \"skew\": {}, \"workers\": {}, \"in_flight\": {}, \"duration_s\": {}, \"warmup_s\": {}, \"push_ratio\": {}, \"transports\": [{}], \"server\": {}{fleet}{push}}}",
        args.keys,
        args.dim,
        args.keys_per_call,
        finite(args.skew),
        args.workers,
        args.in_flight,
        finite(args.duration),
        finite(args.warmup),
        finite(args.push_ratio),
        transports.join(", "),
        args.server
            .as_deref()
            .map_or_else(|| "null".to_string(), json_str),
    );
    let objs: Vec<String> = rows
        .iter()
        .map(|r| {
            let fleet = r.fleet.map_or_else(String::new, |f| {
                format!(
                    ", \"failed\": {}, \"retried\": {}, \"hedged\": {}, \"ejections\": {}",
                    f.failed,
                    or_null(f.retried),
                    or_null(f.hedged),
                    or_null(f.ejections)
                )
            });
            let push = r.push_bytes.map_or_else(String::new, |b| {
                format!(
                    ", \"push_bytes\": {b}, \"mib_per_sec\": {:.3}",
                    finite(r.mib_per_sec.unwrap_or(0.0))
                )
            });
            format!(
                "    {{\"transport\": {}, \"calls\": {}, \"mean_us\": {:.3}, \"p50_us\": {}, \"p95_us\": {}, \"p99_us\": {}, \"p999_us\": {}, \"calls_per_sec\": {:.3}, \"client_cpu_us\": {:.3}, \"server_cpu_us\": {}{fleet}{push}}}",
                json_str(&r.transport),
                r.calls,
                finite(r.mean_us),
                r.p50_us,
                r.p95_us,
                r.p99_us,
                r.p999_us,
                finite(r.calls_per_sec),
                finite(r.client_cpu_us),
                r.server_cpu_us
                    .map_or_else(|| "null".to_string(), |v| format!("{:.3}", finite(v)))
            )
        })
        .collect();
    format!(
        "{{\n  \"settings\": {settings},\n  \"rows\": [\n{}\n  ]\n}}\n",
        objs.join(",\n")
    )
}

/// A JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out += "\\\"",
            '\\' => out += "\\\\",
            c if (c as u32) < 0x20 => out += &format!("\\u{:04x}", c as u32),
            c => out.push(c),
        }
    }
    out + "\""
}

/// JSON has no NaN or infinity.
fn finite(v: f64) -> f64 {
    if v.is_finite() { v } else { 0.0 }
}

/// Draws each row's latency CDF (log-scale µs on x, fraction of calls on y) into an SVG file
/// with `plotters`, one curve per row, labelled with the row's transport. Errors: no row has
/// samples, or the file cannot be written.
pub fn plot(rows: &[Row], path: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    let xs = rows.iter().flat_map(|r| r.cdf.iter().map(|p| p.0));
    let lo = xs.clone().fold(f64::INFINITY, f64::min).max(1.0);
    let hi = xs.fold(0.0, f64::max);
    if !hi.is_finite() || hi <= 0.0 {
        return Err("no latency samples to plot".into());
    }
    let (lo, hi) = (lo * 0.9, (hi * 1.1).max(lo * 2.0));
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("bx ps bench: latency CDF per transport", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("latency (µs, log scale)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_desc("fraction of calls")
        .draw()
        .map_err(|x| e(&x))?;
    for (i, r) in rows.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                r.cdf.iter().map(|&(x, y)| (x.max(lo), y)),
                color.stroke_width(2),
            ))
            .map_err(|x| e(&x))?
            .label(r.label())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Row {
        Row {
            transport: "bx/rdma".into(),
            calls: 10,
            mean_us: 12.5,
            p50_us: 11,
            p99_us: 20,
            p95_us: 15,
            p999_us: 30,
            calls_per_sec: 1000.0,
            client_cpu_us: 5.0,
            server_cpu_us: Some(f64::NAN),
            cdf: vec![(10.0, 0.0), (11.0, 0.5), (30.0, 1.0)],
            fleet: None,
            push_bytes: None,
            mib_per_sec: None,
        }
    }

    fn args() -> BenchArgs {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct A {
            #[command(flatten)]
            b: BenchArgs,
        }
        A::parse_from([
            "bench",
            "--server",
            "127.0.0.1:9",
            "--transports",
            "rdma,tcp",
        ])
        .b
    }

    #[test]
    fn table_and_json_shapes() {
        let t = table(&[row()]);
        assert_eq!(t.lines().count(), 2);
        assert!(t.contains("bx/rdma"));
        let other = Row {
            server_cpu_us: None,
            ..row()
        };
        let t = table(std::slice::from_ref(&other));
        assert!(t.lines().nth(1).unwrap().trim_end().ends_with('-'), "{t}");
        let j = json(&args(), &[row(), other]);
        assert!(j.contains("\"transport\": \"bx/rdma\""));
        assert!(j.contains("\"server_cpu_us\": 0.000"));
        assert!(j.contains("\"server_cpu_us\": null"));
        assert!(j.contains("\"server\": \"127.0.0.1:9\""), "{j}");
        assert!(j.contains("\"transports\": [\"rdma\", \"tcp\"]"), "{j}");
        // settings, and one object per row
        assert_eq!(j.matches('{').count(), 4);
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }

    #[test]
    fn fleet_rows_add_failed_retried_hedged_and_ejections_to_the_table_and_json() {
        let fleet = |n: Option<u64>| Row {
            fleet: Some(FleetCounts {
                failed: 7,
                retried: n.map(|n| n + 3),
                hedged: n.map(|n| n + 1),
                ejections: n,
            }),
            ..row()
        };
        let t = table(&[fleet(Some(2)), fleet(None)]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].ends_with("   failed  retried   hedged ejections"),
            "{t}"
        );
        assert!(
            lines[1].ends_with("        7        5        3         2"),
            "{t}"
        );
        assert!(
            lines[2].ends_with("        7        -        -         -"),
            "{t}"
        );
        use clap::Parser;
        #[derive(clap::Parser)]
        struct A {
            #[command(flatten)]
            b: BenchArgs,
        }
        let a = A::parse_from([
            "bench",
            "--servers",
            "2",
            "--replicas",
            "3",
            "--fault",
            "kill",
            "--policy",
            "retries",
        ])
        .b;
        let j = json(&a, &[fleet(Some(2)), fleet(None)]);
        assert!(
            j.contains("\"servers\": 2, \"replicas\": 3, \"fault\": \"kill\", \"fault_at_s\": 2.666666667, \"deadline_ms\": 1000, \"policy\": \"retries\"}"),
            "{j}"
        );
        assert!(
            j.contains("\"failed\": 7, \"retried\": 5, \"hedged\": 3, \"ejections\": 2}"),
            "{j}"
        );
        assert!(
            j.contains("\"failed\": 7, \"retried\": null, \"hedged\": null, \"ejections\": null}"),
            "{j}"
        );
        assert_eq!(j.matches('{').count(), 4);
        // flags that make no sense without a fleet are refused
        assert!(A::try_parse_from(["bench", "--fault", "kill"]).is_err());
        assert!(A::try_parse_from(["bench", "--policy", "retries"]).is_err());
        assert!(A::try_parse_from(["bench", "--servers", "2", "--server", "h:1"]).is_err());
        assert!(A::try_parse_from(["bench", "--servers", "0"]).is_err());
        // each policy is a valid A6 service config; none is no config
        for (p, kind) in [("retries", "retry"), ("hedging", "hedging")] {
            let a = A::parse_from(["bench", "--servers", "1", "--policy", p]).b;
            let sc = a.service_config().unwrap().expect("a policy");
            let m = sc
                .method("/ps.ParameterServer/Pull")
                .expect("Pull has a policy");
            assert!(format!("{m:?}").to_lowercase().contains(kind), "{m:?}");
            assert!(sc.method("/ps.ParameterServer/Push").is_none());
        }
        let a = A::parse_from(["bench", "--servers", "1"]).b;
        assert!(a.service_config().unwrap().is_none());
    }

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
    fn push_rows_add_their_size_and_mib_per_s_to_the_table_json_and_plot_label() {
        let push = Row {
            push_bytes: Some(4 << 20),
            mib_per_sec: Some(123.456),
            ..row()
        };
        let t = table(std::slice::from_ref(&push));
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].ends_with("    push     MiB/s"), "{t}");
        assert!(lines[1].ends_with("    4MiB     123.5"), "{t}");
        // the Zipf table is as it was: no push columns
        assert!(!table(&[row()]).contains("MiB/s"));
        let a = parse(&["--push-bytes", "4MiB"]).unwrap();
        let j = json(&a, std::slice::from_ref(&push));
        assert!(j.contains("\"push_bytes\": [4194304]}"), "{j}");
        assert!(
            j.contains("\"push_bytes\": 4194304, \"mib_per_sec\": 123.456}"),
            "{j}"
        );
        let j = json(&args(), &[row()]);
        assert!(
            !j.contains("push_bytes") && !j.contains("mib_per_sec"),
            "{j}"
        );
        assert_eq!(push.label(), "bx/rdma push 4MiB");
        assert_eq!(row().label(), "bx/rdma");
    }

    #[test]
    fn the_plot_is_an_svg_with_one_curve_per_row() {
        let dir = std::env::temp_dir().join(format!("bx-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cdf.svg");
        let tcp = Row {
            transport: "bx/tcp".into(),
            cdf: vec![(20.0, 0.0), (25.0, 0.5), (90.0, 1.0)],
            ..row()
        };
        plot(&[row(), tcp], &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        assert!(
            svg.contains("bx/rdma") && svg.contains("bx/tcp"),
            "labels missing"
        );
        assert!(svg.matches("<polyline").count() >= 2, "curves missing");
        assert!(
            plot(
                &[Row {
                    cdf: vec![],
                    ..row()
                }],
                &path
            )
            .is_err()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
