//! Adaptive hybrid polling (`Config::poll_wake_cost`, the default with `busy_poll` 0): an RDMA
//! engine polls after its work only while work comes back sooner than a wake-up costs, and a
//! link without traffic stops polling and sleeps, costing no CPU (issue 25 item 4). The
//! counters `LinkStats::idle_polls` (rounds polled without work) and `engine_sleeps` show what
//! the engine chose.

use std::time::Duration;

use byteexpress_rpc::{Client, Config, LinkStats, Request, TransportPref};
use bytes::Bytes;
use integration_tests::{ServerProc, rdma_here};

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");

async fn client_with_wake_cost(server: &ServerProc, wake_cost: Duration) -> Client {
    let cfg = Config {
        transport: TransportPref::Rdma,
        poll_wake_cost: wake_cost,
        ..Config::default()
    };
    let client = Client::connect(&server.addr, &cfg).await.expect("connect");
    assert_eq!(client.transport(), rdma_here());
    client
}

/// `n` echo calls one after the other.
async fn echo_calls(client: &Client, n: usize) {
    for i in 0..n {
        let r = client
            .call(Request {
                method: "/test.Test/Echo".into(),
                body: Bytes::from_static(b"ping"),
                timeout: Some(Duration::from_secs(5)),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("echo call {i}: {s:?}"));
        assert_eq!(&r.body[..], b"ping");
    }
}

/// The link's counters once they have stopped moving: polled until two snapshots `quiet` apart
/// agree on the polling counters (at most 5 s).
async fn settled(client: &Client, quiet: Duration) -> LinkStats {
    let start = std::time::Instant::now();
    let mut last = client.link_stats();
    loop {
        tokio::time::sleep(quiet).await;
        let now = client.link_stats();
        if now.idle_polls == last.idle_polls {
            return now;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the engine was still polling 5 s after its last call: {} idle polls",
            now.idle_polls
        );
        last = now;
    }
}

#[tokio::test]
async fn an_engine_polls_while_work_comes_sooner_than_a_wake_up_costs() {
    let server = ServerProc::start(SERVER, &["--transport", "rdma"]).await;
    // A wake-up said to cost 20 ms: every gap between these calls is shorter, so the engine
    // polls between them instead of sleeping.
    let client = client_with_wake_cost(&server, Duration::from_millis(20)).await;
    echo_calls(&client, 200).await;
    let busy = client.link_stats();
    assert!(
        busy.idle_polls > 0,
        "no polling although every gap was shorter than the wake-up cost: {busy:?}"
    );
    // The traffic stops: after its budget (2 × 20 ms) the engine sleeps and polls no more.
    let idle = settled(&client, Duration::from_millis(150)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(client.link_stats().idle_polls, idle.idle_polls);
}

#[tokio::test]
async fn an_engine_sleeps_when_work_comes_further_apart_than_a_wake_up_costs() {
    let server = ServerProc::start(SERVER, &["--transport", "rdma"]).await;
    // A wake-up said to cost 1 ns: no gap between calls is that short, so the engine sleeps
    // after every round of work and never polls.
    let client = client_with_wake_cost(&server, Duration::from_nanos(1)).await;
    echo_calls(&client, 200).await;
    let s = client.link_stats();
    assert_eq!(s.idle_polls, 0, "polled although no gap was short: {s:?}");
    assert!(s.engine_sleeps >= 200, "fewer sleeps than calls: {s:?}");
}

/// Whether the engine polled during the burst depends on this machine's gaps, so this pins only
/// the other half: whatever it did, once the traffic stops it stops polling (a policy that
/// polled for ever would fail here; one that never polls passes, and the tests above pin that
/// it does poll).
#[tokio::test]
async fn a_link_without_traffic_stops_polling_with_the_default_settings() {
    let server = ServerProc::start(SERVER, &["--transport", "rdma"]).await;
    let client = client_with_wake_cost(&server, Config::default().poll_wake_cost).await;
    // Back-to-back calls in flight together, then nothing.
    let calls: Vec<_> = (0..8).map(|_| echo_calls(&client, 50)).collect();
    futures::future::join_all(calls).await;
    let idle = settled(&client, Duration::from_millis(50)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = client.link_stats();
    assert_eq!(
        later.idle_polls, idle.idle_polls,
        "an idle link kept polling: {idle:?} then {later:?}"
    );
}
