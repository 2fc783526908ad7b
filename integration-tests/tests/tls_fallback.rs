//! Issue 24: an RDMA link whose set-up ran inside TLS falls back to its TCP control
//! connection, inside the same TLS session, when its QP fails: calls go on over TCP, and the
//! re-probe (its messages inside TLS too) takes the link back to RDMA.

mod tls_common;

use std::time::Duration;

use byteexpress::{Certificate, ClientTlsConfig, ServerTlsConfig};
use byteexpress_rpc::{Client, Request, Transport};
use bytes::Bytes;
use integration_tests::fallback::{quick_reprobe, wait_for_fallback};
use integration_tests::rdma_here;
use tls_common::*;

async fn echo(client: &Client, n: u8) -> (Bytes, Option<Vec<u8>>) {
    let body = Bytes::from(vec![n; 1000 + n as usize]);
    let r = client
        .call(Request {
            method: "/test.Test/Echo".into(),
            body: body.clone(),
            timeout: Some(Duration::from_secs(20)),
            ..Default::default()
        })
        .await
        .expect("echo");
    assert_eq!(r.body, body, "call {n}");
    (r.body, r.metadata.get("x-transport").map(|v| v.to_vec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_rdma_link_falls_back_to_tcp_inside_tls_and_takes_rdma_back() {
    let ca = Ca::new("test CA");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = byteexpress_rpc::Server::new(
        integration_tests::test_service,
        byteexpress_rpc::Config::default(),
    )
    .with_tls(ServerTlsConfig::new().identity(ca.leaf("server", 1).identity()))
    .expect("TLS config loads");
    tokio::spawn(server.serve(listener));

    let cfg = byteexpress_rpc::Config {
        allow_soft: true,
        tls: Some(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca.pem()))
                .domain_name("localhost"),
        ),
        ..quick_reprobe()
    };
    let client = Client::connect_unshared(&addr, &cfg)
        .await
        .expect("connect");
    assert_eq!(client.transport(), rdma_here());
    let faults = client.link_faults();
    faults.block_reprobes(true);
    assert!(faults.inject_qp_error(), "the link has a QP");
    wait_for_fallback(&client).await;
    for n in 0..16 {
        echo(&client, n).await;
    }
    assert!(matches!(client.transport(), Transport::TcpFallback { .. }));

    faults.block_reprobes(false);
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut n = 16u8;
    while client.transport() != rdma_here() {
        assert!(
            tokio::time::Instant::now() < until,
            "hang guard: not back on RDMA: {:?}",
            client.link_stats()
        );
        echo(&client, n).await;
        n = n.wrapping_add(1);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (_, served) = echo(&client, 200).await;
    assert_eq!(
        served.as_deref(),
        Some(rdma_here().to_string().as_bytes()),
        "the server is back on RDMA too"
    );
    assert_eq!(client.link_stats().fallbacks, 1);
}
