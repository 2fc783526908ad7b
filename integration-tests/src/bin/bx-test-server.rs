//! The test server of the integration tests:
//! `bx-test-server [--grant N] [--transport auto|rdma|tcp] [--sched fair|fifo] [--busy-poll-us N]
//! [--detect-timeout-ms N] [--memory-budget-mib N] [--max-concurrent-calls N]
//! [--keepalive-interval-ms N] [--keepalive-timeout-ms N] [--idle-timeout-ms N]
//! [--max-connections N] [--max-connections-per-addr N] [--addr HOST:PORT]`.
//! Listens on 127.0.0.1 (ephemeral port) and prints `LISTENING <addr>`.

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
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
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
            "--addr" => addr = v,
            other => panic!("unknown flag {other}"),
        }
    }
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("LISTENING {}", listener.local_addr()?);
    Server::new(integration_tests::test_service, cfg)
        .serve(listener)
        .await
}
