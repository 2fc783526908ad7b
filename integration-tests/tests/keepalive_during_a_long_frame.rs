//! Keepalive must not take a peer that is sending one long frame for dead. A 32 MiB request
//! and its echo cross a proxy that lets 256 KiB through every 20 ms (about 2.6 s each way),
//! while both ends ping after 400 ms of silence and give up 400 ms later. Before bytes inside a frame counted
//! as hearing from the peer, the server closed the link mid-frame and the call failed with
//! "Broken pipe" (seen on a loaded new machine with a 4 GiB + 1 frame and the default 30 s +
//! 20 s); a peer that really stops is still closed (`server_limits.rs`).

use std::time::Duration;

use byteexpress_rpc::{Client, Config, Request, TransportPref};
use integration_tests::{ServerProc, check_pattern, pattern};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
const SLICE: usize = 256 * 1024;
const PAUSE: Duration = Duration::from_millis(20);

/// Copies `from` to `to`, at most [`SLICE`] bytes every [`PAUSE`].
async fn throttled(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
) {
    let mut buf = vec![0u8; SLICE];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
        tokio::time::sleep(PAUSE).await;
    }
    let _ = to.shutdown().await;
}

/// A proxy to `target` that throttles both directions; returns its address.
async fn slow_proxy(target: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = TcpStream::connect(&target).await.unwrap();
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::spawn(throttled(cr, sw));
            tokio::spawn(throttled(sr, cw));
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_sending_one_long_frame_slowly_is_not_taken_for_dead() {
    let server = ServerProc::start(
        SERVER,
        &[
            "--transport",
            "tcp",
            "--max-message-mib",
            "64",
            "--keepalive-interval-ms",
            "400",
            "--keepalive-timeout-ms",
            "400",
        ],
    )
    .await;
    let proxy = slow_proxy(server.addr.clone()).await;
    let cfg = Config {
        transport: TransportPref::Tcp,
        max_message: 64 << 20,
        keepalive_interval: Duration::from_millis(400),
        keepalive_timeout: Duration::from_millis(400),
        ..Config::default()
    };
    let client = Client::connect(&proxy, &cfg).await.expect("connect");
    let body = pattern(32 << 20);
    let t0 = std::time::Instant::now();
    let r = client
        .call(Request {
            method: "/test.Test/Echo".into(),
            body: body.clone(),
            timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        })
        .await
        .expect("the slow 32 MiB call");
    assert_eq!(r.body.len(), body.len());
    assert_eq!(check_pattern(&r.body), Ok(()));
    // the premise: each frame took longer to cross than keepalive's interval + timeout
    assert!(
        t0.elapsed() > Duration::from_millis(1600),
        "the proxy did not slow the call: {:?}",
        t0.elapsed()
    );
}
