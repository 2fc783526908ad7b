//! Issue 24: a server's certificate replaced on disk is presented to new connections without
//! a restart; links already up go on, and a replacement that does not load keeps the
//! previous certificate.

mod tls_common;

use std::path::PathBuf;
use std::sync::Arc;

use byteexpress::{
    Certificate, Channel, ClientTlsConfig, Config, Identity, ServerTlsConfig, TransportPref,
};
use byteexpress_ps::pb::echo::EchoRequest;
use byteexpress_ps::pb::echo::echo_client::EchoClient;
use bytes::Bytes;
use rustls_pki_types::ServerName;
use tls_common::*;

/// The certificate the server at `addr` presents to a new connection (DER).
async fn presented(addr: std::net::SocketAddr, ca: &Ca) -> Vec<u8> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(rustls_client(Some(&ca.pem()), None)))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("handshake");
    tls.get_ref().1.peer_certificates().expect("a certificate")[0].to_vec()
}

fn write(dir: &std::path::Path, leaf: &Leaf) {
    std::fs::write(dir.join("server.pem"), &leaf.cert_pem).unwrap();
    std::fs::write(dir.join("server.key"), &leaf.key_pem).unwrap();
}

async fn echo(ch: &Channel) -> Bytes {
    EchoClient::new(ch.clone())
        .echo(EchoRequest {
            payload: Bytes::from_static(b"still up"),
        })
        .await
        .expect("echo")
        .into_inner()
        .payload
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_replaced_on_disk_is_presented_to_new_connections_without_a_restart() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tls-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = Ca::new("test CA");
    let (first, second) = (ca.leaf("first", 1), ca.leaf("second", 2));
    assert_ne!(first.der, second.der);
    write(&dir, &first);
    let addr = start_server(ServerTlsConfig::new().identity(Identity::from_pem_files(
        dir.join("server.pem"),
        dir.join("server.key"),
    )))
    .await;
    let which = |der: Vec<u8>| match der {
        d if d == first.der => "first",
        d if d == second.der => "second",
        _ => "another",
    };
    assert_eq!(which(presented(addr, &ca).await), "first");
    let cfg = Config {
        transport: TransportPref::Tcp,
        tls: Some(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca.pem()))
                .domain_name("localhost"),
        ),
        ..Config::default()
    };
    let up = Channel::connect_with(&format!("https://{addr}"), &cfg)
        .await
        .expect("connect");

    write(&dir, &second);
    assert_eq!(
        which(presented(addr, &ca).await),
        "second",
        "a new connection after the files changed"
    );
    assert_eq!(
        echo(&up).await,
        Bytes::from_static(b"still up"),
        "the link set up before"
    );

    // a replacement that does not load (no certificate in the file) keeps the last good one
    std::fs::write(dir.join("server.pem"), b"not a certificate\n").unwrap();
    assert_eq!(
        presented(addr, &ca).await,
        second.der,
        "after a bad replacement"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
