//! A device fatal error (`IBV_EVENT_DEVICE_FATAL`, `ibv_get_async_event(3)`): the device's
//! QPs never complete anything again, not even a flush. The link falls back to TCP on the
//! event (DESIGN.md 3.5, "Link life") without waiting for flushes, every call completes once
//! and in order, and the buffers of the WRs posted on the dead device stay held (parked with
//! the device context), never freed under it. Its own test binary: it fails the client
//! process's soft device. Client and server are separate processes.

use std::time::Duration;

use byteexpress_rpc::{Client, Config, LinkState, TransportPref};
use integration_tests::fallback::{held_echo, served, wait_for_fallback, wave};
use integration_tests::{ServerProc, rdma_here};

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
const CALLS: u64 = 64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_fatal_event_falls_back_without_flushes_and_every_call_runs_once_in_order() {
    let server = ServerProc::start(SERVER, &["--grant", "8"]).await;
    let cfg = Config {
        transport: TransportPref::Rdma,
        reprobe_backoff: Duration::ZERO,
        ..Config::default()
    };
    let client = Client::connect(&server.addr, &cfg).await.expect("connect");
    assert_eq!(client.transport(), rdma_here());
    let first = wave(&client, 0..CALLS, 1500);
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    while served(&client).await.len() < CALLS as usize {
        assert!(
            tokio::time::Instant::now() < until,
            "handlers never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = wave(&client, CALLS..2 * CALLS, 0);
    assert!(
        client.link_faults().inject_device_fatal(),
        "the link has a soft QP"
    );
    wait_for_fallback(&client).await;
    let st = client.link_stats();
    assert_eq!(
        st.fatal_events, 1,
        "the link fell back on the DEVICE_FATAL event: {st:?}"
    );
    let mut results = first.await.unwrap();
    results.extend(second.await.unwrap());
    for (id, body, r) in results {
        let r = r.unwrap_or_else(|e| panic!("call {id} failed after DEVICE_FATAL: {e}"));
        assert_eq!(r.body, body, "call {id}: its own answer");
    }
    let st = client.link_stats();
    assert_eq!(st.link_state, Some(LinkState::FallbackTcp), "{st:?}");
    assert_eq!(st.fallbacks, 1, "{st:?}");
    // The receives posted on the dead device never completed: their buffers are still held.
    assert!(
        st.awaiting_flush > 0,
        "the WRs of the dead device are held, not flushed: {st:?}"
    );
    let want: Vec<String> = (0..2 * CALLS).map(|id| format!("{id}:1")).collect();
    assert_eq!(served(&client).await, want, "each call ran once, in order");
    let (req, body) = held_echo(5000, 100 + 5000 % 300, 0);
    let r = client.call(req).await.unwrap();
    assert_eq!(r.body, body);
    assert_eq!(
        r.metadata.get("x-transport").map(|v| &v[..]),
        Some(&b"tcp(fallback)"[..])
    );
}
