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
    // the files are checked in the background: new connections see the change once a check
    // ran (bounded by the hang guard, not a timed assertion)
    let seen = tokio::time::timeout(HANG_GUARD, async {
        loop {
            match which(presented(addr, &ca).await) {
                "first" => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
                other => return other,
            }
        }
    })
    .await
    .expect("hang guard: the replaced certificate was never presented");
    assert_eq!(seen, "second", "a new connection after the files changed");
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

/// Reopens a named pipe's write end on drop, so that a reader blocked on it (the server
/// before the fix) gets EOF and the test's runtime can shut down.
struct UnblockFifo(PathBuf);

impl Drop for UnblockFifo {
    fn drop(&mut self) {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.0);
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A certificate path replaced by a named pipe (whose open blocks until someone writes) stalls
/// no handshake: new connections get the certificate loaded before, and a link up before
/// still answers calls. The server never reads its files on a handshake's path. (A
/// regression that reads the pipe on a handshake's path hangs this test rather than failing
/// it at the hang guard: run it under a timeout when checking such a change.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_certificate_path_replaced_by_a_named_pipe_stalls_no_handshake() {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("tls-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = Ca::new("test CA");
    let first = ca.leaf("first", 1);
    write(&dir, &first);
    let addr = start_server(ServerTlsConfig::new().identity(Identity::from_pem_files(
        dir.join("server.pem"),
        dir.join("server.key"),
    )))
    .await;
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

    let pem = dir.join("server.pem");
    std::fs::remove_file(&pem).unwrap();
    let status = std::process::Command::new("mkfifo")
        .arg(&pem)
        .status()
        .unwrap();
    assert!(status.success(), "mkfifo");
    let _unblock = UnblockFifo(pem);
    // several connections, spread so that the server checks its files between them
    for i in 0..5 {
        let der = tokio::time::timeout(HANG_GUARD, presented(addr, &ca))
            .await
            .unwrap_or_else(|_| panic!("hang guard: handshake {i} after the pipe stalled"));
        assert_eq!(
            der, first.der,
            "handshake {i}: the certificate loaded before"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let answered = tokio::time::timeout(HANG_GUARD, echo(&up))
        .await
        .expect("hang guard: the link up before");
    assert_eq!(answered, Bytes::from_static(b"still up"));
    let _ = std::fs::remove_dir_all(&dir);
}
