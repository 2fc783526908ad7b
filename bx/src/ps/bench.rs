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

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
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
    /// 99.9th percentile latency, µs.
    pub p999_us: u64,
    /// Throughput, calls per second.
    pub calls_per_sec: f64,
    /// Client process CPU time (user + system) per call, µs.
    pub client_cpu_us: f64,
    /// Server process CPU time per call, µs; `None` for a server the bench did not start.
    pub server_cpu_us: Option<f64>,
    /// Latency CDF: (latency µs, fraction of calls at or below it), rising in both.
    pub cdf: Vec<(f64, f64)>,
}

/// Why [`run_until_signal`] ended without rows.
#[derive(Debug)]
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

/// The server under test: a `bx ps serve` child (killed on drop) or one at `--server`.
#[derive(Debug)]
struct ServerChild {
    child: Option<Child>,
    addr: String,
    /// The child's pid, for its CPU time; `None` for a server started elsewhere.
    pid: Option<u32>,
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
            "--parent-pid",
            &std::process::id().to_string(),
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
    Ok(ServerChild {
        child: Some(child),
        addr,
        pid: Some(pid),
    })
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
                    .map_err(|e| format!("{transport}: --transports {transport}: {e}"))?;
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
    let server_ticks = || -> Result<Option<u64>, String> {
        server
            .pid
            .map(|pid| cpu::cpu_ticks(Some(pid)).map_err(|e| e.to_string()))
            .transpose()
    };
    let (c0, s0) = (
        cpu::cpu_ticks(None).map_err(|e| e.to_string())?,
        server_ticks()?,
    );
    let t0 = Instant::now();
    let (calls, hist) = phase(&clients, args, args.duration, true, seed + 1).await?;
    let elapsed = t0.elapsed().as_secs_f64();
    let (c1, s1) = (
        cpu::cpu_ticks(None).map_err(|e| e.to_string())?,
        server_ticks()?,
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
        server_cpu_us: s0.zip(s1).map(|(a, b)| per_call(b - a)),
        cdf: cdf(&hist),
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
    let mut server = match &args.server {
        Some(addr) => ServerChild {
            child: None,
            addr: addr.clone(),
            pid: None,
        },
        None => start_server(args.dim).await?,
    };
    let who = match server.pid {
        Some(pid) => format!("server pid {pid}"),
        None => "server (started elsewhere)".into(),
    };
    eprintln!(
        "bx ps bench: {who} at {}; {} keys, dim {}, {} keys/call, zipf {}, {} workers, {} in flight, {:.1}+{:.1} s per transport, push ratio {}",
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
    for (i, t) in args.transports.iter().enumerate() {
        bar.set_message(t.clone());
        match run_transport(t, &server, args, i as u64 * 7 + 1).await {
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
    if let Some(child) = server.child.as_mut() {
        let _ = child.kill().await;
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(rows),
    }
}

/// The progress bar on stderr (drawn only on a terminal): time through the whole bench,
/// with the transport running now.
fn progress_bar(args: &BenchArgs) -> indicatif::ProgressBar {
    let total = (args.warmup + args.duration) * args.transports.len() as f64;
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

/// The rows as an aligned text table.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<16} {:>9} {:>9} {:>8} {:>8} {:>9} {:>10} {:>14} {:>14}\n",
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
        let server_cpu = r
            .server_cpu_us
            .map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
        s += &format!(
            "{:<16} {:>9} {:>9.1} {:>8} {:>8} {:>9} {:>10.0} {:>14.1} {:>14}\n",
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
    }
    s
}

/// The settings and every row as one JSON object: `{"settings": {...}, "rows": [...]}`, row
/// fields named as in [`Row`] (without the CDF), `server_cpu_us` null for a server the bench
/// did not start.
pub fn json(args: &BenchArgs, rows: &[Row]) -> String {
    let transports: Vec<String> = args.transports.iter().map(|t| json_str(t)).collect();
    let settings = format!(
        "{{\"keys\": {}, \"dim\": {}, \"keys_per_call\": {}, \"skew\": {}, \"workers\": {}, \"in_flight\": {}, \"duration_s\": {}, \"warmup_s\": {}, \"push_ratio\": {}, \"transports\": [{}], \"server\": {}}}",
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
            format!(
                "    {{\"transport\": {}, \"calls\": {}, \"mean_us\": {:.3}, \"p50_us\": {}, \"p99_us\": {}, \"p999_us\": {}, \"calls_per_sec\": {:.3}, \"client_cpu_us\": {:.3}, \"server_cpu_us\": {}}}",
                json_str(&r.transport),
                r.calls,
                finite(r.mean_us),
                r.p50_us,
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
            .label(r.transport.clone())
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
            p999_us: 30,
            calls_per_sec: 1000.0,
            client_cpu_us: 5.0,
            server_cpu_us: Some(f64::NAN),
            cdf: vec![(10.0, 0.0), (11.0, 0.5), (30.0, 1.0)],
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
