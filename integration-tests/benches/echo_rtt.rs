//! Round-trip latency of the echo call between two processes, over each transport.
//!
//! `cargo bench -p integration-tests --bench echo_rtt [-- --calls N]`: starts `bx-test-server`,
//! then for each transport and payload size runs N sequential calls (one in flight, after a
//! warm-up) on a current-thread runtime and prints p50/p99/p99.9 in µs (hdrhistogram).

use std::time::{Duration, Instant};

use byteexpress_rpc::{Client, Config, Request, TransportPref};
use bytes::Bytes;
use hdrhistogram::Histogram;
use integration_tests::ServerProc;

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
    println!(
        "{:<6} {:>8} {:>8} {:>9} {:>9} {:>10}",
        "path", "bytes", "calls", "p50 µs", "p99 µs", "p99.9 µs"
    );
    for (name, t) in [("rdma", TransportPref::Rdma), ("tcp", TransportPref::Tcp)] {
        let client = Client::connect(
            &server.addr,
            &Config {
                transport: t,
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
                "{:<6} {:>8} {:>8} {:>9.1} {:>9.1} {:>10.1}",
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
