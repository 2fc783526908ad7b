//! `Config::window_target_delay`: an RDMA link's QP window adapts to the RTT of its SEND
//! completions. On the soft provider a completion is polled at the engine's next round, after
//! the 64 KiB copy of the chunk posted in between, so RTTs are several µs: a 1 µs target is
//! always exceeded, a 10 s target never.

use std::time::Duration;

use byteexpress_rpc::{Client, Config, Request, TransportPref};
use bytes::Bytes;
use integration_tests::{ServerProc, rdma_here};

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
/// The window's upper bound (bytes): four default chunks.
const WINDOW: u64 = 256 << 10;

/// 16 calls of 1 MiB each way, every answer checked.
async fn push_16_mib(client: &Client) {
    let body = Bytes::from(vec![7u8; 1 << 20]);
    for i in 0..16 {
        let r = client
            .call(Request {
                method: "/test.Test/Echo".into(),
                body: body.clone(),
                timeout: Some(Duration::from_secs(10)),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("push {i}: {s:?}"));
        assert_eq!(r.body, body);
    }
}

/// The client's window cap after pushing 16 × 1 MiB (each echoed) with `target`.
async fn cap_after_pushes(target: Duration) -> u64 {
    // Chunks (rendezvous off at both ends): the window measured on SENDs.
    let server = ServerProc::start(
        SERVER,
        &["--transport", "rdma", "--rendezvous-threshold", "0"],
    )
    .await;
    let cfg = Config {
        transport: TransportPref::Rdma,
        window_bytes: WINDOW,
        window_target_delay: target,
        rendezvous_threshold: 0,
        ..Config::default()
    };
    let client = Client::connect(&server.addr, &cfg).await.expect("connect");
    assert_eq!(client.transport(), rdma_here());
    assert_eq!(
        client.link_stats().window_cap,
        WINDOW,
        "starts at the bound"
    );
    push_16_mib(&client).await;
    let stats = client.link_stats();
    assert!(stats.messages_chunked >= 16, "{stats:?}");
    stats.window_cap
}

#[tokio::test]
async fn completions_above_the_target_delay_shrink_the_window() {
    let cap = cap_after_pushes(Duration::from_micros(1)).await;
    assert!(cap < WINDOW, "cap {cap}");
    assert!(cap >= 64 << 10, "never below one chunk: {cap}");
}

#[tokio::test]
async fn completions_below_the_target_delay_keep_the_window_at_its_bound() {
    assert_eq!(cap_after_pushes(Duration::from_secs(10)).await, WINDOW);
}

#[tokio::test]
async fn a_fixed_window_stays_put_and_tcp_has_none() {
    assert_eq!(cap_after_pushes(Duration::ZERO).await, WINDOW);
    let server = ServerProc::start(SERVER, &[]).await;
    let cfg = Config {
        transport: TransportPref::Tcp,
        ..Config::default()
    };
    let client = Client::connect(&server.addr, &cfg).await.expect("connect");
    assert_eq!(client.link_stats().window_cap, 0);
}

#[tokio::test]
async fn clients_with_other_window_settings_get_their_own_link() {
    let server = ServerProc::start(SERVER, &["--transport", "rdma"]).await;
    let fixed = Config {
        transport: TransportPref::Rdma,
        window_bytes: WINDOW,
        ..Config::default()
    };
    let adaptive = Config {
        window_target_delay: Duration::from_micros(1),
        ..fixed.clone()
    };
    let a = Client::connect(&server.addr, &fixed)
        .await
        .expect("connect");
    let b = Client::connect(&server.addr, &adaptive)
        .await
        .expect("connect");
    push_16_mib(&b).await;
    assert!(b.link_stats().window_cap < WINDOW, "b's own adaptive link");
    assert_eq!(a.link_stats().window_cap, WINDOW, "a's fixed link");
}
