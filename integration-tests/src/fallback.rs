//! Helpers of the RDMA→TCP fallback tests (`link_fallback`, `qp_fatal_fallback`,
//! `device_fatal_fallback`, `reprobe_protocol`), against the test server's `/test.Test/Echo`
//! and `/test.Test/Served` (DESIGN.md 3.5, "Link life").

use std::time::Duration;

use byteexpress_rpc::{Client, Config, Metadata, Request, Response, Transport, TransportPref};
use bytes::Bytes;

/// RDMA, re-probing quickly: first after 50 ms, doubling up to 400 ms.
pub fn quick_reprobe() -> Config {
    Config {
        transport: TransportPref::Rdma,
        reprobe_backoff: Duration::from_millis(50),
        reprobe_backoff_max: Duration::from_millis(400),
        ..Config::default()
    }
}

/// RDMA, and a link that stays on TCP once its QP failed (no re-probe of its own).
pub fn no_reprobe() -> Config {
    Config {
        transport: TransportPref::Rdma,
        reprobe_backoff: Duration::ZERO,
        ..Config::default()
    }
}

/// Waits until every WR of `client`'s failed QP completed (`LinkStats::awaiting_flush` 0:
/// flushed, or covered by a later completion); panics after 10 s.
pub async fn wait_for_flushes(client: &Client) {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while client.link_stats().awaiting_flush > 0 {
        assert!(
            tokio::time::Instant::now() < until,
            "WRs of the failed QP never completed: {:?}",
            client.link_stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (generously) until `client`'s link reports `tcp(fallback)`; panics after 10 s.
pub async fn wait_for_fallback(client: &Client) {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while !matches!(client.transport(), Transport::TcpFallback { .. }) {
        assert!(
            tokio::time::Instant::now() < until,
            "no fallback within 10 s: {} {:?}",
            client.transport(),
            client.link_stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The `x-id`s the server ran for `client`'s logical connection, with how often each ran
/// (`id:count`, in the order they ran).
pub async fn served(client: &Client) -> Vec<String> {
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

/// Echo call `id` with a body of `len` bytes derived from `id` (logged by the server as
/// `x-id` and `x-seq`); with the body it must answer.
pub fn echo(id: u64, len: usize) -> (Request, Bytes) {
    let body: Bytes = (0..len)
        .map(|j| (id as usize * 7 + j) as u8)
        .collect::<Vec<u8>>()
        .into();
    let mut md = Metadata::new();
    md.insert("x-id", id.to_string()).unwrap();
    md.insert("x-seq", id.to_string()).unwrap();
    let req = Request {
        method: "/test.Test/Echo".into(),
        metadata: md,
        body: body.clone(),
        timeout: Some(Duration::from_secs(20)),
    };
    (req, body)
}

/// [`echo`], held `delay_ms` in the handler.
pub fn held_echo(id: u64, len: usize, delay_ms: u64) -> (Request, Bytes) {
    let (mut req, body) = echo(id, len);
    req.metadata
        .insert("x-delay-ms", delay_ms.to_string())
        .unwrap();
    (req, body)
}

/// One call's id, the body it sent, and its outcome.
pub type Answered = (u64, Bytes, Result<Response, String>);

/// Calls `ids` in order (`join_all` polls them in order), bodies of 100 to 399 bytes, each
/// held `delay_ms` in its handler.
pub fn wave(
    client: &Client,
    ids: std::ops::Range<u64>,
    delay_ms: u64,
) -> tokio::task::JoinHandle<Vec<Answered>> {
    let calls: Vec<_> = ids
        .map(|id| {
            let client = client.clone();
            async move {
                let (req, body) = held_echo(id, 100 + id as usize % 300, delay_ms);
                (id, body, client.call(req).await.map_err(|e| e.to_string()))
            }
        })
        .collect();
    tokio::spawn(futures::future::join_all(calls))
}
