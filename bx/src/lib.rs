//! `bx`, the ByteExpress command-line tool (clap). The commands are a library function, [`main`],
//! so that the `bx` binary and the integration tests' copy of it
//! (`integration-tests/src/bin/bx-facade.rs`) run the same code.
//!
//! - `bx devices`: the verbs devices this host offers (hardware and soft), their limits and GIDs;
//! - `bx pingpong [SERVER]`: SEND/RECV ping-pong on one RC QP, interoperating with rdma-core's
//!   `ibv_rc_pingpong` (see [`pingpong`]);
//! - `bx ps serve [--addr 127.0.0.1:0] [--dim 64]`: the parameter server (ByteExpress and
//!   HTTP/2 on one port), printing `LISTENING <addr>` first;
//! - `bx ps bench`: the parameter-server workload over each transport, side by side.

pub mod devices;
pub mod pingpong;
pub mod ps;

use std::process::ExitCode;

use crate::ps::bench::{self, BenchArgs};
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
}

#[derive(Debug, Subcommand)]
enum PsCmd {
    /// Serve the parameter server (and the echo test service).
    Serve {
        #[command(flatten)]
        args: ServeArgs,
        /// Runtime worker threads; 1 runs everything on one thread.
        #[arg(long, default_value_t = 1)]
        threads: usize,
    },
    /// Start a server process and measure Pull/Push over rdma, tcp and HTTP/2.
    Bench(BenchArgs),
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

/// Parses the process arguments and runs the command; the exit code tells success.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Devices => devices::main(),
        Cmd::Pingpong(args) => pingpong::main(&args),
        Cmd::Ps {
            cmd: PsCmd::Serve { args, threads },
        } => match runtime(threads).and_then(|rt| rt.block_on(serve::run(args))) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bx ps serve: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Ps {
            cmd: PsCmd::Bench(args),
        } => {
            let rows = runtime(1)
                .map_err(|e| e.to_string())
                .and_then(|rt| rt.block_on(bench::run(&args)));
            match rows {
                Ok(rows) => {
                    print!("{}", bench::table(&rows));
                    if let Some(path) = &args.json
                        && let Err(e) = std::fs::write(path, bench::json(&rows))
                    {
                        eprintln!("bx ps bench: writing {}: {e}", path.display());
                        return ExitCode::FAILURE;
                    }
                    if rows.is_empty() {
                        ExitCode::FAILURE
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                Err(e) => {
                    eprintln!("bx ps bench: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
