//! A QP failure in the middle of rendezvous traffic (issue 23; DESIGN.md 3.5 "Rendezvous" and
//! "Link life"): messages lent and not yet READ go again over TCP (the reader lists them as
//! holes in its RESYNC), messages READ whose RELEASE was lost do not, so every call answers
//! once with its own body and every handler runs once.

use std::time::Duration;

use byteexpress_rpc::{Client, Config, LinkState};
use integration_tests::fallback::{held_echo, served, wait_for_fallback};
use integration_tests::{ServerProc, rdma_here};

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");

fn cfg() -> Config {
    Config {
        transport: byteexpress_rpc::TransportPref::Rdma,
        reprobe_backoff: Duration::ZERO,
        max_message: 64 << 20,
        memory_budget: 1 << 30,
        ..Config::default()
    }
}

/// Where the QP error is injected, and how many ms after the first message was lent.
async fn wave_with_a_qp_error(server_side: bool, after_ms: u64, delay_ms: u64) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let server = ServerProc::start(
        SERVER,
        &["--max-message-mib", "64", "--memory-budget-mib", "1024"],
    )
    .await;
    let client = Client::connect(&server.addr, &cfg())
        .await
        .expect("connect");
    let ctl = Client::connect(&server.addr, &cfg())
        .await
        .expect("connect");
    assert_eq!(client.transport(), rdma_here());
    const CALLS: u64 = 12;
    let calls: Vec<_> = (0..CALLS)
        .map(|id| {
            let (req, body) = held_echo(id, (3 << 20) + id as usize * 4099, delay_ms);
            let client = client.clone();
            async move { (id, body, client.call(req).await) }
        })
        .collect();
    let wave = tokio::spawn(futures::future::join_all(calls));
    // The fault comes once rendezvous is under way (a fixed wait raced a slow machine, where
    // the QP failed before anything was lent), then after `after_ms` more.
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while client.link_stats().messages_lent == 0 {
        assert!(tokio::time::Instant::now() < until, "nothing was lent");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(after_ms)).await;
    if server_side {
        let r = ctl
            .call(byteexpress_rpc::Request {
                method: "/test.Test/FailQp".into(),
                timeout: Some(Duration::from_secs(20)),
                ..Default::default()
            })
            .await
            .expect("FailQp");
        assert_eq!(&r.body[..], b"1");
    } else {
        assert!(client.link_faults().inject_qp_error(), "the link has a QP");
    }
    wait_for_fallback(&client).await;
    for (id, body, r) in wave.await.unwrap() {
        let r = r.unwrap_or_else(|e| panic!("call {id} failed after the QP error: {e}"));
        assert!(r.body == body, "call {id}: its own answer");
    }
    let st = client.link_stats();
    eprintln!("after the fault: {st:?}");
    assert_eq!(st.link_state, Some(LinkState::FallbackTcp), "{st:?}");
    assert!(
        st.messages_lent >= 1,
        "rendezvous was used before the fault: {st:?}"
    );
    let mut runs = served(&client).await;
    runs.sort();
    let mut want: Vec<String> = (0..CALLS).map(|id| format!("{id}:1")).collect();
    want.sort();
    assert_eq!(runs, want, "each handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_qp_error_while_requests_are_being_read_loses_and_repeats_none() {
    wave_with_a_qp_error(false, 0, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_qp_error_while_answers_are_being_read_loses_and_repeats_none() {
    wave_with_a_qp_error(true, 20, 20).await;
}
