//! The settings of `bx ps bench` ([`BenchArgs`], clap) and what follows from them: presets
//! (`--config`), the transports a run has, the attempt policy of a fleet, the limits of dense
//! pushes and the flags of the servers the bench starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use byteexpress::{Config, ServiceConfig};
use byteexpress_ps::store::MAX_KEYS;

pub use super::fleet::Fault;
use super::size::{WIRE_LIMIT, show_size};

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
    /// After each row's measured phase, hold its connections open without calls for this
    /// many seconds and report the CPU both processes used meanwhile, in % of one core (the
    /// `idle` columns; issue 25: an idle link costs < 1 % of a core). 0: no idle phase.
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    pub idle: f64,
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
    pub(super) fn push_keys(&self, bytes: u64) -> u64 {
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
    pub(super) fn loads(&self) -> Vec<Option<u64>> {
        if self.push_bytes.is_empty() {
            vec![None]
        } else {
            self.push_bytes.iter().map(|&b| Some(b)).collect()
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ps::clients::bx_config;

    /// `bx ps bench`'s settings from `argv` (the words after `bench`).
    pub(crate) fn parse(argv: &[&str]) -> Result<BenchArgs, clap::Error> {
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
