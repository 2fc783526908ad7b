//! Round-trip latency of the echo call between two processes, over each transport.
//!
//! `cargo bench -p integration-tests --bench echo_rtt [-- --calls N]`: starts `bx-test-server`,
//! then for each transport and payload size runs N sequential calls (one in flight, after a
//! warm-up) on a current-thread runtime and prints p50/p99/p99.9 in µs (hdrhistogram).
//! Paths: `rdma` (the soft provider; engines sleep on the CQ's completion channel when idle),
//! `rdma+poll` (both ends poll for [`BUSY_POLL`] before sleeping: `Config::busy_poll`), `tcp`.

use std::time::{Duration, Instant};

use byteexpress_rpc::{Client, Config, Request, TransportPref};
use bytes::Bytes;
use hdrhistogram::Histogram;
use integration_tests::ServerProc;

/// Polling budget of the `rdma+poll` path, both ends.
const BUSY_POLL: Duration = Duration::from_micros(50);

fn main() {
    let mut calls = 20_000u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--calls" {
            calls = args.next().and_then(|v| v.parse().ok()).unwrap_or(calls);
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(calls));
}

async fn run(calls: u64) {
    let server_bin = env!("CARGO_BIN_EXE_bx-test-server");
    let server = ServerProc::start(server_bin, &[]).await;
    let poll_us = BUSY_POLL.as_micros().to_string();
    let polling = ServerProc::start(server_bin, &["--busy-poll-us", poll_us.as_str()]).await;
    println!(
        "{:<9} {:>8} {:>8} {:>9} {:>9} {:>10}",
        "path", "bytes", "calls", "p50 µs", "p99 µs", "p99.9 µs"
    );
    for (name, t, server, busy_poll) in [
        ("rdma", TransportPref::Rdma, &server, Duration::ZERO),
        ("rdma+poll", TransportPref::Rdma, &polling, BUSY_POLL),
        ("tcp", TransportPref::Tcp, &server, Duration::ZERO),
    ] {
        let client = Client::connect(
            &server.addr,
            &Config {
                transport: t,
                busy_poll,
                ..Config::default()
            },
        )
        .await
        .expect("connect");
        for size in [8usize, 4096, 16384] {
            let req = Request {
                method: "/test.Test/Echo".into(),
                body: Bytes::from(vec![1u8; size]),
                timeout: Some(Duration::from_secs(5)),
                ..Default::default()
            };
            for _ in 0..calls / 10 {
                client.call(req.clone()).await.expect("warm-up call");
            }
            let mut h = Histogram::<u64>::new(3).expect("histogram");
            for _ in 0..calls {
                let t0 = Instant::now();
                let r = client.call(req.clone()).await.expect("call");
                h.record(t0.elapsed().as_nanos() as u64).expect("record");
                assert_eq!(r.body.len(), size);
            }
            let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            println!(
                "{:<9} {:>8} {:>8} {:>9.1} {:>9.1} {:>10.1}",
                name,
                size,
                calls,
                us(0.5),
                us(0.99),
                us(0.999)
            );
        }
    }
}
