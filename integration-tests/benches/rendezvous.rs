//! Large messages one way: rendezvous (RDMA READ) against chunked SENDs and TCP, beside this
//! machine's single-core memcpy (issue 23; DESIGN.md section 6).
//!
//! `cargo bench -p integration-tests --bench rendezvous [-- --rounds R] [--sizes 16,256]
//! [--sweep]`: starts one `bx-test-server` (the receiver) and three clients on their own
//! links: `rendezvous` (soft RDMA, default threshold), `chunked` (soft RDMA,
//! `rendezvous_threshold` 0) and `tcp`. Each sends Push requests whose body is a pre-built,
//! pre-faulted buffer of the size (MiB), reused by every call (`Bytes` clones), two calls in
//! flight (`--in-flight N`; with one, the sender's copy and the receiver's READ of a
//! rendezvous take turns, so it cannot pass half of memcpy), 1 GiB (at least 4 messages) per
//! case per round. Rounds interleave the cases; the
//! table gives medians over the rounds: MiB/s, and the receiver's CPU per MiB (user + system
//! time of the server process from `/proc/<pid>/stat`, clock ticks) against one memcpy of a MiB
//! on this machine (1 MiB copies sweeping 256 MiB of pre-faulted buffers, median of 5); the
//! bandwidth beside it is that of 256 MiB copies (median of 5), the larger of the two (glibc
//! copies that large with non-temporal stores).
//!
//! Targets (reported, not asserted): rendezvous ≥ chunked and ≥ 0.5 × memcpy bandwidth on the
//! soft provider; receiver CPU per MiB ≤ 1.3 × one memcpy of a MiB.
//!
//! `--window-bytes N`: both ends' `Config::window_bytes` (default 256 KiB; 0 = no cap).
//! `--only CASE`: one case. `--sweep`: MiB/s of rendezvous against chunks for messages of 64 KiB to 4 MiB, 8 in flight
//! (how the default `rendezvous_threshold` was chosen).

use std::time::{Duration, Instant};

use byteexpress_rpc::{Client, Config, Metadata, Request, TransportPref};
use bytes::Bytes;
use integration_tests::{ServerProc, pattern};

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
const MIB: usize = 1 << 20;

fn main() {
    let mut rounds = 5usize;
    let mut sizes = vec![16usize, 256];
    let mut sweep = false;
    let mut in_flight = 2usize;
    let mut only: Option<String> = None;
    let mut window: Option<u64> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).unwrap_or(rounds),
            "--sizes" => {
                sizes = args
                    .next()
                    .map(|v| v.split(',').filter_map(|s| s.parse().ok()).collect())
                    .unwrap_or(sizes)
            }
            "--sweep" => sweep = true,
            "--window-bytes" => window = args.next().and_then(|v| v.parse().ok()),
            "--only" => {
                only = args.next();
            }
            "--in-flight" => {
                in_flight = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(in_flight)
            }
            _ => {}
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        if sweep {
            run_sweep(rounds).await;
        } else {
            run(rounds, &sizes, in_flight, only.as_deref(), window).await;
        }
    });
}

/// Single-core memcpy bandwidth in MiB/s: median of 5 copies of 256 MiB between buffers
/// touched beforehand.
fn memcpy_mib_s() -> f64 {
    let n = 256 * MIB;
    let src = vec![0x5au8; n];
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src);
    let mut rates: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&dst);
            256.0 / t.elapsed().as_secs_f64()
        })
        .collect();
    median(&mut rates)
}

/// CPU µs per MiB of memcpy done one MiB per call (the "one memcpy of a MiB"), over
/// 256 MiB of buffers touched beforehand (so the copies miss the caches as a message's do):
/// median of 5 sweeps.
fn memcpy_1mib_us() -> f64 {
    let n = 256 * MIB;
    let src = vec![0x5au8; n];
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src);
    let mut us: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for (d, s) in dst.chunks_mut(MIB).zip(src.chunks(MIB)) {
                d.copy_from_slice(std::hint::black_box(s));
            }
            std::hint::black_box(&dst);
            t.elapsed().as_secs_f64() * 1e6 / 256.0
        })
        .collect();
    median(&mut us)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

/// User + system CPU time of process `pid` so far (`/proc/<pid>/stat` fields 14 and 15).
fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_secs_f64(ticks as f64 / hz as f64)
}

fn client_cfg(transport: TransportPref, threshold: Option<usize>) -> Config {
    client_cfg_w(transport, threshold, None)
}

fn client_cfg_w(transport: TransportPref, threshold: Option<usize>, window: Option<u64>) -> Config {
    let d = Config::default();
    Config {
        window_bytes: window.unwrap_or(d.window_bytes),
        transport,
        max_message: 300 * MIB,
        memory_budget: 1 << 30,
        rendezvous_threshold: threshold.unwrap_or(d.rendezvous_threshold),
        rendezvous_cache_bytes: 1100 << 20,
        ..d
    }
}

fn push(body: Bytes) -> Request {
    Request {
        method: "/test.Test/Push".into(),
        metadata: Metadata::new(),
        body,
        timeout: Some(Duration::from_secs(120)),
    }
}

/// Sends `count` pushes of `body`, keeping `in_flight` outstanding (a new one as each
/// answer comes); returns the seconds taken.
async fn send(client: &Client, body: &Bytes, count: usize, in_flight: usize) -> f64 {
    use futures::StreamExt;
    let t = Instant::now();
    let mut running = futures::stream::FuturesUnordered::new();
    let mut started = 0;
    while started < count.min(in_flight) {
        running.push(client.call(push(body.clone())));
        started += 1;
    }
    while let Some(r) = running.next().await {
        r.expect("push");
        if started < count {
            running.push(client.call(push(body.clone())));
            started += 1;
        }
    }
    t.elapsed().as_secs_f64()
}

async fn run(
    rounds: usize,
    sizes: &[usize],
    in_flight: usize,
    only: Option<&str>,
    window: Option<u64>,
) {
    let mem = memcpy_mib_s();
    let us_per_mib_memcpy = memcpy_1mib_us();
    let window_arg = window.map(|w| w.to_string());
    let mut args = vec![
        "--max-message-mib",
        "300",
        "--memory-budget-mib",
        "1100",
        "--rendezvous-cache-mib",
        "1100",
    ];
    if let Some(w) = &window_arg {
        args.extend(["--window-bytes", w.as_str()]);
    }
    let server = ServerProc::start(SERVER, &args).await;
    let pid = server.child.id().expect("server pid");
    let cases = [
        ("rendezvous", TransportPref::Rdma, None),
        ("chunked", TransportPref::Rdma, Some(0)),
        ("tcp", TransportPref::Tcp, None),
    ];
    let mut clients = Vec::new();
    for (name, t, th) in cases {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let c = Client::connect(&server.addr, &client_cfg_w(t, th, window))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        clients.push((name, c));
    }
    println!(
        "single-core memcpy: {mem:.0} MiB/s (256 MiB copies); one memcpy of a MiB: \
         {us_per_mib_memcpy:.0} µs; {in_flight} in flight"
    );
    println!(
        "{:>8} {:>11} {:>9} {:>10} {:>12} {:>12}",
        "size", "case", "MiB/s", "× memcpy", "recv µs/MiB", "× memcpy CPU"
    );
    for &mib in sizes {
        let body = pattern(mib * MIB);
        let count = (1024 / mib).max(2 * in_flight);
        let mut rate = vec![Vec::new(); clients.len()];
        let mut cpu = vec![Vec::new(); clients.len()];
        for (i, (_, c)) in clients.iter().enumerate() {
            send(c, &body, 1, 1).await; // warm: the link's regions mapped and faulted in
            let _ = i;
        }
        for _ in 0..rounds {
            for (i, (_, c)) in clients.iter().enumerate() {
                let c0 = cpu_of(pid);
                let secs = send(c, &body, count, in_flight).await;
                let used = cpu_of(pid) - c0;
                let total = (mib * count) as f64;
                rate[i].push(total / secs);
                cpu[i].push(used.as_secs_f64() * 1e6 / total);
            }
        }
        for (i, (name, _)) in clients.iter().enumerate() {
            let r = median(&mut rate[i]);
            let u = median(&mut cpu[i]);
            println!(
                "{:>6}Mi {:>11} {:>9.0} {:>10.2} {:>12.0} {:>12.2}",
                mib,
                name,
                r,
                r / mem,
                u,
                u / us_per_mib_memcpy
            );
        }
    }
}

async fn run_sweep(rounds: usize) {
    let server = ServerProc::start(
        SERVER,
        &["--max-message-mib", "64", "--memory-budget-mib", "1100"],
    )
    .await;
    let rdv = Client::connect(&server.addr, &client_cfg(TransportPref::Rdma, Some(1)))
        .await
        .expect("rendezvous client");
    let chunked = Client::connect(&server.addr, &client_cfg(TransportPref::Rdma, Some(0)))
        .await
        .expect("chunked client");
    println!("{:>9} {:>14} {:>11}", "size", "rendezvous", "chunked");
    for kib in [16usize, 64, 128, 256, 512, 1024, 4096] {
        let body = pattern(kib << 10);
        let count = ((64 << 10) / kib).max(16);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        send(&rdv, &body, 8, 8).await;
        send(&chunked, &body, 8, 8).await;
        for _ in 0..rounds {
            let mibs = (kib * count) as f64 / 1024.0;
            a.push(mibs / send(&rdv, &body, count, 8).await);
            b.push(mibs / send(&chunked, &body, count, 8).await);
        }
        println!(
            "{:>6}KiB {:>9.0} MiB/s {:>7.0} MiB/s",
            kib,
            median(&mut a),
            median(&mut b)
        );
    }
}
