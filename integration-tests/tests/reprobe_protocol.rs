//! A fallen-back link's peer that breaks the re-probe protocol (DESIGN.md 3.5, "Link life")
//! costs that link only, with a typed error, never a hang: a SWITCH nobody agreed to, or a
//! REPROBE far larger than any set-up message. Client and server are separate processes on
//! the provider `byteexpress_verbs::devices()` lists first.

use std::time::{Duration, Instant};

use byteexpress_rpc::test_hooks::UnaskedReprobe;
use byteexpress_rpc::{Client, Code, LinkState, Metadata, Request};
use bytes::Bytes;
use integration_tests::fallback::{no_reprobe, wait_for_fallback};
use integration_tests::{ServerProc, rdma_here};

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");

fn call(method: &str, delay_ms: u64) -> Request {
    let mut md = Metadata::new();
    md.insert("x-delay-ms", delay_ms.to_string()).unwrap();
    Request {
        method: method.into(),
        metadata: md,
        body: Bytes::from_static(b"x"),
        timeout: Some(Duration::from_secs(30)),
    }
}

/// A client on RDMA whose link has fallen back to TCP.
async fn fallen_back(server: &ServerProc) -> Client {
    let client = Client::connect(&server.addr, &no_reprobe())
        .await
        .expect("connect");
    assert_eq!(client.transport(), rdma_here());
    assert!(client.link_faults().inject_qp_error(), "the link has a QP");
    wait_for_fallback(&client).await;
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_nobody_agreed_to_fails_the_links_calls_with_a_typed_error_instead_of_hanging_them()
 {
    let server = ServerProc::start(SERVER, &["--grant", "8"]).await;
    let client = fallen_back(&server).await;
    let slow = tokio::spawn({
        let client = client.clone();
        async move { client.call(call("/test.Test/Echo", 3000)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    // The server's end sends SWITCH before its answer: the client's reader stops at it.
    let switch = client.call(call("/test.Test/SendSwitch", 0)).await;
    let slow = slow.await.unwrap();
    let took = started.elapsed();
    for (what, r) in [
        ("SendSwitch", switch.map(|_| ())),
        ("held echo", slow.map(|_| ())),
    ] {
        let e = r.expect_err(what);
        assert_eq!(e.code, Code::Internal, "{what}: {e:?}");
        assert!(
            e.message.contains("re-probe protocol"),
            "{what}: the typed cause: {e:?}"
        );
    }
    // Far sooner than the calls' 30 s deadline or a keepalive.
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_eq!(client.link_stats().link_state, Some(LinkState::Closed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_reprobe_closes_that_link_only_and_another_clients_calls_go_on() {
    let server = ServerProc::start(SERVER, &["--grant", "8"]).await;
    let other = Client::connect(&server.addr, &no_reprobe())
        .await
        .expect("connect");
    let client = fallen_back(&server).await;
    assert!(client.link_faults().send_unasked(UnaskedReprobe::Oversized));
    // The server closes the link (with an ERROR naming the violation): the client sees it end.
    let until = Instant::now() + Duration::from_secs(10);
    while client.link_stats().link_state != Some(LinkState::Closed) {
        assert!(
            Instant::now() < until,
            "the server kept a link that sent a 64 KiB REPROBE: {:?}",
            client.link_stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..20 {
        let r = other
            .call(call("/test.Test/Echo", 0))
            .await
            .expect("another client's call");
        assert_eq!(&r.body[..], b"x");
    }
    assert_eq!(other.transport(), rdma_here());
}
