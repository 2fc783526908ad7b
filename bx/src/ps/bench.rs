//! `bx ps bench`: starts `bx ps serve` as a child process and drives it with Pull (and
//! optionally Push) calls whose keys follow a Zipf law, over ByteExpress on RDMA, ByteExpress
//! on TCP and tonic over HTTP/2, one after the other on the same server. Reports latency
//! (hdrhistogram), throughput and CPU per call of client and server (`/proc/<pid>/stat`).
//!
//! The client side runs on one current-thread tokio runtime (the caller's). Before measuring,
//! each transport must return rows equal to the deterministic init for keys the workload never
//! touches, and every measured call is checked for shape: a failed or malformed call aborts
//! the bench, so broken calls are never measured.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use byteexpress::{Channel, Config, TransportPref};
use byteexpress_ps::pb::ps::parameter_server_client::ParameterServerClient;
use byteexpress_ps::pb::ps::{PullRequest, PushRequest};
use byteexpress_ps::{Call, Workload, cpu, decode_f32s, init_value};
use bytes::Bytes;
use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// Table the bench uses (the server's default table).
const TABLE: &str = "emb";
/// Keys checked against the init before measuring; taken above `--keys`, which the workload
/// never reaches.
const CHECK_KEYS: u64 = 64;

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
    /// Client connections (each a logical connection, or an HTTP/2 connection for tonic).
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
    /// TCP), h2 (tonic over HTTP/2).
    #[arg(long, default_value = "rdma,tcp,h2", value_delimiter = ',')]
    pub transports: Vec<String>,
    /// Also write the rows as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One transport's results.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The transport as negotiated: `bx/rdma`, `bx/tcp` or `grpc/h2`.
    pub transport: String,
    /// Calls completed in the measured phase.
    pub calls: u64,
    /// Mean latency, µs.
    pub mean_us: f64,
    /// Median latency, µs.
    pub p50_us: u64,
    /// 99th percentile latency, µs.
    pub p99_us: u64,
    /// 99.9th percentile latency, µs.
    pub p999_us: u64,
    /// Throughput, calls per second.
    pub calls_per_sec: f64,
    /// Client process CPU time (user + system) per call, µs.
    pub client_cpu_us: f64,
    /// Server process CPU time per call, µs.
    pub server_cpu_us: f64,
}

/// A Pull/Push client over either kind of channel.
#[derive(Debug, Clone)]
enum PsClient {
    Bx(ParameterServerClient<Channel>),
    H2(ParameterServerClient<tonic::transport::Channel>),
}

impl PsClient {
    async fn pull(&mut self, keys: Vec<u64>) -> Result<(u32, Bytes), tonic::Status> {
        let req = PullRequest {
            table: TABLE.into(),
            keys,
        };
        let r = match self {
            PsClient::Bx(c) => c.pull(req).await?,
            PsClient::H2(c) => c.pull(req).await?,
        }
        .into_inner();
        Ok((r.dim, r.values))
    }

    async fn push(&mut self, keys: Vec<u64>, grads: Bytes) -> Result<(), tonic::Status> {
        let req = PushRequest {
            table: TABLE.into(),
            keys,
            grads,
            lr: 0.01,
        };
        match self {
            PsClient::Bx(c) => c.push(req).await.map(drop),
            PsClient::H2(c) => c.push(req).await.map(drop),
        }
    }
}

/// The `bx ps serve` child; killed on drop.
#[derive(Debug)]
struct ServerChild {
    child: Child,
    addr: String,
    pid: u32,
}

async fn start_server(dim: usize) -> Result<ServerChild, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating bx: {e}"))?;
    let mut child = Command::new(exe)
        .args([
            "ps",
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--dim",
            &dim.to_string(),
        ])
        .env_remove("BX_TRANSPORT") // the server accepts both transports
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("starting bx ps serve: {e}"))?;
    let pid = child.id().ok_or("server exited at once")?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no server stdout")?).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .map_err(|_| "server did not start within 30 s")?
        .map_err(|e| format!("reading server stdout: {e}"))?
        .ok_or("server exited before listening")?;
    let addr = line
        .strip_prefix("LISTENING ")
        .ok_or_else(|| format!("unexpected server line {line:?}"))?
        .to_string();
    Ok(ServerChild { child, addr, pid })
}

/// Connects `n` clients for `transport`; returns them and the negotiated transport's label.
async fn connect(transport: &str, addr: &str, n: usize) -> Result<(Vec<PsClient>, String), String> {
    let mut clients = Vec::with_capacity(n);
    let mut label = String::new();
    for _ in 0..n.max(1) {
        let c = match transport {
            "rdma" | "tcp" => {
                let pref = if transport == "rdma" {
                    TransportPref::Rdma
                } else {
                    TransportPref::Tcp
                };
                let cfg = Config {
                    transport: pref,
                    ..Config::default()
                };
                let ch = Channel::connect_with(&format!("bx://{addr}"), &cfg)
                    .await
                    .map_err(|e| format!("{transport}: {e}"))?;
                label = format!("bx/{}", ch.transport());
                PsClient::Bx(ParameterServerClient::new(ch))
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
            other => return Err(format!("unknown transport {other:?} (rdma, tcp or h2)")),
        };
        clients.push(c);
    }
    Ok((clients, label))
}

/// Pulls keys the workload never touches and compares every value with the init.
async fn check(client: &mut PsClient, args: &BenchArgs) -> Result<(), String> {
    let keys: Vec<u64> = (0..CHECK_KEYS).map(|i| args.keys + i * 7919).collect();
    let (dim, values) = client
        .pull(keys.clone())
        .await
        .map_err(|e| format!("check pull: {e}"))?;
    if dim as usize != args.dim {
        return Err(format!(
            "check pull: server dim {dim}, bench dim {}",
            args.dim
        ));
    }
    let v = decode_f32s(&values);
    if v.len() != keys.len() * args.dim {
        return Err(format!(
            "check pull: {} values for {} keys x dim {}",
            v.len(),
            keys.len(),
            args.dim
        ));
    }
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

/// One loop of sequential calls until `until`; latencies go to `hist` when given.
async fn call_loop(
    mut client: PsClient,
    args: &BenchArgs,
    workload: Workload,
    seed: u64,
    until: Instant,
    mut hist: Option<&mut Histogram<u64>>,
) -> Result<u64, String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let n = workload.keys_per_call();
    let grads = workload.grads(args.dim);
    let mut calls = 0;
    while Instant::now() < until {
        let call = workload.next_call(&mut rng);
        let t0 = Instant::now();
        match call {
            Call::Push(keys) => client
                .push(keys, grads.clone())
                .await
                .map_err(|e| format!("push: {e}"))?,
            Call::Pull(keys) => {
                let (dim, values) = client.pull(keys).await.map_err(|e| format!("pull: {e}"))?;
                if dim as usize != args.dim || values.len() != n * args.dim * 4 {
                    return Err(format!(
                        "pull: dim {dim} and {} bytes for {n} keys",
                        values.len()
                    ));
                }
            }
        }
        let us = t0.elapsed().as_micros() as u64;
        if let Some(h) = hist.as_deref_mut() {
            h.saturating_record(us.max(1));
        }
        calls += 1;
    }
    Ok(calls)
}

/// Runs `in_flight` call loops over `clients` for `secs`; returns calls and latencies.
async fn phase(
    clients: &[PsClient],
    args: &BenchArgs,
    secs: f64,
    record: bool,
    seed: u64,
) -> Result<(u64, Histogram<u64>), String> {
    let workload = Workload::new(args.keys, args.skew, args.keys_per_call, args.push_ratio)
        .map_err(|e| e.to_string())?;
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let loops = args.in_flight.max(1);
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
        )
    });
    let calls = futures::future::try_join_all(runs).await?.into_iter().sum();
    let mut total = Histogram::new_with_bounds(1, 60_000_000, 3).expect("static bounds");
    for h in &hists {
        total.add(h).map_err(|e| e.to_string())?;
    }
    Ok((calls, total))
}

async fn run_transport(
    transport: &str,
    server: &ServerChild,
    args: &BenchArgs,
    seed: u64,
) -> Result<Row, String> {
    let (mut clients, label) = connect(transport, &server.addr, args.workers).await?;
    check(&mut clients[0], args).await?;
    phase(&clients, args, args.warmup, false, seed).await?;
    let per_sec = cpu::clock_ticks_per_sec();
    let (c0, s0) = (
        cpu::cpu_ticks(None).map_err(|e| e.to_string())?,
        cpu::cpu_ticks(Some(server.pid)).map_err(|e| e.to_string())?,
    );
    let t0 = Instant::now();
    let (calls, hist) = phase(&clients, args, args.duration, true, seed + 1).await?;
    let elapsed = t0.elapsed().as_secs_f64();
    let (c1, s1) = (
        cpu::cpu_ticks(None).map_err(|e| e.to_string())?,
        cpu::cpu_ticks(Some(server.pid)).map_err(|e| e.to_string())?,
    );
    let per_call = |ticks: u64| {
        cpu::ticks_to_duration(ticks, per_sec).as_secs_f64() * 1e6 / calls.max(1) as f64
    };
    Ok(Row {
        transport: label,
        calls,
        mean_us: hist.mean(),
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
        calls_per_sec: calls as f64 / elapsed,
        client_cpu_us: per_call(c1 - c0),
        server_cpu_us: per_call(s1 - s0),
    })
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
    let mut server = start_server(args.dim).await?;
    eprintln!(
        "bx ps bench: server pid {} at {}; {} keys, dim {}, {} keys/call, zipf {}, {} workers, {} in flight, {:.1}+{:.1} s per transport, push ratio {}",
        server.pid,
        server.addr,
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
    let mut rows = Vec::new();
    for (i, t) in args.transports.iter().enumerate() {
        match run_transport(t, &server, args, i as u64 * 7 + 1).await {
            Ok(row) => rows.push(row),
            Err(e) if e.starts_with(&format!("{t}: ")) => {
                eprintln!("bx ps bench: skipping {t}: cannot connect: {e}")
            }
            Err(e) => {
                let _ = server.child.kill().await;
                return Err(format!("{t}: {e}"));
            }
        }
    }
    let _ = server.child.kill().await;
    Ok(rows)
}

/// The rows as an aligned text table.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<10} {:>9} {:>9} {:>8} {:>8} {:>9} {:>10} {:>14} {:>14}\n",
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
    for r in rows {
        s += &format!(
            "{:<10} {:>9} {:>9.1} {:>8} {:>8} {:>9} {:>10.0} {:>14.1} {:>14.1}\n",
            r.transport,
            r.calls,
            r.mean_us,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.calls_per_sec,
            r.client_cpu_us,
            r.server_cpu_us
        );
    }
    s
}

/// The rows as a JSON array of objects (field names as in [`Row`]).
pub fn json(rows: &[Row]) -> String {
    let objs: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "  {{\"transport\": \"{}\", \"calls\": {}, \"mean_us\": {:.3}, \"p50_us\": {}, \"p99_us\": {}, \"p999_us\": {}, \"calls_per_sec\": {:.3}, \"client_cpu_us\": {:.3}, \"server_cpu_us\": {:.3}}}",
                r.transport.escape_default(),
                r.calls,
                finite(r.mean_us),
                r.p50_us,
                r.p99_us,
                r.p999_us,
                finite(r.calls_per_sec),
                finite(r.client_cpu_us),
                finite(r.server_cpu_us)
            )
        })
        .collect();
    format!("[\n{}\n]\n", objs.join(",\n"))
}

/// JSON has no NaN or infinity.
fn finite(v: f64) -> f64 {
    if v.is_finite() { v } else { 0.0 }
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
            p999_us: 30,
            calls_per_sec: 1000.0,
            client_cpu_us: 5.0,
            server_cpu_us: f64::NAN,
        }
    }

    #[test]
    fn table_and_json_shapes() {
        let t = table(&[row()]);
        assert_eq!(t.lines().count(), 2);
        assert!(t.contains("bx/rdma"));
        let j = json(&[row(), row()]);
        assert!(j.contains("\"transport\": \"bx/rdma\""));
        assert!(j.contains("\"server_cpu_us\": 0.000"));
        assert_eq!(j.matches('{').count(), 2);
    }
}
