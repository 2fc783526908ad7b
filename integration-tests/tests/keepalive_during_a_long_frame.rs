//! Keepalive must not take a peer that is sending one long frame for dead. A 15 MiB request
//! crosses a proxy that lets 128 KiB through every 20 ms (about 2.5 s), while both ends ping
//! after 300 ms of silence and give up 1.5 s later: the server hears nothing whole for longer
//! than that, and the client's answer to its PING waits behind the request. Before bytes inside
//! a frame counted as hearing from the peer, the server closed the link mid-frame (seen on a
//! loaded new machine with a 4 GiB + 1 request and the default 30 s + 20 s: "Broken pipe");
//! a peer that reads PINGs and answers nothing is still closed (`server_limits.rs`).
//!
//! The proxy keeps its socket buffers small, so what it holds drains well within the timeout:
//! a PING written behind many MiB of buffered bytes cannot be answered in time by any peer,
//! and keepalive cannot tell that from a dead one.

use std::time::Duration;

use byteexpress_rpc::{Client, Config, Request, TransportPref};
use integration_tests::{ServerProc, pattern};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
const SLICE: usize = 128 * 1024;
const PAUSE: Duration = Duration::from_millis(20);
/// The proxy's socket buffers (bytes), each direction.
const PROXY_BUF: u32 = 64 * 1024;

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

fn small_buffers() -> TcpSocket {
    let s = TcpSocket::new_v4().unwrap();
    s.set_recv_buffer_size(PROXY_BUF).unwrap();
    s.set_send_buffer_size(PROXY_BUF).unwrap();
    s
}

async fn connect_small(target: &str) -> TcpStream {
    small_buffers()
        .connect(target.parse().unwrap())
        .await
        .unwrap()
}

/// A proxy to `target` that throttles both directions; returns its address.
async fn slow_proxy(target: String) -> String {
    let socket = small_buffers();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(16).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = connect_small(&target).await;
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
            "--keepalive-interval-ms",
            "300",
            "--keepalive-timeout-ms",
            "1500",
        ],
    )
    .await;
    let proxy = slow_proxy(server.addr.clone()).await;
    let cfg = Config {
        transport: TransportPref::Tcp,
        keepalive_interval: Duration::from_millis(300),
        keepalive_timeout: Duration::from_millis(1500),
        ..Config::default()
    };
    let client = Client::connect(&proxy, &cfg).await.expect("connect");
    let len = 15 << 20;
    let t0 = std::time::Instant::now();
    let r = client
        .call(Request {
            method: "/test.Test/Verify".into(),
            body: pattern(len),
            timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        })
        .await
        .expect("the slow 15 MiB call");
    assert_eq!(r.body, format!("ok {len}").as_bytes());
    // the premise: the frame took longer to cross than keepalive's interval + timeout
    assert!(
        t0.elapsed() > Duration::from_millis(1800),
        "the proxy did not slow the call: {:?}",
        t0.elapsed()
    );
}
