//! `bx ps serve`: the parameter server (and the echo test service) on one port, ByteExpress
//! and HTTP/2 side by side. Prints `LISTENING <addr>` on stdout once it accepts.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use byteexpress::Server;
use byteexpress_ps::echo::EchoService;
use byteexpress_ps::{PsService, Store};

/// Settings of `bx ps serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub addr: SocketAddr,
    /// Values (f32) per key.
    #[arg(long, default_value_t = 64)]
    pub dim: usize,
    /// Table names, comma-separated; other tables are INVALID_ARGUMENT.
    #[arg(long, default_value = "emb", value_delimiter = ',')]
    pub tables: Vec<String>,
    /// Lock shards per table.
    #[arg(long, default_value_t = 64)]
    pub shards: usize,
    /// Time a connection has to send its protocol preface, in ms (`Config::detect_timeout`;
    /// default: the library's).
    #[arg(long)]
    pub detect_timeout_ms: Option<u64>,
    /// Exit when the process with this pid (the parent that started this server) dies, even
    /// by SIGKILL (`PR_SET_PDEATHSIG`); `bx ps bench` passes its own pid.
    #[arg(long, value_name = "PID", hide = true)]
    pub parent_pid: Option<u32>,
}

/// With `--parent-pid`, asks the kernel for SIGKILL when the parent dies (`prctl(2)`
/// `PR_SET_PDEATHSIG`), then checks the parent is still the one named: if it died before the
/// request, this process was already handed to another parent and exits at once. Errors: the
/// prctl failed, or the parent is gone.
pub fn die_with_parent(args: &ServeArgs) -> Result<(), String> {
    let Some(parent) = args.parent_pid else {
        return Ok(());
    };
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG): {e}"))?;
    let now = std::os::unix::process::parent_id();
    if now != parent {
        return Err(format!(
            "the parent {parent} that started this server is gone (parent now {now})"
        ));
    }
    Ok(())
}

/// Runs the server until the process is stopped. The `LISTENING` line is flushed before the
/// first accept, so a parent can connect as soon as it reads it.
pub async fn run(args: ServeArgs) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    let store = Arc::new(Store::new(args.dim, &args.tables, args.shards));
    let mut cfg = byteexpress::Config::default();
    if let Some(ms) = args.detect_timeout_ms {
        cfg.detect_timeout = std::time::Duration::from_millis(ms);
    }
    let server = Server::builder()
        .config(cfg)
        .add_service(PsService::new(store).server())
        .add_service(EchoService::default().server());
    let mut out = std::io::stdout().lock();
    writeln!(out, "LISTENING {}", listener.local_addr()?)?;
    out.flush()?;
    drop(out);
    server.serve_with_listener(listener).await
}
