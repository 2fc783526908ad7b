//! A device fatal error (`IBV_EVENT_DEVICE_FATAL`, `ibv_get_async_event(3)`): the device's
//! QPs never complete anything again, not even a flush. The link falls back to TCP on the
//! event (DESIGN.md 3.5, "Link life") without waiting for flushes, every call completes once
//! and in order, and the buffers of the WRs posted on the dead device stay held (parked with
//! the device context), never freed under it. Its own test binary: it fails the client
//! process's soft device. Client and server are separate processes.

use std::time::Duration;

use byteexpress_rpc::{Client, Config, LinkState, Metadata, Request, Transport, TransportPref};
use bytes::Bytes;
use integration_tests::{ServerProc, rdma_here};

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
const CALLS: u64 = 64;

/// Echo call `id` (logged by the server as `x-id` and `x-seq`), held `delay_ms` in the handler.
fn echo(id: u64, delay_ms: u64) -> (Request, Bytes) {
    let body: Bytes = (0..100 + id as usize % 300)
        .map(|j| (id as usize * 7 + j) as u8)
        .collect::<Vec<u8>>()
        .into();
    let mut md = Metadata::new();
    md.insert("x-id", id.to_string()).unwrap();
    md.insert("x-seq", id.to_string()).unwrap();
    md.insert("x-delay-ms", delay_ms.to_string()).unwrap();
    let req = Request {
        method: "/test.Test/Echo".into(),
        metadata: md,
        body: body.clone(),
        timeout: Some(Duration::from_secs(20)),
    };
    (req, body)
}

fn wave(
    client: &Client,
    ids: std::ops::Range<u64>,
    delay_ms: u64,
) -> tokio::task::JoinHandle<Vec<(u64, Bytes, Result<byteexpress_rpc::Response, String>)>> {
    let calls: Vec<_> = ids
        .map(|id| {
            let client = client.clone();
            async move {
                let (req, body) = echo(id, delay_ms);
                (id, body, client.call(req).await.map_err(|e| e.to_string()))
            }
        })
        .collect();
    tokio::spawn(futures::future::join_all(calls))
}

async fn served(client: &Client) -> Vec<String> {
    let r = client
        .call(Request {
            method: "/test.Test/Served".into(),
            timeout: Some(Duration::from_secs(20)),
            ..Default::default()
        })
        .await
        .expect("Served");
    String::from_utf8(r.body.to_vec())
        .unwrap()
        .split(',')
        .filter(|x| !x.is_empty())
        .map(str::to_string)
        .collect()
}

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
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while !matches!(client.transport(), Transport::TcpFallback { .. }) {
        assert!(
            tokio::time::Instant::now() < until,
            "no fallback within 10 s: {:?}",
            client.link_stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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
    let (req, body) = echo(5000, 0);
    let r = client.call(req).await.unwrap();
    assert_eq!(r.body, body);
    assert_eq!(
        r.metadata.get("x-transport").map(|v| &v[..]),
        Some(&b"tcp(fallback)"[..])
    );
}
