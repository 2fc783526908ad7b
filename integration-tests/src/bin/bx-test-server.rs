//! The test server of the integration tests:
//! `bx-test-server [--grant N] [--transport auto|rdma|tcp] [--sched fair|fifo] [--busy-poll-us N]
//! [--detect-timeout-ms N] [--memory-budget-mib N] [--max-concurrent-calls N]
//! [--keepalive-interval-ms N] [--keepalive-timeout-ms N] [--idle-timeout-ms N]
//! [--max-connections N] [--max-connections-per-addr N] [--addr HOST:PORT]
//! [--delay-ms N] [--fail-all CODE] [--hang] [--id NAME]`.
//! Listens on 127.0.0.1 (ephemeral port) and prints `LISTENING <addr>`.
//! - `--delay-ms N`: every call is answered N ms later than the test service would (a slow
//!   replica);
//! - `--fail-all CODE`: every call fails with gRPC status CODE (a broken replica);
//! - `--id NAME`: every answer carries metadata `x-server: NAME` (which replica answered);
//! - `--hang`: accepts TCP connections and never reads or answers (an accept-and-hang port).

use std::time::Duration;

use byteexpress_rpc::{Config, SchedMode, Server, parse_transport};

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mut cfg = Config::default();
    let mut addr = "127.0.0.1:0".to_string();
    let mut delay = Duration::ZERO;
    let mut fail_all: Option<u16> = None;
    let mut hang = false;
    let mut id: Option<String> = None;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let a = argv[i].clone();
        if a == "--hang" {
            hang = true;
            i += 1;
            continue;
        }
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        i += 2;
        match a.as_str() {
            "--grant" => cfg.grant = v.parse().expect("--grant N"),
            "--transport" => {
                cfg.transport = parse_transport(&v).expect("--transport auto|rdma|tcp")
            }
            "--sched" => {
                cfg.sched = match v.as_str() {
                    "fair" => SchedMode::Fair,
                    "fifo" => SchedMode::Fifo,
                    _ => panic!("--sched fair|fifo"),
                }
            }
            "--busy-poll-us" => {
                cfg.busy_poll = Duration::from_micros(v.parse().expect("--busy-poll-us N"))
            }
            "--detect-timeout-ms" => {
                cfg.detect_timeout =
                    Duration::from_millis(v.parse().expect("--detect-timeout-ms N"))
            }
            "--memory-budget-mib" => {
                cfg.memory_budget = v.parse::<usize>().expect("--memory-budget-mib N") << 20
            }
            "--max-concurrent-calls" => {
                cfg.max_concurrent_calls = v.parse().expect("--max-concurrent-calls N")
            }
            "--keepalive-interval-ms" => {
                cfg.keepalive_interval = Duration::from_millis(v.parse().expect("ms"))
            }
            "--keepalive-timeout-ms" => {
                cfg.keepalive_timeout = Duration::from_millis(v.parse().expect("ms"))
            }
            "--idle-timeout-ms" => cfg.idle_timeout = Duration::from_millis(v.parse().expect("ms")),
            "--max-connections" => cfg.max_connections = v.parse().expect("N"),
            "--max-connections-per-addr" => cfg.max_connections_per_addr = v.parse().expect("N"),
            "--max-message-mib" => {
                cfg.max_message = v.parse::<usize>().expect("--max-message-mib N") << 20
            }
            "--window-bytes" => cfg.window_bytes = v.parse().expect("--window-bytes N"),
            "--rendezvous-cache-mib" => {
                cfg.rendezvous_cache_bytes =
                    v.parse::<u64>().expect("--rendezvous-cache-mib N") << 20
            }
            "--rendezvous-threshold" => {
                cfg.rendezvous_threshold = v.parse().expect("--rendezvous-threshold BYTES")
            }
            "--addr" => addr = v,
            "--id" => id = Some(v),
            "--delay-ms" => delay = Duration::from_millis(v.parse().expect("--delay-ms N")),
            "--fail-all" => fail_all = Some(v.parse().expect("--fail-all CODE")),
            other => panic!("unknown flag {other}"),
        }
    }
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("LISTENING {}", listener.local_addr()?);
    if hang {
        // hold every connection open, unread, for the life of the process
        let mut held = Vec::new();
        loop {
            let (s, _) = listener.accept().await?;
            held.push(s);
        }
    }
    let service = move |req: byteexpress_rpc::ServerRequest| {
        let id = id.clone();
        async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if let Some(code) = fail_all {
                return Err(byteexpress_rpc::Status::new(
                    byteexpress_rpc::Code::from_u16(code),
                    "--fail-all",
                ));
            }
            let mut resp = integration_tests::test_service(req).await?;
            if let Some(id) = id {
                resp.metadata.insert("x-server", id).expect("valid key");
            }
            Ok(resp)
        }
    };
    Server::new(service, cfg).serve(listener).await
}
