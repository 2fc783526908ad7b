//! How long a link takes to fall back to TCP when its QP fails, and to take RDMA back once the
//! path is repaired (DESIGN.md 3.5, "Link life").
//!
//! `cargo bench -p integration-tests --bench fallback_time [-- --rounds N] [--backoff-ms B]`:
//! starts `bx-test-server`, opens one RDMA link (the first device `byteexpress_verbs::devices()`
//! lists: `soft0` on a host without RDMA) whose re-probes start `B` ms after a failure (default
//! 10, capped at the same), and for each of N rounds (default 20):
//! 1. blocks re-probes (the path stays down), fails the QP (`LinkFaults::inject_qp_error`) and
//!    at once makes a small call: the time from the fault to that call's answer, which the
//!    server handled over `tcp(fallback)`;
//! 2. unblocks re-probes (the repair) and makes small calls one after another until one is
//!    handled over RDMA: the time from the repair to that call's answer (it includes the
//!    backoff `B`).
//!
//! Prints the median, 90th percentile and maximum of each, and the target (reported, not
//! asserted): median fault → first call over TCP < 50 ms on the soft provider.

use std::time::{Duration, Instant};

use byteexpress_rpc::{Client, Config, Metadata, Request, TransportPref};
use bytes::Bytes;
use integration_tests::{ServerProc, rdma_here};

fn echo() -> Request {
    Request {
        method: "/test.Test/Echo".into(),
        metadata: Metadata::new(),
        body: Bytes::from_static(&[7; 64]),
        timeout: Some(Duration::from_secs(20)),
    }
}

/// The transport the server handled the call over (`x-transport`).
async fn served_over(client: &Client) -> String {
    let r = client.call(echo()).await.expect("echo");
    String::from_utf8_lossy(r.metadata.get("x-transport").expect("x-transport")).into_owned()
}

fn stats(label: &str, mut v: Vec<Duration>) {
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    println!(
        "{label:<34} median {:>9.2} ms   p90 {:>9.2} ms   max {:>9.2} ms   (n = {})",
        at(0.5).as_secs_f64() * 1e3,
        at(0.9).as_secs_f64() * 1e3,
        v[v.len() - 1].as_secs_f64() * 1e3,
        v.len()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let mut rounds = 20usize;
    let mut backoff_ms = 10u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--rounds N")
            }
            "--backoff-ms" => {
                backoff_ms = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--backoff-ms B")
            }
            // cargo bench passes --bench
            _ => {}
        }
    }
    let server = ServerProc::start(env!("CARGO_BIN_EXE_bx-test-server"), &[]).await;
    let cfg = Config {
        transport: TransportPref::Rdma,
        reprobe_backoff: Duration::from_millis(backoff_ms),
        reprobe_backoff_max: Duration::from_millis(backoff_ms),
        ..Config::default()
    };
    let client = Client::connect(&server.addr, &cfg).await.expect("connect");
    let rdma = rdma_here().to_string();
    assert_eq!(client.transport().to_string(), rdma);
    // warm-up
    for _ in 0..100 {
        served_over(&client).await;
    }
    let (mut to_tcp, mut to_rdma) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let faults = client.link_faults();
        faults.block_reprobes(true);
        let t0 = Instant::now();
        assert!(faults.inject_qp_error(), "round {round}: the link has a QP");
        let over = served_over(&client).await;
        to_tcp.push(t0.elapsed());
        assert_eq!(over, "tcp(fallback)", "round {round}");
        let t1 = Instant::now();
        faults.block_reprobes(false);
        loop {
            if served_over(&client).await == rdma {
                break;
            }
            assert!(
                t1.elapsed() < Duration::from_secs(30),
                "round {round}: no re-probe"
            );
        }
        to_rdma.push(t1.elapsed());
    }
    println!(
        "fallback_time: {rounds} rounds on {rdma}, re-probe backoff {backoff_ms} ms (first and cap)"
    );
    stats("QP fault -> first call over TCP", to_tcp.clone());
    stats("repair -> first call over RDMA", to_rdma);
    to_tcp.sort();
    let median = to_tcp[to_tcp.len() / 2];
    println!(
        "target: fall back in < 50 ms (median): {}",
        if median < Duration::from_millis(50) {
            "met"
        } else {
            "MISSED"
        }
    );
}
