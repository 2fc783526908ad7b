//! The server `bx ps bench` starts gets its memory in transparent huge pages
//! (`bx::ps::fleet::SERVER_TUNABLES`): the store's rows are read at random, and with 4 KiB
//! pages nearly every row read is a TLB miss. Pinned: the server runs with the tunable, and
//! where the kernel allows THP (`/sys/kernel/mm/transparent_hugepage/enabled` not `[never]`)
//! its prefilled rows sit in huge pages; a caller's own `GLIBC_TUNABLES` is passed on instead.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BX: &str = env!("CARGO_BIN_EXE_bx");

/// Starts a bench whose server prefills `keys` rows and measures long enough to be looked
/// at; returns the bench and its server's pid (from the bench's first stderr line).
fn bench_with_server(keys: &str, env: Option<&str>) -> (std::process::Child, u32) {
    let mut cmd = Command::new(BX);
    cmd.args([
        "ps",
        "bench",
        "--transports",
        "tcp",
        "--keys",
        keys,
        "--ring-keys",
        "1000",
        "--in-flight",
        "1",
        "--warmup",
        "0",
        "--duration",
        "20",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    match env {
        Some(v) => cmd.env("GLIBC_TUNABLES", v),
        None => cmd.env_remove("GLIBC_TUNABLES"),
    };
    let mut child = cmd.spawn().expect("spawn bx ps bench");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let pid = loop {
        let line = lines
            .next()
            .expect("the bench names its server")
            .expect("stderr");
        if let Some(rest) = line.split("server pid ").nth(1) {
            break rest.split(' ').next().unwrap().parse::<u32>().unwrap();
        }
    };
    // keep draining stderr so the bench never blocks on it
    std::thread::spawn(move || for _ in lines {});
    (child, pid)
}

/// `GLIBC_TUNABLES` in the environment of process `pid`.
fn tunables_of(pid: u32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
    env.split(|&b| b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix("GLIBC_TUNABLES=").map(String::from))
}

/// Anonymous memory of `pid` in huge pages, KiB.
fn anon_huge_kib(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).expect("smaps");
    text.lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn thp_allowed() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| !s.contains("[never]"))
}

#[test]
fn the_bench_server_holds_its_prefilled_rows_in_huge_pages() {
    // 400 k rows of dim 64: 100 MiB of rows, prefilled before the server listens
    let (mut bench, pid) = bench_with_server("400000", None);
    assert_eq!(
        tunables_of(pid).as_deref(),
        Some(bx::ps::fleet::SERVER_TUNABLES)
    );
    if thp_allowed() {
        let limit = Instant::now() + Duration::from_secs(20);
        let mut huge = anon_huge_kib(pid);
        while huge < 64 << 10 && Instant::now() < limit {
            std::thread::sleep(Duration::from_millis(200));
            huge = anon_huge_kib(pid);
        }
        assert!(
            huge >= 64 << 10,
            "at least 64 MiB of the 100 MiB of rows in huge pages: {huge} KiB"
        );
    } else {
        eprintln!("THP is off on this kernel: only the tunable is checked");
    }
    let _ = bench.kill();
    let _ = bench.wait();
}

#[test]
fn a_callers_own_glibc_tunables_reach_the_bench_server_unchanged() {
    let mine = "glibc.malloc.arena_max=2";
    let (mut bench, pid) = bench_with_server("1000", Some(mine));
    assert_eq!(tunables_of(pid).as_deref(), Some(mine));
    let _ = bench.kill();
    let _ = bench.wait();
}
