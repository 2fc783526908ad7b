//! `bx ps bench` as an operator runs it, as processes on this host (the soft device): its
//! `bx ps serve` child dies with it however it is stopped (SIGINT, SIGTERM, SIGKILL; checked
//! by pid), `--server` drives a server started elsewhere while both processes serve their
//! metrics in Prometheus text format (scraped during the bench), `--json` and `--plot` write
//! every row, and `RUST_LOG` governs the one log line per link set-up.

mod pingpong_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pingpong_common::*;

const LIMIT: Duration = Duration::from_secs(120);

/// Bench flags for a small, quick workload.
const SMALL: &[&str] = &["--keys", "1000", "--workers", "1", "--in-flight", "4"];

/// The pid in `bx ps bench: server pid N at ...`.
fn server_pid(line: &str) -> u32 {
    line.split("server pid ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"))
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Starts a long bench, waits for its server child, sends `sig` to the bench and checks that
/// the child is gone within a loose bound. Returns the bench's exit.
fn stop_bench_with(sig: Signal) -> std::process::ExitStatus {
    let mut args = vec!["ps", "bench", "--transports", "tcp", "--duration", "600"];
    args.extend_from_slice(SMALL);
    let mut bench = spawn(BX, &args);
    let rx = stderr_lines(&mut bench);
    let (line, _) = wait_line(&rx, "server pid", LIMIT);
    let pid = server_pid(&line);
    assert!(alive(pid), "server {pid} not running");
    assert!(
        cmdline(pid).contains("ps serve"),
        "{pid} is {:?}",
        cmdline(pid)
    );
    kill(Pid::from_raw(bench.id() as i32), sig).unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = bench.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < LIMIT, "bench still running after {sig}");
        std::thread::sleep(Duration::from_millis(10));
    };
    let t0 = Instant::now();
    while alive(pid) {
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            panic!("bx ps serve {pid} outlived its bench stopped by {sig}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if sig != Signal::SIGKILL {
        let rest: Vec<String> = rx.try_iter().collect();
        assert!(
            rest.iter()
                .any(|l| l.contains(&format!("stopped by {sig}"))),
            "{rest:#?}"
        );
    }
    status
}

#[test]
fn sigterm_of_bench_leaves_no_serve_child() {
    let st = stop_bench_with(Signal::SIGTERM);
    assert_eq!(st.code(), Some(128 + 15), "{st:?}");
}

#[test]
fn sigint_of_bench_leaves_no_serve_child() {
    let st = stop_bench_with(Signal::SIGINT);
    assert_eq!(st.code(), Some(128 + 2), "{st:?}");
}

#[test]
fn sigkill_of_bench_leaves_no_serve_child() {
    let st = stop_bench_with(Signal::SIGKILL);
    assert_eq!(st.code(), None, "{st:?}");
}

/// `GET /metrics` over plain HTTP/1.1; the body, or `None` while nothing answers.
fn scrape(addr: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/1.1 200").then_some(out)
}

/// A server the test started itself, killed and reaped when dropped: a failing assertion
/// leaves no `bx ps serve` running (it has no bench to die with).
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Scrapes `addr` until its text holds every one of `needles` (at most `limit`).
fn scrape_until(addr: &str, needles: &[&str], limit: Duration) -> String {
    let t0 = Instant::now();
    loop {
        let text = scrape(addr).unwrap_or_default();
        if needles.iter().all(|n| text.contains(n)) {
            return text;
        }
        assert!(
            t0.elapsed() < limit,
            "{addr} never showed all of {needles:?}; last:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The name of the device an RDMA link of this host takes (hardware first).
fn first_device() -> String {
    byteexpress_verbs::devices()
        .first()
        .expect("a device")
        .name()
        .to_string()
}

#[test]
fn bench_drives_a_separately_started_server_while_both_serve_prometheus_metrics() {
    let serve_metrics = format!("127.0.0.1:{}", free_port());
    let mut serve = KilledOnDrop(spawn(BX, &["ps", "serve", "--metrics", &serve_metrics]));
    let mut out = BufReader::new(serve.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("LISTENING ")
        .expect(&line)
        .to_string();

    let dir = std::env::temp_dir().join(format!("bx-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, svg) = (dir.join("rows.json"), dir.join("cdf.svg"));
    let bench_metrics = format!("127.0.0.1:{}", free_port());
    let mut args = vec![
        "ps",
        "bench",
        "--server",
        &addr,
        "--metrics",
        &bench_metrics,
        "--transports",
        "rdma,tcp",
        "--duration",
        "3",
        "--warmup",
        "0.5",
    ];
    args.extend_from_slice(SMALL);
    let (json_s, svg_s) = (json.to_str().unwrap(), svg.to_str().unwrap());
    args.extend_from_slice(&["--json", json_s, "--plot", svg_s]);
    let bench = spawn(BX, &args);

    // During the bench: the client side of the calls and links in the bench's endpoint ...
    let client = scrape_until(
        &bench_metrics,
        &[
            "bx_calls_total{side=\"client\",method=\"/ps.ParameterServer/Pull\",code=\"Ok\"}",
            "bx_call_duration_seconds",
            "bx_links_opened_total",
            "bx_links_open",
            "bx_bytes_sent_total",
            "bx_bytes_received_total",
            "bx_chunks_sent_total",
            "bx_window_cap_bytes",
        ],
        LIMIT,
    );
    assert!(
        client.contains(&format!("device=\"{}\"", first_device())),
        "{client}"
    );
    // ... and the server side in the server's.
    let server = scrape_until(
        &serve_metrics,
        &[
            "bx_calls_total{side=\"server\",method=\"/ps.ParameterServer/Pull\",code=\"Ok\"}",
            "bx_links_opened_total",
            "bx_bytes_received_total",
        ],
        LIMIT,
    );
    assert!(server.contains("transport=\"rdma\""), "{server}");

    let f = finish(bench, LIMIT);
    drop(serve);
    assert!(f.status.success(), "{}", f.both());
    let rdma = format!("bx/rdma({})", first_device());
    assert!(f.stdout.contains(&rdma), "{}", f.both());
    assert!(f.stdout.contains("bx/tcp"), "{}", f.both());
    assert!(
        f.stderr.contains("server (started elsewhere)"),
        "{}",
        f.both()
    );
    let j = std::fs::read_to_string(&json).unwrap();
    assert!(j.contains(&format!("\"server\": \"{addr}\"")), "{j}");
    assert!(j.contains(&format!("\"transport\": \"{rdma}\"")), "{j}");
    assert!(j.contains("\"transport\": \"bx/tcp\""), "{j}");
    assert!(j.contains("\"server_cpu_us\": null"), "{j}");
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(
        s.contains("<svg") && s.contains(&rdma) && s.contains("bx/tcp"),
        "{s}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn logs_follow_rust_log_with_one_info_line_per_link_set_up() {
    let mut args = vec![
        "ps",
        "bench",
        "--transports",
        "rdma,tcp",
        "--duration",
        "0.3",
        "--warmup",
        "0",
    ];
    args.extend_from_slice(SMALL);
    let f = finish(spawn(BX, &args), LIMIT);
    assert!(f.status.success(), "{}", f.both());
    let lines: Vec<&str> = f
        .stderr
        .lines()
        .filter(|l| l.contains("link set up"))
        .collect();
    assert_eq!(lines.len(), 2, "one per link (rdma, tcp): {}", f.both());
    let rdma = lines
        .iter()
        .find(|l| l.contains("transport=rdma"))
        .expect("rdma line");
    assert!(
        rdma.contains(" INFO ") && rdma.contains("peer=127.0.0.1:"),
        "{rdma}"
    );
    assert!(
        rdma.contains(&format!("device={} why=\"", first_device())),
        "{rdma}"
    );
    let tcp = lines
        .iter()
        .find(|l| l.contains("transport=tcp"))
        .expect("tcp line");
    assert!(
        tcp.contains("device=- why=\"forced by Config::transport = tcp\""),
        "{tcp}"
    );
    // the server child logs its side too
    assert!(f.stderr.contains("link accepted"), "{}", f.both());

    let f = finish(spawn_env(BX, &args, &[("RUST_LOG", "warn")]), LIMIT);
    assert!(f.status.success(), "{}", f.both());
    assert!(!f.stderr.contains("link set up"), "{}", f.both());
}

#[test]
fn forcing_rdma_where_no_device_exists_names_what_the_user_set() {
    let mut args = vec![
        "ps",
        "bench",
        "--transports",
        "rdma",
        "--duration",
        "0.3",
        "--warmup",
        "0",
    ];
    args.extend_from_slice(SMALL);
    let f = finish(spawn_env(BX, &args, &[("BX_SOFT", "0")]), LIMIT);
    if byteexpress_verbs::ibverbs_devices().is_ok() {
        // rdma-core devices exist here: the row runs on one of them
        assert!(f.stdout.contains("bx/rdma("), "{}", f.both());
        return;
    }
    assert!(!f.status.success(), "{}", f.both());
    for part in [
        "skipping rdma: cannot connect: --transports rdma: ",
        "RDMA required by Config::transport = rdma, but no RDMA link to 127.0.0.1:",
    ] {
        assert!(f.stderr.contains(part), "{part:?}: {}", f.both());
    }
    assert!(
        f.stderr.contains("no RDMA device on this host"),
        "{}",
        f.both()
    );
    assert!(!f.stderr.contains("BX_TRANSPORT"), "{}", f.both());
}

/// On a terminal (a pty from util-linux's `script`) the bench draws its progress bar on
/// stderr, with the transport running and the share of the bench done.
#[test]
fn a_terminal_gets_a_progress_bar() {
    let mut cmd = format!("{BX} ps bench --transports tcp --duration 1 --warmup 0");
    for a in SMALL {
        cmd += " ";
        cmd += a;
    }
    let f = finish(spawn("script", &["-qfec", &cmd, "/dev/null"]), LIMIT);
    assert!(f.status.success(), "{}", f.both());
    let out = f.stdout.replace('\r', "\n");
    assert!(
        out.lines()
            .any(|l| l.contains("bx ps bench   tcp [") && l.contains("%")),
        "no progress bar: {out}"
    );
    // without a terminal (the other tests' pipes) there is none
    let mut args = vec![
        "ps",
        "bench",
        "--transports",
        "tcp",
        "--duration",
        "0.3",
        "--warmup",
        "0",
    ];
    args.extend_from_slice(SMALL);
    let f = finish(spawn(BX, &args), LIMIT);
    assert!(f.status.success(), "{}", f.both());
    assert!(!f.stderr.contains("bx ps bench   tcp ["), "{}", f.both());
}

/// `--push-bytes` runs dense pushes, one row per size and transport, each with its push size
/// and a non-zero MiB/s in the table and the JSON; a size above the library's default
/// `max_message` (16 MiB) arrives because the bench raises the limit on both sides.
#[test]
fn dense_pushes_report_mib_per_s_per_size_over_rdma_and_tcp_in_the_table_and_json() {
    let dir = std::env::temp_dir().join(format!("bx-push-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("rows.json");
    let mut args = vec![
        "ps",
        "bench",
        "--transports",
        "rdma,tcp",
        "--push-bytes",
        "64KiB,17MiB",
        "--dim",
        "256",
        "--duration",
        "1",
        "--warmup",
        "0",
        "--json",
        json.to_str().unwrap(),
    ];
    args.extend_from_slice(SMALL);
    let f = finish(spawn(BX, &args), LIMIT);
    assert!(f.status.success(), "{}", f.both());
    let lines: Vec<&str> = f.stdout.lines().collect();
    assert!(
        lines[0].ends_with("    push     MiB/s"),
        "no push columns: {}",
        f.both()
    );
    let rdma = format!("bx/rdma({})", first_device());
    let mut seen = Vec::new();
    for l in &lines[1..] {
        let cols: Vec<&str> = l.split_whitespace().collect();
        let mib: f64 = cols[cols.len() - 1].parse().expect(l);
        assert!(mib > 0.0, "zero MiB/s: {l}");
        seen.push((cols[0].to_string(), cols[cols.len() - 2].to_string()));
    }
    let want: Vec<(String, String)> = [&rdma[..], "bx/tcp"]
        .iter()
        .flat_map(|t| ["64KiB", "17MiB"].map(|s| (t.to_string(), s.to_string())))
        .collect();
    assert_eq!(seen, want, "{}", f.both());
    let j = std::fs::read_to_string(&json).unwrap();
    assert!(j.contains("\"push_bytes\": [65536, 17825792]"), "{j}");
    for b in [65536, 17825792] {
        assert_eq!(
            j.matches(&format!("\"push_bytes\": {b}, \"mib_per_sec\": "))
                .count(),
            2,
            "{j}"
        );
    }
    assert!(!j.contains("\"mib_per_sec\": 0.000"), "{j}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A push that cannot fit the wire (a message of 4 GiB − 1 bytes at most) is refused with the
/// limit named before any server starts or any row runs.
#[test]
fn a_push_above_the_wire_limit_is_refused_before_anything_starts() {
    let f = finish(
        spawn(BX, &["ps", "bench", "--push-bytes", "64KiB,4GiB"]),
        LIMIT,
    );
    assert_eq!(f.status.code(), Some(1), "{}", f.both());
    assert!(
        f.stderr.contains(
            "--push-bytes 4GiB: a push of 4294967296 bytes of gradient needs a message of up to"
        ) && f
            .stderr
            .contains("above the wire limit of 4294967295 bytes"),
        "{}",
        f.both()
    );
    assert!(!f.stderr.contains("server pid"), "{}", f.both());
    assert!(f.stdout.is_empty(), "{}", f.both());
}
