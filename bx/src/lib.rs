//! `bx`, the ByteExpress command-line tool (clap). The commands are a library function, [`main`],
//! so that the `bx` binary and the integration tests' copy of it
//! (`integration-tests/src/bin/bx-facade.rs`) run the same code.
//!
//! - `bx devices`: the verbs devices this host offers (hardware and soft), their limits and GIDs;
//! - `bx pingpong [SERVER]`: SEND/RECV ping-pong on one RC QP, interoperating with rdma-core's
//!   `ibv_rc_pingpong` (see [`pingpong`]);
//! - `bx ps serve [--addr 127.0.0.1:0] [--dim 64]`: the parameter server (ByteExpress and
//!   HTTP/2 on one port), printing `LISTENING <addr>` first (with `--native-addr` and
//!   `--floor-addr`, the same store without tonic on two more ports, announced before it);
//! - `bx ps bench`: the parameter-server workload over each transport, side by side, against
//!   a server it starts (and stops with itself), one at `--server ADDR`, or a fleet of
//!   `--servers N` shards of `--replicas R` processes each, optionally with a `--fault`;
//!   `--config c64_512|c64_16k|c1_16k --rounds N` runs every row that measures a transport
//!   (`floor/tcp`, `native/*`, `bx/*`, `grpc/h2`, `tonic/inproc`) interleaved and prints
//!   per-row medians with ratios to `floor/tcp`.
//! - `bx sim incast`: the packet-level incast simulator (`byteexpress-sim`, issue 26): TCP,
//!   RDMA with DCQCN, and DCQCN under ByteExpress's windows and credits, every constant a flag
//!   (see [`sim`]).
//!
//! Every command logs through `tracing` to stderr, filtered by `RUST_LOG` (default `info`: one
//! line per link set up, with its peer, transport, device, and why a faster path was not
//! taken). `bx ps serve --metrics ADDR` and `bx ps bench --metrics ADDR` serve the `metrics`
//! events of `byteexpress_rpc::metrics` in Prometheus text format at `http://ADDR/metrics`.

pub mod devices;
pub mod pingpong;
pub mod ps;
pub mod sim;

use std::net::SocketAddr;
use std::process::ExitCode;

use crate::ps::bench::{self, BenchArgs};
use crate::ps::report as bx_report;
use crate::ps::rounds;
use crate::ps::serve::{self, ServeArgs};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "bx", about = "ByteExpress: gRPC over RDMA (or TCP)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// List RDMA devices (hardware, then the userspace soft device) with limits and GIDs.
    Devices,
    /// SEND/RECV ping-pong on one RC QP; the other side may be rdma-core's `ibv_rc_pingpong`.
    Pingpong(pingpong::PingpongArgs),
    /// Parameter-server workload.
    Ps {
        #[command(subcommand)]
        cmd: PsCmd,
    },
    /// Packet-level simulation (no network used).
    Sim {
        #[command(subcommand)]
        cmd: SimCmd,
    },
}

#[derive(Debug, Subcommand)]
enum SimCmd {
    /// Incast at a parameter server: the training trace over TCP, RDMA with DCQCN, and
    /// DCQCN with ByteExpress windows and credits (byteexpress-flow on simulated time).
    Incast(Box<sim::IncastArgs>),
}

#[derive(Debug, Subcommand)]
enum PsCmd {
    /// Serve the parameter server (and the echo test service).
    Serve {
        #[command(flatten)]
        args: Box<ServeArgs>,
        /// Runtime worker threads; 1 runs everything on one thread.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Serve metrics in Prometheus text format at http://ADDR/metrics.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<SocketAddr>,
    },
    /// Start a server process (or use --server, or a sharded, replicated fleet with --servers)
    /// and measure Pull/Push over rdma, tcp and HTTP/2.
    Bench(Box<BenchArgs>),
}

/// `e` and its causes (`Error::source`), `": "`-joined: one line for the user.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
}

/// Installs the log subscriber: `RUST_LOG` (default `info`), to stderr, so stdout keeps only
/// what a command prints for scripts (`LISTENING`, tables).
fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Installs the Prometheus exporter (`metrics-exporter-prometheus`) as the process's `metrics`
/// recorder, serving `http://addr/metrics` from a thread of its own, so scrapes are answered
/// however busy the command's runtime is.
fn install_metrics(addr: SocketAddr) -> Result<(), String> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| format!("--metrics {addr}: {e}"))?;
    tracing::info!("metrics at http://{addr}/metrics");
    Ok(())
}

/// Parses the process arguments and runs the command; the exit code tells success.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs();
    match cli.cmd {
        Cmd::Devices => devices::main(),
        Cmd::Sim {
            cmd: SimCmd::Incast(args),
        } => sim::main(&args),
        Cmd::Pingpong(args) => pingpong::main(&args),
        Cmd::Ps {
            cmd:
                PsCmd::Serve {
                    args,
                    threads,
                    metrics,
                },
        } => {
            if let Err(e) = serve::die_with_parent(&args) {
                eprintln!("bx ps serve: {e}");
                return ExitCode::FAILURE;
            }
            if let Some(addr) = metrics
                && let Err(e) = install_metrics(addr)
            {
                eprintln!("bx ps serve: {e}");
                return ExitCode::FAILURE;
            }
            match runtime(threads).and_then(|rt| rt.block_on(serve::run(*args))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("bx ps serve: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Ps {
            cmd: PsCmd::Bench(args),
        } => {
            if let Some(addr) = args.metrics
                && let Err(e) = install_metrics(addr)
            {
                eprintln!("bx ps bench: {e}");
                return ExitCode::FAILURE;
            }
            let args = args.resolved();
            let outcome = runtime(1)
                .map_err(|e| bench::BenchError::Failed(e.to_string()))
                .and_then(|rt| rt.block_on(bench::run_until_signal(&args)));
            let rows = match outcome {
                Ok(rows) => rows,
                Err(bench::BenchError::Signal(name, code)) => {
                    eprintln!("bx ps bench: stopped by {name}; its servers were stopped too");
                    return ExitCode::from(code);
                }
                Err(bench::BenchError::Failed(e)) => {
                    eprintln!("bx ps bench: {e}");
                    return ExitCode::FAILURE;
                }
            };
            print!("{}", bx_report::table(&rows));
            if args.rounds > 1 {
                println!();
                print!("{}", rounds::table(&rounds::medians(&rows)));
            }
            if let Some(path) = &args.json
                && let Err(e) = std::fs::write(path, bx_report::json(&args, &rows))
            {
                eprintln!("bx ps bench: writing {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            if let Some(path) = &args.plot
                && let Err(e) = bx_report::plot(&rows, path)
            {
                eprintln!("bx ps bench: plotting {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            if rows.is_empty() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}
