//! Review finding: a fallen-back link whose re-probes fail for longer than the server's probe
//! nonce lives (30 s on the soft device) never takes RDMA back. The client only learns a fresh
//! nonce from a REPROBE_ACK, and it sends REPROBE only after a probe with the nonce it holds
//! succeeded: once that nonce expired (or was spent by a probe whose try then failed), every
//! later try fails at the probe, and the link stays `tcp(fallback)` for good.

use std::time::Duration;

use byteexpress_rpc::{Client, Config, Request, Transport, TransportPref};
use integration_tests::{ServerProc, rdma_here};

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");

/// Longer than the soft device's probe nonce TTL (`PROBE_TTL`, 30 s).
const OUTAGE: Duration = Duration::from_secs(32);

async fn echo(client: &Client) {
    let r = client
        .call(Request {
            method: "/test.Test/Echo".into(),
            body: bytes::Bytes::from_static(b"x"),
            timeout: Some(Duration::from_secs(20)),
            ..Default::default()
        })
        .await
        .expect("echo");
    assert_eq!(&r.body[..], b"x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_whose_path_was_down_longer_than_the_probe_nonce_lives_takes_rdma_back() {
    let server = ServerProc::start(SERVER, &["--grant", "8"]).await;
    let cfg = Config {
        transport: TransportPref::Rdma,
        reprobe_backoff: Duration::from_millis(50),
        reprobe_backoff_max: Duration::from_millis(400),
        ..Config::default()
    };
    let client = Client::connect(&server.addr, &cfg).await.expect("connect");
    assert_eq!(client.transport(), rdma_here());
    let faults = client.link_faults();
    // The path is down: every re-probe fails (as a soft-device probe that cannot connect).
    faults.block_reprobes(true);
    assert!(faults.inject_qp_error());
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while !matches!(client.transport(), Transport::TcpFallback { .. }) {
        assert!(tokio::time::Instant::now() < until, "no fallback");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let down = tokio::time::Instant::now();
    while down.elapsed() < OUTAGE {
        echo(&client).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(matches!(client.transport(), Transport::TcpFallback { .. }));
    // The path clears: within the backoff cap plus one re-probe's limit (generous margin),
    // the link must be back on RDMA.
    faults.block_reprobes(false);
    let cleared = tokio::time::Instant::now();
    let limit = cfg.reprobe_backoff_max + cfg.handshake_timeout + Duration::from_secs(10);
    while client.transport() != rdma_here() {
        assert!(
            cleared.elapsed() < limit,
            "not back on RDMA {:?} after the path cleared (outage {OUTAGE:?}): {} {:?}",
            cleared.elapsed(),
            client.transport(),
            client.link_stats()
        );
        echo(&client).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
