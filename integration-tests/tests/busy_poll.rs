//! Hybrid polling (`Config::busy_poll`) on RDMA links: a polling engine must not hold its
//! thread. Both processes run current-thread runtimes with a polling budget (2 s) far longer
//! than the waits below, so an engine that spun synchronously would hold back the handler's
//! timer, the caller's timer and the caller's next message until its budget ran out, and the
//! calls would miss their 1 s deadlines.

use std::time::Duration;

use byteexpress_rpc::{Client, Code, Config, Request, TransportPref};
use bytes::Bytes;
use integration_tests::{ServerProc, rdma_here};

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
/// Polling budget of both ends (µs): longer than every deadline here.
const BUDGET_US: u64 = 2_000_000;

fn call(method: &str, body: &'static [u8]) -> Request {
    Request {
        method: method.into(),
        body: Bytes::from_static(body),
        timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    }
}

/// A test server and a client on one RDMA link, both polling for [`BUDGET_US`].
async fn polling_link() -> (ServerProc, Client) {
    let budget = BUDGET_US.to_string();
    let server = ServerProc::start(
        SERVER,
        &["--transport", "rdma", "--busy-poll-us", budget.as_str()],
    )
    .await;
    let cfg = Config {
        transport: TransportPref::Rdma,
        busy_poll: Duration::from_micros(BUDGET_US),
        ..Config::default()
    };
    let client = Client::connect(&server.addr, &cfg).await.expect("connect");
    assert_eq!(client.transport(), rdma_here());
    (server, client)
}

#[tokio::test]
async fn polling_engines_let_handlers_timers_and_callers_run() {
    let (_server, client) = polling_link().await;
    for i in 0..5 {
        // The handler awaits a 5 ms timer on the server's runtime while its engine polls.
        client
            .call(call("/test.Test/Sleep", b"5"))
            .await
            .unwrap_or_else(|s| panic!("sleep call {i}: {s:?}"));
        // This caller's own timer, then its next message, while the client's engine polls.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let r = client
            .call(call("/test.Test/Echo", b"ping"))
            .await
            .unwrap_or_else(|s| panic!("echo call {i}: {s:?}"));
        assert_eq!(&r.body[..], b"ping");
    }
    assert_eq!(
        client.link_stats().qp_state,
        Some(byteexpress_rpc::QpState::Rts)
    );
}

#[tokio::test]
async fn a_polling_engine_notices_its_peer_dying() {
    let (mut server, client) = polling_link().await;
    // A call the server never answers: its handler sleeps past the deadline.
    let call = client.call(Request {
        timeout: Some(Duration::from_millis(1500)),
        ..call("/test.Test/Sleep", b"10000")
    });
    let (res, _) = tokio::join!(call, async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.kill().await;
    });
    // The client's engine, polling within its 2 s budget, sees the control connection close
    // and fails the call at once; one that only looked after its budget would let the
    // deadline pass first.
    let err = res.expect_err("the server died");
    assert_eq!(err.code, Code::Unavailable, "{err:?}");
}
