//! What a row's measured phase cost the client and the server: CPU time (`/proc/<pid>/stat`,
//! [`byteexpress_ps::cpu`]) and system calls, counted by `perf stat -e
//! raw_syscalls:sys_enter -p PID` (perf-stat(1); the tracepoint fires on every syscall entry
//! of the process's threads) run around the phase. Without perf, or where it cannot attach
//! (`perf_event_paranoid`, no tracefs), the syscall counts are `None` and print as `n/a`.

use std::process::Stdio;
use std::time::Duration;

use byteexpress_ps::cpu;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// The tracepoint counted.
const EVENT: &str = "raw_syscalls:sys_enter";
/// Time given perf to attach before the phase starts (it says nothing when it has; the
/// few syscalls of the idle wait are counted with the phase's).
const ATTACH: Duration = Duration::from_millis(200);

/// The syscall count of `perf stat -x ,` output (`COUNT,UNIT,EVENT,...`) or of its default
/// human format (`   1,234   raw_syscalls:sys_enter`); `None` for `<not counted>`,
/// `<not supported>` or no line of the event.
pub fn parse_perf_count(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.contains(EVENT))?;
    let line = line.trim_start();
    let first = if line.contains(&format!(",{EVENT}")) {
        line.split(',').next()?
    } else {
        line.split_whitespace().next()?
    };
    let digits: String = first.chars().filter(|c| *c != ',' && *c != '.').collect();
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A `perf stat` counting one process's syscalls.
#[derive(Debug)]
struct PerfStat {
    child: Child,
}

impl PerfStat {
    /// Starts counting `pid`'s syscalls; `None` when perf cannot be started.
    fn start(pid: u32) -> Option<PerfStat> {
        let child = Command::new("perf")
            .args(["stat", "-x", ",", "-e", EVENT, "-p", &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .ok()?;
        Some(PerfStat { child })
    }

    /// Stops counting (SIGINT, as perf stat expects) and reads the count; `None` when perf
    /// failed or said nothing countable within 5 s.
    async fn stop(self) -> Option<u64> {
        let pid = self.child.id()?;
        kill(Pid::from_raw(pid as i32), Signal::SIGINT).ok()?;
        let out = tokio::time::timeout(Duration::from_secs(5), self.child.wait_with_output())
            .await
            .ok()?
            .ok()?;
        let text = String::from_utf8_lossy(&out.stderr);
        let n = parse_perf_count(&text);
        if n.is_none() {
            tracing::debug!("perf stat gave no count: {text}");
        }
        n
    }
}

/// CPU and syscalls of the client (this process) and the server (`server`, when the bench
/// started it) from [`Usage::start`] to [`Usage::stop`].
#[derive(Debug)]
pub struct Usage {
    server: Option<u32>,
    client_ticks: u64,
    server_ticks: Option<u64>,
    perf: (Option<PerfStat>, Option<PerfStat>),
}

/// What [`Usage::stop`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Used {
    /// Client CPU, clock ticks.
    pub client_ticks: u64,
    /// Server CPU, clock ticks; `None` for a server the bench did not start.
    pub server_ticks: Option<u64>,
    /// Client syscalls; `None` without perf.
    pub client_syscalls: Option<u64>,
    /// Server syscalls; `None` without perf or without a server pid.
    pub server_syscalls: Option<u64>,
}

impl Usage {
    /// Starts counting: perf on this process and on `server` (its pid, if known), then, once
    /// perf had time to attach, the CPU ticks. `server_ticks` reads the servers' ticks (a
    /// fleet's are summed). Errors: `/proc`.
    pub async fn start(
        server: Option<u32>,
        server_ticks: Result<Option<u64>, String>,
        syscalls: bool,
    ) -> Result<Usage, String> {
        let perf = if syscalls {
            let p = (
                PerfStat::start(std::process::id()),
                server.and_then(PerfStat::start),
            );
            if p.0.is_some() || p.1.is_some() {
                tokio::time::sleep(ATTACH).await;
            }
            p
        } else {
            (None, None)
        };
        Ok(Usage {
            server,
            client_ticks: cpu::cpu_ticks(None).map_err(|e| e.to_string())?,
            server_ticks: server_ticks?,
            perf,
        })
    }

    /// Stops counting; `server_ticks` reads the servers' ticks now. Errors: `/proc`.
    pub async fn stop(self, server_ticks: Result<Option<u64>, String>) -> Result<Used, String> {
        let client_ticks = cpu::cpu_ticks(None).map_err(|e| e.to_string())? - self.client_ticks;
        let server_ticks = self.server_ticks.zip(server_ticks?).map(|(a, b)| b - a);
        let (c, s) = self.perf;
        let client_syscalls = match c {
            Some(p) => p.stop().await,
            None => None,
        };
        let server_syscalls = match (s, self.server) {
            (Some(p), Some(_)) => p.stop().await,
            _ => None,
        };
        Ok(Used {
            client_ticks,
            server_ticks,
            client_syscalls,
            server_syscalls,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_counts_parse_from_csv_and_human_output_and_missing_counts_are_none() {
        let csv = "109,,raw_syscalls:sys_enter,1669986,100.00,,\n";
        assert_eq!(parse_perf_count(csv), Some(109));
        let human = "\n Performance counter stats for process id '4242':\n\n         1,234,567      raw_syscalls:sys_enter\n\n       2.001 seconds time elapsed\n";
        assert_eq!(parse_perf_count(human), Some(1_234_567));
        assert_eq!(
            parse_perf_count("<not counted>,,raw_syscalls:sys_enter,0,100.00,,"),
            None
        );
        assert_eq!(
            parse_perf_count("<not supported>,,raw_syscalls:sys_enter,0,0.00,,"),
            None
        );
        assert_eq!(
            parse_perf_count("event syntax error: 'raw_syscalls:sys_enter'\n"),
            None
        );
        assert_eq!(parse_perf_count(""), None);
    }
}
