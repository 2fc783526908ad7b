//! A link outlives its QP: a QP error with 64 calls in flight moves the link to its TCP control
//! connection (`tcp(fallback)`), and every call completes once, in order per logical
//! connection (DESIGN.md 3.5, "Link life"). Client and server are separate processes on the
//! provider `byteexpress_verbs::devices()` lists first (`soft0` on a host without RDMA).

use std::time::Duration;

use byteexpress_rpc::{Client, Config, LinkState, Metadata, Request, Transport, TransportPref};
use bytes::Bytes;
use integration_tests::fallback::{quick_reprobe, served, wait_for_fallback, wait_for_flushes};
use integration_tests::{ServerProc, rdma_here};

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
const CALLS: u64 = 64;

fn rdma() -> Config {
    Config {
        transport: TransportPref::Rdma,
        ..Config::default()
    }
}

/// RDMA, and a link that stays on TCP once its QP failed (no re-probe).
fn rdma_no_reprobe() -> Config {
    Config {
        reprobe_backoff: Duration::ZERO,
        ..rdma()
    }
}

/// Echo call `id` (logged by the server as `x-id` and `x-seq`), held `delay_ms` in the handler.
fn echo(id: u64, body: Bytes, delay_ms: u64) -> Request {
    let mut md = Metadata::new();
    md.insert("x-id", id.to_string()).unwrap();
    md.insert("x-seq", id.to_string()).unwrap();
    md.insert("x-delay-ms", delay_ms.to_string()).unwrap();
    Request {
        method: "/test.Test/Echo".into(),
        metadata: md,
        body,
        timeout: Some(Duration::from_secs(20)),
    }
}

fn body_of(id: u64, len: usize) -> Bytes {
    (0..len)
        .map(|j| (id as usize * 7 + j) as u8)
        .collect::<Vec<u8>>()
        .into()
}

async fn control(client: &Client, method: &str) -> String {
    let r = client
        .call(Request {
            method: method.into(),
            timeout: Some(Duration::from_secs(20)),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{method}: {e}"));
    String::from_utf8(r.body.to_vec()).unwrap()
}

/// Where the QP error is injected.
#[derive(Clone, Copy, Debug)]
enum FaultAt {
    /// The client fails its own QP (`Client::link_faults`).
    Client,
    /// The server fails its QP of this link (its test-only RPC `/test.Test/FailQp`).
    Server,
}

/// Calls `id` (body [`body_of`] `len(id)` bytes, held `delay_ms`) on `client`, sent in the
/// order of `ids` (join_all polls them in order).
fn wave(
    client: &Client,
    ids: std::ops::Range<u64>,
    len: fn(u64) -> usize,
    delay_ms: u64,
) -> tokio::task::JoinHandle<
    Vec<(
        u64,
        Bytes,
        Result<byteexpress_rpc::Response, byteexpress_rpc::Status>,
    )>,
> {
    let client = client.clone();
    let calls: Vec<_> = ids
        .map(|id| {
            let body = body_of(id, len(id));
            let client = client.clone();
            async move {
                (
                    id,
                    body.clone(),
                    client.call(echo(id, body, delay_ms)).await,
                )
            }
        })
        .collect();
    tokio::spawn(futures::future::join_all(calls))
}

/// 64 small calls on one logical connection and 8 multi-chunk calls on another are running in
/// their handlers (held 1.5 s, their requests delivered over RDMA); 64 more small calls are
/// being sent, when the QP fails. Every call answers once with its own body, the server ran
/// each once, and it saw the small calls in the order they were sent.
async fn calls_survive_a_qp_error(at: FaultAt) {
    let server = ServerProc::start(SERVER, &["--grant", "8"]).await;
    let small = Client::connect(&server.addr, &rdma_no_reprobe())
        .await
        .expect("connect");
    assert_eq!(small.transport(), rdma_here());
    // Two more logical connections on the same link (the process's link registry): one for
    // messages of several chunks, one for the test's controls.
    let bulk = Client::connect(&server.addr, &rdma_no_reprobe())
        .await
        .expect("connect");
    let ctl = Client::connect(&server.addr, &rdma_no_reprobe())
        .await
        .expect("connect");
    let first = wave(&small, 0..CALLS, |id| 100 + id as usize, 1500);
    let bulks = wave(&bulk, 1000..1008, |id| 200_000 + id as usize, 1500);
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    while served(&small).await.len() < CALLS as usize || served(&bulk).await.len() < 8 {
        assert!(
            tokio::time::Instant::now() < until,
            "handlers never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = small.link_stats();
    assert_eq!(before.link_state, Some(LinkState::Rdma), "{before:?}");
    // The second wave is on its way (queued, posted, or received) when the QP fails.
    let second = wave(&small, CALLS..2 * CALLS, |id| 100 + id as usize, 0);
    match at {
        FaultAt::Client => assert!(small.link_faults().inject_qp_error(), "the link has a QP"),
        FaultAt::Server => assert_eq!(control(&ctl, "/test.Test/FailQp").await, "1"),
    }
    wait_for_fallback(&small).await;
    assert_eq!(small.transport().to_string(), "tcp(fallback)");
    let mut results = first.await.unwrap();
    results.extend(second.await.unwrap());
    results.extend(bulks.await.unwrap());
    for (id, body, r) in results {
        let r = r.unwrap_or_else(|e| panic!("call {id} failed after the QP error ({at:?}): {e}"));
        assert_eq!(r.body, body, "call {id}: its own answer");
    }
    // Every WR of the failed QP completed (flushed), so each of its buffers was freed at its
    // completion (it used to keep the completions polled with the failing one unhandled).
    wait_for_flushes(&small).await;
    let st = small.link_stats();
    eprintln!("{at:?}: after the fault: {st:?}");
    assert_eq!(st.link_state, Some(LinkState::FallbackTcp), "{st:?}");
    assert_eq!(st.fallbacks, 1, "{st:?}");
    // Each call ran once at the server, and the small ones in the order they were sent.
    let want: Vec<String> = (0..2 * CALLS).map(|id| format!("{id}:1")).collect();
    assert_eq!(
        served(&small).await,
        want,
        "small calls: each ran once, in order"
    );
    let mut runs = served(&bulk).await;
    runs.sort();
    let want: Vec<String> = (1000..1008).map(|id| format!("{id}:1")).collect();
    assert_eq!(runs, want, "bulk calls: each ran once");
    // New calls go over TCP now, and the server sees the fallback too.
    let r = small.call(echo(5000, body_of(5000, 10), 0)).await.unwrap();
    assert_eq!(r.body, body_of(5000, 10));
    assert_eq!(
        r.metadata.get("x-transport").map(|v| &v[..]),
        Some(&b"tcp(fallback)"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_qp_error_under_64_calls_falls_back_to_tcp_and_every_call_runs_once_in_order() {
    calls_survive_a_qp_error(FaultAt::Client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_qp_error_under_64_calls_falls_back_to_tcp_and_every_call_runs_once_in_order() {
    calls_survive_a_qp_error(FaultAt::Server).await;
}

/// While the path stays down (re-probes blocked) the link stays on TCP and keeps re-probing
/// with backoff; once it clears, the link is back on RDMA within the backoff cap (plus the
/// re-probe's own time limit), calls sent across the switch run once each and in order, and
/// a second QP error falls back again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_fault_clears_the_link_takes_rdma_back_and_calls_keep_their_order() {
    let server = ServerProc::start(SERVER, &["--grant", "8"]).await;
    let cfg = quick_reprobe();
    let client = Client::connect(&server.addr, &cfg).await.expect("connect");
    assert_eq!(client.transport(), rdma_here());
    let faults = client.link_faults();
    faults.block_reprobes(true);
    assert!(faults.inject_qp_error());
    wait_for_fallback(&client).await;
    let next_id = std::cell::Cell::new(0u64);
    let calls = |n: u64| {
        let ids = next_id.get()..next_id.get() + n;
        next_id.set(ids.end);
        wave(&client, ids, |id| 50 + id as usize % 300, 0)
    };
    // Failed re-probes, backing off, while calls go over TCP.
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    while client.link_stats().reprobes < 3 {
        assert!(
            tokio::time::Instant::now() < until,
            "{:?}",
            client.link_stats()
        );
        for (id, body, r) in calls(8).await.unwrap() {
            assert_eq!(r.unwrap().body, body, "call {id}");
        }
    }
    assert!(matches!(client.transport(), Transport::TcpFallback { .. }));
    // The path clears: calls keep going while the link switches back.
    faults.block_reprobes(false);
    let cleared = tokio::time::Instant::now();
    let limit = cfg.reprobe_backoff_max + cfg.handshake_timeout;
    while client.transport() != rdma_here() {
        assert!(
            cleared.elapsed() < limit + Duration::from_secs(5),
            "not back on RDMA within the backoff cap {:?} + the re-probe limit {:?}: {:?}",
            cfg.reprobe_backoff_max,
            cfg.handshake_timeout,
            client.link_stats()
        );
        for (id, body, r) in calls(16).await.unwrap() {
            assert_eq!(r.unwrap().body, body, "call {id}");
        }
    }
    eprintln!(
        "back on RDMA {:?} after the fault cleared",
        cleared.elapsed()
    );
    let before = client.link_stats();
    for (id, body, r) in calls(64).await.unwrap() {
        let r = r.unwrap();
        assert_eq!(r.body, body, "call {id}");
        assert_eq!(
            r.metadata.get("x-transport").map(|v| &v[..]),
            Some(rdma_here().to_string().as_bytes()),
            "the server is back on RDMA too"
        );
    }
    let st = client.link_stats();
    assert_eq!(st.link_state, Some(LinkState::Rdma), "{st:?}");
    assert!(st.chunks_sent >= before.chunks_sent + 64, "{st:?}");
    let want: Vec<String> = (0..next_id.get()).map(|id| format!("{id}:1")).collect();
    assert_eq!(served(&client).await, want, "each call ran once, in order");
    // The new QP can fail too.
    assert!(faults.inject_qp_error());
    wait_for_fallback(&client).await;
    for (id, body, r) in calls(8).await.unwrap() {
        assert_eq!(r.unwrap().body, body, "call {id}");
    }
    assert_eq!(client.link_stats().fallbacks, 2);
}

/// A path that lets the QP handshake through (it runs over TCP) but fails every new QP makes
/// the link flap; each flap doubles the wait before the next re-probe instead of starting over
/// at `reprobe_backoff` (the rxe VM's dropped RoCE port did this: a fall-back every 0.6 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_probed_qp_that_fails_at_once_doubles_the_wait_before_the_next_re_probe() {
    let server = ServerProc::start(SERVER, &["--grant", "8"]).await;
    let first = Duration::from_millis(200);
    let cfg = Config {
        reprobe_backoff: first,
        reprobe_backoff_max: Duration::from_secs(10),
        ..rdma()
    };
    let client = Client::connect(&server.addr, &cfg).await.expect("connect");
    assert_eq!(client.transport(), rdma_here());
    let faults = client.link_faults();
    let mut waits = Vec::new();
    for flap in 0..3 {
        let fell = tokio::time::Instant::now();
        assert!(faults.inject_qp_error(), "flap {flap}: the link has a QP");
        wait_for_fallback(&client).await;
        while client.transport() != rdma_here() {
            assert!(
                fell.elapsed() < Duration::from_secs(20),
                "flap {flap}: not back on RDMA: {:?}",
                client.link_stats()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        waits.push(fell.elapsed());
    }
    eprintln!("back on RDMA after {waits:?} (from each QP error)");
    // The first re-probe waits `first`; the QPs it and the next opened failed at once, so the
    // next waits 2 × and then 4 × `first` (lower bounds only: a loaded machine adds, never
    // subtracts).
    assert!(waits[0] >= first, "{waits:?}");
    assert!(
        waits[1] >= first * 2,
        "the second re-probe doubled: {waits:?}"
    );
    assert!(
        waits[2] >= first * 4,
        "the third re-probe doubled again: {waits:?}"
    );
    for (id, body, r) in wave(&client, 0..16, |id| 50 + id as usize, 0)
        .await
        .unwrap()
    {
        assert_eq!(r.unwrap().body, body, "call {id}");
    }
}

/// In fallback, the TCP connection is all the link has: when it fails too (the server process
/// is killed), the link closes and the calls pending on it fail UNAVAILABLE (they were sent, so
/// the retry rule never re-sends them without a policy), well within their deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_tcp_fails_too_in_fallback_the_link_closes_and_pending_calls_fail_unavailable() {
    let mut server = ServerProc::start(SERVER, &[]).await;
    let client = Client::connect(&server.addr, &rdma_no_reprobe())
        .await
        .expect("connect");
    assert!(client.link_faults().inject_qp_error());
    wait_for_fallback(&client).await;
    let pending = wave(&client, 0..8, |_| 100, 10_000);
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    while served(&client).await.len() < 8 {
        assert!(
            tokio::time::Instant::now() < until,
            "handlers never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t0 = std::time::Instant::now();
    server.kill().await;
    for (id, _, r) in pending.await.unwrap() {
        let e = r.expect_err("the server is gone");
        assert_eq!(e.code, byteexpress_rpc::Code::Unavailable, "call {id}: {e}");
    }
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "failed within the deadline"
    );
    let st = client.link_stats();
    assert_eq!(st.link_state, Some(LinkState::Closed), "{st:?}");
    assert!(client.is_closed());
}
