//! A fatal async event, not an error completion, fails a link's QP: the soft provider's
//! QP_FATAL (`ibv_get_async_event(3)`) puts the QP in ERR and completes nothing, so only the
//! device's event watcher can tell the link. With 64 calls in its handlers and 64 on their
//! way, the link falls back to TCP on the event (DESIGN.md 3.5, "Link life"), every call
//! completes once and in order, and the re-probe takes RDMA back. Client and server are
//! separate processes.

use std::time::Duration;

use byteexpress_rpc::{Client, Config, LinkState, Transport, TransportPref};
use integration_tests::fallback::{held_echo, quick_reprobe, served, wait_for_fallback, wave};
use integration_tests::{ServerProc, rdma_here};

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
const CALLS: u64 = 64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qp_fatal_event_under_64_calls_falls_back_to_tcp_every_call_runs_once_in_order_and_rdma_comes_back()
 {
    let server = ServerProc::start(SERVER, &["--grant", "8"]).await;
    let cfg = quick_reprobe();
    let client = Client::connect(&server.addr, &cfg).await.expect("connect");
    assert_eq!(client.transport(), rdma_here());
    let faults = client.link_faults();
    faults.block_reprobes(true);
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
    assert!(faults.inject_qp_fatal(), "the link has a soft QP");
    // The link learns of the fault from the event alone: nothing completes on its QP.
    wait_for_fallback(&client).await;
    let st = client.link_stats();
    // Under load a send posted after the event may be flushed (a QP in ERR flushes new WRs)
    // and reach the engine before the watcher does: either cause moves the link, once. The
    // event's own path is pinned by the idle test below, where nothing else can.
    assert!(
        st.fatal_events + st.qp_errors >= 1 && st.fallbacks == 1,
        "the link fell back once, on the QP_FATAL event or a flush after it: {st:?}"
    );
    assert_eq!(client.transport().to_string(), "tcp(fallback)");
    let mut results = first.await.unwrap();
    results.extend(second.await.unwrap());
    for (id, body, r) in results {
        let r = r.unwrap_or_else(|e| panic!("call {id} failed after QP_FATAL: {e}"));
        assert_eq!(r.body, body, "call {id}: its own answer");
    }
    let st = client.link_stats();
    assert_eq!(st.link_state, Some(LinkState::FallbackTcp), "{st:?}");
    assert_eq!(st.fallbacks, 1, "{st:?}");
    let want: Vec<String> = (0..2 * CALLS).map(|id| format!("{id}:1")).collect();
    assert_eq!(served(&client).await, want, "each call ran once, in order");
    // The path clears: the re-probe builds a new QP and RDMA comes back.
    faults.block_reprobes(false);
    let cleared = tokio::time::Instant::now();
    let limit = cfg.reprobe_backoff_max + cfg.handshake_timeout + Duration::from_secs(5);
    let mut next = 2 * CALLS;
    while client.transport() != rdma_here() {
        assert!(
            cleared.elapsed() < limit,
            "not back on RDMA: {:?}",
            client.link_stats()
        );
        for (id, body, r) in wave(&client, next..next + 8, 0).await.unwrap() {
            assert_eq!(r.unwrap().body, body, "call {id}");
        }
        next += 8;
    }
    let (req, body) = held_echo(next, 10, 0);
    let r = client.call(req).await.unwrap();
    assert_eq!(r.body, body);
    assert_eq!(
        r.metadata.get("x-transport").map(|v| &v[..]),
        Some(rdma_here().to_string().as_bytes()),
        "the server is back on RDMA too"
    );
    let want: Vec<String> = (0..=next).map(|id| format!("{id}:1")).collect();
    assert_eq!(served(&client).await, want, "each call ran once, in order");
}

/// An idle link has no post to fail and no call to notice: only the event watcher can see a
/// QP_FATAL, so without it the link would sit on a dead QP, still saying `rdma`, until its
/// next send. With it, the link is on `tcp(fallback)` without a single call, and the next call
/// is answered over TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_links_qp_fatal_event_moves_it_to_tcp_without_any_call() {
    let server = ServerProc::start(SERVER, &["--grant", "8"]).await;
    let cfg = Config {
        transport: TransportPref::Rdma,
        // No re-probe: the link stays where the event put it.
        reprobe_backoff: Duration::ZERO,
        ..Config::default()
    };
    let client = Client::connect(&server.addr, &cfg).await.expect("connect");
    assert_eq!(client.transport(), rdma_here());
    let (req, body) = held_echo(0, 64, 0);
    assert_eq!(client.call(req).await.expect("call over RDMA").body, body);
    assert!(client.link_faults().inject_qp_fatal(), "the link has a QP");
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while !matches!(client.transport(), Transport::TcpFallback { .. }) {
        assert!(
            tokio::time::Instant::now() < until,
            "an idle link did not leave its fatal QP within 10 s: {} {:?}",
            client.transport(),
            client.link_stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(client.link_stats().fatal_events, 1);
    let (req, body) = held_echo(1, 64, 0);
    let r = client.call(req).await.expect("call after the fallback");
    assert_eq!(r.body, body);
    assert_eq!(
        r.metadata.get("x-transport").map(|v| &v[..]),
        Some(&b"tcp(fallback)"[..]),
        "answered over TCP, the server's end fallen back too"
    );
}
