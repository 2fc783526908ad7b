//! The servers of `bx ps bench`: one `bx ps serve` child (or a server at `--server`), or, with
//! `--servers N --replicas R`, a fleet of N×R children, replica set r of shard s started with
//! `--shard s --shards N`; and the faults the bench injects into a fleet's victim (replica 0
//! of shard 0) during the measured phase.
//!
//! Every child dies with the bench: dropping a [`ServerChild`] sends it SIGCONT (a stalled
//! child would otherwise keep its SIGKILL pending until continued by no one) and SIGKILL, on
//! every path out of the bench, errors and SIGINT/SIGTERM included; a SIGKILLed bench takes
//! its children with it through `PR_SET_PDEATHSIG` (`--parent-pid`).

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use byteexpress_ps::cpu;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::bench::BenchArgs;

/// How long `--fault stall` keeps its victim stopped.
pub const STALL: Duration = Duration::from_secs(2);
/// How late the victim of `--fault slow` answers.
pub const SLOW: Duration = Duration::from_millis(20);

/// A fault injected into replica 0 of shard 0 during the measured phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// SIGKILL (kill -9).
    Kill,
    /// SIGSTOP, then SIGCONT 2 s later.
    Stall,
    /// Every answer 20 ms late from then on (the victim runs with `--delay-ms 20` and gets
    /// SIGUSR1).
    Slow,
}

impl Fault {
    /// The flag's value: `kill`, `stall` or `slow`.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Stall => "stall",
            Fault::Slow => "slow",
        }
    }
}

/// A server under test: a `bx ps serve` child (SIGCONT and SIGKILL on drop) or one at
/// `--server`.
#[derive(Debug)]
pub struct ServerChild {
    child: Option<Child>,
    /// `host:port` it listens on.
    pub addr: String,
    /// The child's pid, for its CPU time and faults; `None` for a server started elsewhere.
    pub pid: Option<u32>,
    /// `host:port` of its native `byteexpress-rpc` port (`bx ps serve --native-addr`), if any.
    pub native: Option<String>,
    /// `host:port` of its floor/tcp port (`bx ps serve --floor-addr`), if any.
    pub floor: Option<String>,
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        if let (Some(child), Some(pid)) = (self.child.as_mut(), self.pid) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
            let _ = child.start_kill();
        }
    }
}

/// glibc tunables of a server the bench starts: its allocator advises transparent huge pages
/// on the memory it takes from the kernel and grows its heap in huge-page steps
/// (`glibc.malloc.hugetlb=1`, glibc 2.35 and later; others ignore it, as does a kernel with
/// THP `never`). The store's rows (256 MiB at 1 M keys of dim 64) are read at random, and
/// with 4 KiB pages nearly every row read was a TLB miss: at `c64_16k`, `floor/tcp`'s server
/// spent 12.5 µs of CPU per call with 4 KiB pages and 10.1 µs with huge pages (medians of 3
/// interleaved runs, README).
pub const SERVER_TUNABLES: &str = "glibc.malloc.hugetlb=1";

impl ServerChild {
    /// The server at `addr`, started elsewhere.
    pub fn elsewhere(addr: String) -> ServerChild {
        ServerChild {
            child: None,
            addr,
            pid: None,
            native: None,
            floor: None,
        }
    }

    /// Starts `bx ps serve --dim dim` with `extra` flags, dying with this process, and waits
    /// (at most 30 s) for its `LISTENING` line. Its memory comes in huge pages
    /// ([`SERVER_TUNABLES`]) unless this process has `GLIBC_TUNABLES` set (it is passed on).
    pub async fn start(dim: usize, extra: &[String]) -> Result<ServerChild, String> {
        let exe = std::env::current_exe().map_err(|e| format!("locating bx: {e}"))?;
        let mut cmd = Command::new(exe);
        if std::env::var_os("GLIBC_TUNABLES").is_none() {
            cmd.env("GLIBC_TUNABLES", SERVER_TUNABLES);
        }
        let mut child = cmd
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
            .args(extra)
            .env_remove("BX_TRANSPORT") // the server accepts both transports
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting bx ps serve: {e}"))?;
        let pid = child.id().ok_or("server exited at once")?;
        let stdout = child.stdout.take();
        // from here on, an early return kills the child
        let mut server = ServerChild {
            child: Some(child),
            addr: String::new(),
            pid: Some(pid),
            native: None,
            floor: None,
        };
        let mut lines = BufReader::new(stdout.ok_or("no server stdout")?).lines();
        let limit = tokio::time::Instant::now() + Duration::from_secs(30);
        // `NATIVE addr` and `FLOOR addr` come first when asked for, `LISTENING addr` last
        loop {
            let line = tokio::time::timeout_at(limit, lines.next_line())
                .await
                .map_err(|_| "server did not start within 30 s")?
                .map_err(|e| format!("reading server stdout: {e}"))?
                .ok_or("server exited before listening")?;
            if let Some(a) = line.strip_prefix("NATIVE ") {
                server.native = Some(a.to_string());
            } else if let Some(a) = line.strip_prefix("FLOOR ") {
                server.floor = Some(a.to_string());
            } else {
                server.addr = line
                    .strip_prefix("LISTENING ")
                    .ok_or_else(|| format!("unexpected server line {line:?}"))?
                    .to_string();
                return Ok(server);
            }
        }
    }

    /// How the child ended, waiting at most `limit`; `None` if it runs on (or is not ours).
    async fn exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        tokio::time::timeout(limit, child.wait()).await.ok()?.ok()
    }
}

/// The servers one row runs against: per shard, its replicas.
#[derive(Debug)]
pub struct Servers {
    /// `shards[s][r]`: replica r of shard s.
    pub shards: Vec<Vec<ServerChild>>,
    fleet: bool,
}

impl Servers {
    /// One server: the one at `--server`, or a child with its native and floor ports too.
    pub async fn single(args: &BenchArgs) -> Result<Servers, String> {
        let one = match &args.server {
            Some(addr) => ServerChild::elsewhere(addr.clone()),
            None => {
                let mut flags = args.serve_flags()?;
                flags.extend(
                    [
                        "--native-addr",
                        "127.0.0.1:0",
                        "--floor-addr",
                        "127.0.0.1:0",
                    ]
                    .map(String::from),
                );
                // every row of the workload made before any is measured
                flags.extend(["--prefill-keys".to_string(), args.keys.to_string()]);
                ServerChild::start(args.dim, &flags).await?
            }
        };
        Ok(Servers {
            shards: vec![vec![one]],
            fleet: false,
        })
    }

    /// One child speaking TLS with the identity `cert`/`key` (`bx ps serve --tls-cert
    /// --tls-key`), for the bench's +tls rows.
    pub async fn single_tls(
        args: &BenchArgs,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> Result<Servers, String> {
        let mut flags = args.serve_flags()?;
        flags.extend([
            "--tls-cert".to_string(),
            cert.display().to_string(),
            "--tls-key".to_string(),
            key.display().to_string(),
        ]);
        Ok(Servers {
            shards: vec![vec![ServerChild::start(args.dim, &flags).await?]],
            fleet: false,
        })
    }

    /// A fleet of `shards` × `replicas` children (the victim of `fault slow` with
    /// `--delay-ms`), started concurrently.
    pub async fn fleet(
        args: &BenchArgs,
        shards: u32,
        replicas: u32,
        fault: Option<Fault>,
    ) -> Result<Servers, String> {
        let flags = args.serve_flags()?;
        let starts = (0..shards).flat_map(|s| {
            let flags = &flags;
            (0..replicas).map(move |r| {
                let mut extra = flags.clone();
                extra.extend([
                    "--shard".to_string(),
                    s.to_string(),
                    "--shards".to_string(),
                    shards.to_string(),
                ]);
                if (s, r, fault) == (0, 0, Some(Fault::Slow)) {
                    extra.extend(["--delay-ms".to_string(), SLOW.as_millis().to_string()]);
                }
                async move { ServerChild::start(args.dim, &extra).await }
            })
        });
        // on an error, the children already started are dropped, hence killed
        let mut all = futures::future::try_join_all(starts).await?.into_iter();
        let shards = (0..shards)
            .map(|_| all.by_ref().take(replicas as usize).collect())
            .collect();
        Ok(Servers {
            shards,
            fleet: true,
        })
    }

    /// Whether this is a fleet (`--servers`).
    pub fn is_fleet(&self) -> bool {
        self.fleet
    }

    /// The pid of the one server of a single-server bench, when the bench started it.
    pub fn single_pid(&self) -> Option<u32> {
        if self.fleet { None } else { self.first().pid }
    }

    /// The one server of a single-server bench.
    pub fn first(&self) -> &ServerChild {
        &self.shards[0][0]
    }

    /// Every server as `shard s: pid P at ADDR, ...`, for the log.
    pub fn describe(&self) -> String {
        let shards: Vec<String> = self
            .shards
            .iter()
            .enumerate()
            .map(|(s, reps)| {
                let reps: Vec<String> = reps
                    .iter()
                    .map(|r| format!("pid {} at {}", r.pid.unwrap_or(0), r.addr))
                    .collect();
                format!("shard {s}: {}", reps.join(", "))
            })
            .collect();
        shards.join("; ")
    }

    /// CPU ticks of all children together, `killed` standing for a child killed by a fault
    /// (its ticks just before); `None` for a server started elsewhere. Errors: `/proc`.
    pub fn cpu_ticks(&self, killed: Option<(u32, u64)>) -> Result<Option<u64>, String> {
        let mut sum = 0;
        for s in self.shards.iter().flatten() {
            let Some(pid) = s.pid else { return Ok(None) };
            sum += match killed {
                Some((k, ticks)) if k == pid => ticks,
                _ => cpu::cpu_ticks(Some(pid)).map_err(|e| e.to_string())?,
            };
        }
        Ok(Some(sum))
    }

    /// Injects `fault` into replica 0 of shard 0 `at` from now; returns what it did (with the
    /// victim's CPU ticks before a kill). Errors: a signal could not be sent.
    pub async fn inject(&self, fault: Fault, at: Duration) -> Result<Injected, String> {
        let pid = self
            .first()
            .pid
            .ok_or("the fault's victim is not a child")?;
        let send = |sig: Signal| {
            eprintln!("bx ps bench: fault {}: {sig} to pid {pid}", fault.name());
            kill(Pid::from_raw(pid as i32), sig).map_err(|e| format!("{sig} to {pid}: {e}"))
        };
        tokio::time::sleep(at).await;
        let mut ticks = None;
        let what = match fault {
            Fault::Kill => {
                ticks = Some(cpu::cpu_ticks(Some(pid)).map_err(|e| e.to_string())?);
                send(Signal::SIGKILL)?;
                "got SIGKILL".to_string()
            }
            Fault::Stall => {
                send(Signal::SIGSTOP)?;
                tokio::time::sleep(STALL).await;
                send(Signal::SIGCONT)?;
                format!("got SIGSTOP, then SIGCONT {STALL:?} later")
            }
            Fault::Slow => {
                send(Signal::SIGUSR1)?;
                format!("got SIGUSR1: answers {SLOW:?} late from then on")
            }
        };
        Ok(Injected {
            fault,
            at,
            pid,
            ticks,
            what,
        })
    }

    /// The log line of an injected fault, with how the victim ended if it did (waiting for
    /// it at most 5 s after a kill).
    pub async fn report(&mut self, f: &Injected) -> String {
        let limit = match f.fault {
            Fault::Kill => Duration::from_secs(5),
            _ => Duration::ZERO,
        };
        let exit = match self.shards[0][0].exit(limit).await {
            Some(st) => format!("it exited: {st}"),
            None => "it is still running".to_string(),
        };
        format!(
            "fault {} at {:.2} s: replica 0 of shard 0 (pid {}) {}; {exit}",
            f.fault.name(),
            f.at.as_secs_f64(),
            f.pid,
            f.what
        )
    }
}

/// What [`Servers::inject`] did.
#[derive(Debug)]
pub struct Injected {
    fault: Fault,
    at: Duration,
    /// The victim.
    pub pid: u32,
    /// The victim's CPU ticks just before it was killed.
    pub ticks: Option<u64>,
    what: String,
}

impl Injected {
    /// The victim and its ticks just before a kill, for [`Servers::cpu_ticks`].
    pub fn killed(&self) -> Option<(u32, u64)> {
        self.ticks.map(|t| (self.pid, t))
    }
}
