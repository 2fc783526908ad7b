//! Issue 24: on a TLS port nothing of ByteExpress set-up (HELLO_ACK, the devices' endpoints,
//! the soft device's socket name) reaches a client that has not finished the handshake: a
//! client that does not trust the server's CA, one that speaks plain TCP, and under mutual
//! TLS one without a certificate. Each test first has a client that does finish the
//! handshake receive the server's device info (the HELLO_ACK), then checks that the refused
//! one saw none of those bytes on its socket.

mod tls_common;

use byteexpress::{Certificate, ServerTlsConfig};
use byteexpress_rpc::wire::hello::Hello;
use rustls_pki_types::ServerName;
use tls_common::*;

/// Opens a TLS session with `client`, sends the preface and HELLO inside it, and returns the
/// server's devices from its HELLO_ACK (the positive control: what must not leak).
async fn devices_after_handshake(
    addr: std::net::SocketAddr,
    client: rustls::ClientConfig,
) -> Vec<Vec<u8>> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("handshake with a trusted server");
    write_ignoring_close(&mut tls, &preface_and_hello()).await;
    match Hello::decode(&read_frame(&mut tls).await).expect("a set-up message") {
        Hello::HelloAck { devices, .. } => devices,
        other => panic!("expected HELLO_ACK, got {other:?}"),
    }
}

/// The server's device info bytes (with the soft device's socket name): non-empty, or the
/// checks below would prove nothing.
async fn secret(addr: std::net::SocketAddr, client: rustls::ClientConfig) -> Vec<Vec<u8>> {
    let devices = devices_after_handshake(addr, client).await;
    assert!(
        !devices.is_empty() && devices.iter().all(|d| d.len() > 8),
        "the server offers at least the soft device: {devices:?}"
    );
    devices
}

fn assert_nothing_leaked(seen: &[u8], devices: &[Vec<u8>], who: &str) {
    for d in devices {
        assert!(
            !contains(seen, d),
            "{who}: the server's device info (socket name) came back on the socket"
        );
    }
    // only TLS records may have come back: content types 20..=23 with version 3.x
    let mut at = 0;
    while at + 5 <= seen.len() {
        let (ty, major) = (seen[at], seen[at + 1]);
        assert!(
            (20..=23).contains(&ty) && major == 3,
            "{who}: byte {at} of what came back is no TLS record header: {:02x?}",
            &seen[at..(at + 8).min(seen.len())]
        );
        at += 5 + u16::from_be_bytes([seen[at + 3], seen[at + 4]]) as usize;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_ca_gets_nothing_past_the_handshake() {
    let ca = Ca::new("test CA");
    let server = ca.leaf("server", 1);
    let addr = start_server(ServerTlsConfig::new().identity(server.identity())).await;
    let devices = secret(addr, rustls_client(Some(&ca.pem()), None)).await;

    // trusts another CA: its handshake fails; then it sends the preface and HELLO anyway
    let other = Ca::new("another CA");
    let mut raw = Recorded::connect(addr).await;
    let seen = raw.seen.clone();
    let r = tokio_rustls::TlsConnector::from(std::sync::Arc::new(rustls_client(
        Some(&other.pem()),
        None,
    )))
    .connect(ServerName::try_from("localhost").unwrap(), &mut raw)
    .await;
    assert!(
        r.is_err(),
        "a server signed by an untrusted CA was accepted"
    );
    write_ignoring_close(&mut raw, &preface_and_hello()).await;
    read_to_end(&mut raw).await;
    assert_nothing_leaked(&seen.lock().unwrap(), &devices, "client without the CA");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_tcp_client_gets_no_hello_answer_from_a_tls_port() {
    let ca = Ca::new("test CA");
    let server = ca.leaf("server", 1);
    let addr = start_server(ServerTlsConfig::new().identity(server.identity())).await;
    let devices = secret(addr, rustls_client(Some(&ca.pem()), None)).await;

    let mut raw = Recorded::connect(addr).await;
    write_ignoring_close(&mut raw, &preface_and_hello()).await;
    let seen = read_to_end(&mut raw).await;
    assert_nothing_leaked(&seen, &devices, "plain client");
    assert!(
        Hello::decode(seen.get(4..).unwrap_or_default()).is_err(),
        "a set-up message came back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_mutual_tls_a_client_without_a_certificate_gets_nothing_past_the_handshake() {
    let ca = Ca::new("test CA");
    let server = ca.leaf("server", 1);
    let client_ca = Ca::new("client CA");
    let client = client_ca.leaf("client", 2);
    let addr = start_server(
        ServerTlsConfig::new()
            .identity(server.identity())
            .client_ca_root(Certificate::from_pem(client_ca.pem())),
    )
    .await;
    // with its certificate, the client gets the HELLO_ACK
    let devices = secret(addr, rustls_client(Some(&ca.pem()), Some(&client))).await;

    // without one: under TLS 1.3 its side of the handshake may complete, and it sends the
    // preface and HELLO at once; the server refuses the handshake and answers nothing else
    let mut raw = Recorded::connect(addr).await;
    let seen = raw.seen.clone();
    let connected =
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(rustls_client(Some(&ca.pem()), None)))
            .connect(ServerName::try_from("localhost").unwrap(), &mut raw)
            .await;
    let plain = match connected {
        Ok(mut tls) => {
            write_ignoring_close(&mut tls, &preface_and_hello()).await;
            read_to_end(&mut tls).await
        }
        Err(_) => Vec::new(),
    };
    assert!(plain.is_empty(), "decrypted bytes came back: {plain:02x?}");
    read_to_end(&mut raw).await;
    assert_nothing_leaked(
        &seen.lock().unwrap(),
        &devices,
        "client without a certificate",
    );

    // and a certificate from a CA the server does not trust is refused the same way
    let stranger = Ca::new("stranger CA").leaf("client", 3);
    let mut raw = Recorded::connect(addr).await;
    let seen = raw.seen.clone();
    let connected = tokio_rustls::TlsConnector::from(std::sync::Arc::new(rustls_client(
        Some(&ca.pem()),
        Some(&stranger),
    )))
    .connect(ServerName::try_from("localhost").unwrap(), &mut raw)
    .await;
    if let Ok(mut tls) = connected {
        write_ignoring_close(&mut tls, &preface_and_hello()).await;
        assert!(read_to_end(&mut tls).await.is_empty());
    }
    read_to_end(&mut raw).await;
    assert_nothing_leaked(&seen.lock().unwrap(), &devices, "client of another CA");
}

/// A peer that opens a connection and never finishes the handshake (here: sends half a
/// ClientHello record header) is closed once `detect_timeout` has passed, having been sent
/// nothing; the server goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_never_finishes_is_closed_after_the_detect_timeout() {
    let ca = Ca::new("test CA");
    let addr = start_server_with(
        ServerTlsConfig::new().identity(ca.leaf("server", 1).identity()),
        byteexpress::Config {
            detect_timeout: std::time::Duration::from_millis(200),
            ..byteexpress::Config::default()
        },
    )
    .await;
    let mut raw = Recorded::connect(addr).await;
    write_ignoring_close(&mut raw, &[0x16, 0x03]).await;
    assert!(
        read_to_end(&mut raw).await.is_empty(),
        "the server sent bytes"
    );
    // and it still serves
    secret(addr, rustls_client(Some(&ca.pem()), None)).await;
}

/// A client that finishes the handshake choosing HTTP/2 by ALPN (or offering no ALPN at
/// all) and then sends nothing is closed once `detect_timeout` has passed, as on the plain
/// port: the HTTP/2 preface must follow the handshake within the same deadline, or the
/// silent session would hold a connection slot for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_after_an_h2_or_no_alpn_handshake_is_closed_after_the_detect_timeout() {
    let ca = Ca::new("test CA");
    let addr = start_server_with(
        ServerTlsConfig::new().identity(ca.leaf("server", 1).identity()),
        byteexpress::Config {
            detect_timeout: std::time::Duration::from_millis(200),
            ..byteexpress::Config::default()
        },
    )
    .await;
    for alpn in [vec![b"h2".to_vec()], Vec::new()] {
        let mut client = rustls_client(Some(&ca.pem()), None);
        client.alpn_protocols = alpn.clone();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .expect("handshake with a trusted server");
        // read_to_end's hang guard fails the test if the server keeps the session open
        let got = read_to_end(&mut tls).await;
        assert!(got.is_empty(), "ALPN {alpn:?}: the server sent {got:02x?}");
    }
    // and it still serves
    secret(addr, rustls_client(Some(&ca.pem()), None)).await;
}

/// `Server::serve_connection` and `serve_after_magic` of a server configured with TLS refuse a
/// plain TCP stream (closed, nothing sent) instead of serving it unencrypted: the caller
/// handed over a connection that skipped the handshake the config asks for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_server_refuses_a_plain_stream_handed_to_serve_connection_or_serve_after_magic() {
    let ca = Ca::new("test CA");
    let server = byteexpress_rpc::Server::new(
        integration_tests::test_service,
        byteexpress::Config::default(),
    )
    .with_tls(ServerTlsConfig::new().identity(ca.leaf("server", 1).identity()))
    .expect("TLS config loads");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    for after_magic in [false, true] {
        let mut raw = Recorded::connect(addr).await;
        let (accepted, _) = listener.accept().await.unwrap();
        let server = server.clone();
        let served = tokio::spawn(async move {
            if after_magic {
                server.serve_after_magic(accepted).await
            } else {
                server.serve_connection(accepted).await
            }
        });
        let mut hello = preface_and_hello();
        if after_magic {
            hello.drain(..byteexpress_rpc::CONN_MAGIC.len());
        }
        write_ignoring_close(&mut raw, &hello).await;
        let seen = read_to_end(&mut raw).await;
        assert!(
            seen.is_empty(),
            "after_magic {after_magic}: the server answered a plain stream: {seen:02x?}"
        );
        let r = tokio::time::timeout(HANG_GUARD, served)
            .await
            .expect("hang guard")
            .unwrap();
        assert!(r.is_err(), "after_magic {after_magic}: served");
    }
}
