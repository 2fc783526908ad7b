//! `bx ps serve`: the parameter server (and the echo test service) on one port, ByteExpress
//! and HTTP/2 side by side. Prints `LISTENING <addr>` on stdout once it accepts. With
//! `--native-addr` and `--floor-addr` it serves the same store on two more ports, without
//! tonic: `byteexpress-rpc`'s native API and the plain-TCP floor of `bx ps bench`
//! ([`super::floor`]); their `NATIVE <addr>` and `FLOOR <addr>` lines come before `LISTENING`.
//!
//! In a fleet, `--shard I --shards N` serves shard I of a table split over N shards
//! ([`byteexpress_ps::shard`]); a call naming a key of another shard fails
//! FAILED_PRECONDITION. Replicas of a shard are processes started with the same flags: their
//! rows start equal (deterministic init); Pushes are not copied between them.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use byteexpress::Server;
use byteexpress_ps::echo::EchoService;
use byteexpress_ps::{Lateness, PsService, ShardSpec, Store};

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
    /// Lock shards per table (within this process).
    #[arg(long, default_value_t = 64)]
    pub lock_shards: usize,
    /// Rows created before serving, keys `0..N` of every table with their deterministic init
    /// (`Store::prefill`; N × dim × 4 bytes per table), so no measured call pays for a first
    /// touch. `bx ps bench` passes its `--keys` to the server it starts.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub prefill_keys: u64,
    /// The shard of the table this server serves, in 0..--shards.
    #[arg(long, default_value_t = 0)]
    pub shard: u32,
    /// Shards the table is split over (keys by `byteexpress_ps::shard_of`); a call naming a
    /// key of another shard fails FAILED_PRECONDITION.
    #[arg(long, default_value_t = 1)]
    pub shards: u32,
    /// Answer every Pull and Push this many ms late once the process gets SIGUSR1 (`bx ps
    /// bench --fault slow` sends it to its victim at the fault time); without it SIGUSR1 is
    /// not handled.
    #[arg(long, value_name = "MS", hide = true)]
    pub delay_ms: Option<u64>,
    /// Hybrid polling of RDMA links, a fixed budget in µs (`Config::busy_poll`; default: the
    /// library's, 0 = adaptive).
    #[arg(long, value_name = "US")]
    pub busy_poll_us: Option<u64>,
    /// Adaptive polling of RDMA links: the wake-up cost in µs (`Config::poll_wake_cost`; 0 =
    /// always sleep at once; default: the library's, 8 µs).
    #[arg(long, value_name = "US")]
    pub poll_wake_us: Option<u64>,
    /// Time a connection has to send its protocol preface, in ms (`Config::detect_timeout`;
    /// default: the library's).
    #[arg(long)]
    pub detect_timeout_ms: Option<u64>,
    /// Largest message accepted and sent, bytes with an optional KiB/MiB/GiB suffix, at most
    /// 4 GiB − 1 (`Config::max_message`, and the Pull/Push services' decoding limit on both
    /// transports and HTTP/2); `bx ps bench --push-bytes` starts its server with one that fits
    /// its largest push. Default: the library's (16 MiB; tonic's 4 MiB for decoding).
    #[arg(long, value_name = "BYTES", value_parser = super::size::parse_size)]
    pub max_message: Option<u64>,
    /// Bytes that messages in transit may hold across all links, with an optional
    /// KiB/MiB/GiB suffix (`Config::memory_budget`; default: the library's, 256 MiB); a
    /// message beyond it fails its call RESOURCE_EXHAUSTED. `bx ps bench --push-bytes` passes
    /// one that holds a push per call it keeps in flight.
    #[arg(long, value_name = "BYTES", value_parser = super::size::parse_size)]
    pub memory_budget: Option<u64>,
    /// Exit when the process with this pid (the parent that started this server) dies, even
    /// by SIGKILL (`PR_SET_PDEATHSIG`); `bx ps bench` passes its own pid.
    #[arg(long, value_name = "PID", hide = true)]
    pub parent_pid: Option<u32>,
    /// Speak TLS on the port with this certificate chain (PEM file; with --tls-key): HTTP/2
    /// clients with TLS credentials (ALPN h2) and ByteExpress clients with TLS (`https://`,
    /// ALPN bxrpc/1); plain clients are refused. The files are read again when they change,
    /// for new connections.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Also serve the parameter server on `byteexpress-rpc`'s native API (no tonic, no
    /// HTTP/2; protobuf bodies, [`byteexpress_ps::native`]) at this address, on the same
    /// store; prints `NATIVE <addr>` before `LISTENING`. `bx ps bench`'s native rows use it.
    #[arg(long, value_name = "ADDR")]
    pub native_addr: Option<SocketAddr>,
    /// Also serve the floor/tcp protocol (`bx ps bench`'s plain-TCP floor) at this address,
    /// on the same store; prints `FLOOR <addr>` before `LISTENING`.
    #[arg(long, value_name = "ADDR")]
    pub floor_addr: Option<SocketAddr>,
    /// The private key (PEM file) of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// With --tls-cert: require client certificates signed by this CA (PEM file; mutual TLS).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
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
    let shard = ShardSpec::new(args.shard, args.shards)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let store = Arc::new(Store::new(args.dim, &args.tables, args.lock_shards));
    store.prefill(args.prefill_keys);
    let mut ps = PsService::new(store.clone());
    if args.shards > 1 {
        ps = ps.serving(shard);
    }
    if let Some(ms) = args.delay_ms {
        ps = ps.late(late_from_sigusr1(Duration::from_millis(ms))?);
    }
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    let mut cfg = byteexpress::Config::default();
    if let Some(us) = args.busy_poll_us {
        cfg.busy_poll = Duration::from_micros(us);
    }
    if let Some(us) = args.poll_wake_us {
        cfg.poll_wake_cost = Duration::from_micros(us);
    }
    if let Some(ms) = args.detect_timeout_ms {
        cfg.detect_timeout = std::time::Duration::from_millis(ms);
    }
    if let Some(b) = args.memory_budget {
        cfg.memory_budget = usize::try_from(b).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("--memory-budget {b} bytes does not fit this machine's usize"),
            )
        })?;
    }
    let mut ps = ps.server();
    if let Some(max) = args.max_message {
        if max > super::size::WIRE_LIMIT {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "--max-message {max} bytes is above the wire limit of {} bytes (4 GiB - 1)",
                    super::size::WIRE_LIMIT
                ),
            ));
        }
        cfg.max_message = max as usize;
        ps = ps
            .max_decoding_message_size(max as usize)
            .max_encoding_message_size(max as usize);
    }
    let mut server = Server::builder().config(cfg.clone());
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let mut tls = byteexpress::ServerTlsConfig::new()
            .identity(byteexpress::Identity::from_pem_files(cert, key));
        if let Some(ca) = &args.tls_ca {
            tls = tls.client_ca_root(byteexpress::Certificate::from_pem_file(ca));
        }
        server = server.tls_config(tls).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("--tls-cert/--tls-key/--tls-ca: {}", crate::error_chain(&e)),
            )
        })?;
    }
    let server = server
        .add_service(ps)
        .add_service(EchoService::default().server());
    let mut out = std::io::stdout().lock();
    if let Some(addr) = args.native_addr {
        let l = tokio::net::TcpListener::bind(addr).await?;
        writeln!(out, "NATIVE {}", l.local_addr()?)?;
        let native = byteexpress_rpc::Server::new(
            byteexpress_ps::native::native_service(store.clone()),
            cfg.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) = native.serve(l).await {
                tracing::error!("native port: {e}");
            }
        });
    }
    if let Some(addr) = args.floor_addr {
        let l = tokio::net::TcpListener::bind(addr).await?;
        writeln!(out, "FLOOR {}", l.local_addr()?)?;
        let store = store.clone();
        tokio::spawn(async move {
            if let Err(e) = super::floor::serve(l, store).await {
                tracing::error!("floor port: {e}");
            }
        });
    }
    writeln!(out, "LISTENING {}", listener.local_addr()?)?;
    out.flush()?;
    drop(out);
    server.serve_with_listener(listener).await
}

/// A [`Lateness`] set to `delay` when the process gets SIGUSR1 (the handler is in place when
/// this returns). Errors: the handler could not be installed.
fn late_from_sigusr1(delay: Duration) -> std::io::Result<Arc<Lateness>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let late = Arc::new(Lateness::default());
    let set = late.clone();
    tokio::spawn(async move {
        while usr1.recv().await.is_some() {
            tracing::info!(?delay, "SIGUSR1: answering late from now on");
            set.set(delay);
        }
    });
    Ok(late)
}
