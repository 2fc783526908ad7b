//! Helpers of the `bx pingpong` / `bx devices` process tests: spawning with a deadline,
//! waiting for a TCP listener without connecting to it (`ibv_rc_pingpong` accepts exactly one
//! connection), and free ports.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The `bx` binary of this package.
pub const BX: &str = env!("CARGO_BIN_EXE_bx");

/// A finished process: exit status and everything it printed.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// Both streams, for assertion messages.
    pub fn both(&self) -> String {
        format!(
            "status {:?}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Starts `prog args` with piped output.
pub fn spawn(prog: &str, args: &[&str]) -> Child {
    spawn_env(prog, args, &[])
}

/// Starts `prog args` with piped output and `env` added to its environment.
pub fn spawn_env(prog: &str, args: &[&str], env: &[(&str, &str)]) -> Child {
    Command::new(prog)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {prog}: {e}"))
}

/// Waits for `child` until `limit`, killing it after that; collects its output.
pub fn finish(mut child: Child, limit: Duration) -> Finished {
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut o) = child.stdout.take() {
        o.read_to_string(&mut stdout).unwrap();
    }
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut stderr).unwrap();
    }
    Finished {
        status,
        stdout,
        stderr,
    }
}

/// True when some socket listens on TCP `port` (IPv4 or IPv6), read from `/proc/net/tcp*`.
pub fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
        })
    })
}

/// Waits until `port` listens, or fails the test after `limit` (with `child`'s output when it
/// died first).
pub fn wait_listening(port: u16, child: &mut Child, limit: Duration) {
    let t0 = Instant::now();
    while !listening(port) {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("server exited ({st:?}) before listening on {port}: {err}");
        }
        assert!(t0.elapsed() < limit, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A TCP port nothing listens on right now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The `N iters in T seconds = X usec/iter` line's iteration count, if printed.
pub fn iters_done(out: &str) -> Option<u32> {
    out.lines()
        .find(|l| l.contains(" iters in ") && l.ends_with("usec/iter"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// Peak resident set (`VmHWM`, KiB) of a running process; `None` once it is gone.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Forwards `child`'s stderr lines to a channel (and keeps them), so a test can wait for one
/// line and still see everything at the end.
pub fn stderr_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().expect("piped stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits (at most `limit`) for a line containing `needle`; returns it and the lines seen.
pub fn wait_line(
    rx: &mpsc::Receiver<String>,
    needle: &str,
    limit: Duration,
) -> (String, Vec<String>) {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    loop {
        let left = limit.saturating_sub(t0.elapsed());
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(needle) => return (l, seen),
            Ok(l) => seen.push(l),
            Err(_) => panic!("no line with {needle:?} within {limit:?}; saw {seen:#?}"),
        }
    }
}

/// True while `pid` is a live process (not gone, not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            state != Some("Z")
        }
        Err(_) => false,
    }
}
