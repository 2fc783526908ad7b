//! A raw TCP peer that declares a 1 MiB frame, trickles one byte of it every 200 ms and answers
//! no PING is closed after keepalive's interval + timeout (or the idle timeout), as before bytes
//! inside a frame counted for keepalive: they count only per 64 KiB moved. A reviewer's probe
//! found it kept open for ever when every read counted (`keepalive_during_a_long_frame.rs`
//! pins the other side: a live slow frame is not closed).

use std::time::{Duration, Instant};

use byteexpress_rpc::TransportPref;
use integration_tests::ServerProc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");

async fn read_frame(raw: &mut tokio::net::tcp::OwnedReadHalf) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    raw.read_exact(&mut len).await.ok()?;
    let mut f = vec![0u8; u32::from_be_bytes(len) as usize];
    raw.read_exact(&mut f).await.ok()?;
    Some(f)
}

async fn raw_tcp_link(addr: &str) -> TcpStream {
    use byteexpress_rpc::wire::hello::Hello;
    let mut raw = TcpStream::connect(addr).await.unwrap();
    raw.write_all(&byteexpress_rpc::wire::CONN_MAGIC)
        .await
        .unwrap();
    let hello = Hello::Hello {
        version: byteexpress_rpc::wire::hello::HELLO_VERSION,
        pref: TransportPref::Tcp,
        nonce: 1,
        stream_window: 1 << 20,
        devices: vec![],
    }
    .encode();
    raw.write_all(&(hello.len() as u32).to_be_bytes())
        .await
        .unwrap();
    raw.write_all(&hello).await.unwrap();
    let mut len = [0u8; 4];
    raw.read_exact(&mut len).await.unwrap();
    let mut ack = vec![0u8; u32::from_be_bytes(len) as usize];
    raw.read_exact(&mut ack).await.unwrap();
    assert!(matches!(Hello::decode(&ack), Ok(Hello::HelloAck { .. })));
    let select = Hello::SelectTcp.encode();
    raw.write_all(&(select.len() as u32).to_be_bytes())
        .await
        .unwrap();
    raw.write_all(&select).await.unwrap();
    raw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_trickling_one_frame_and_answering_no_ping_is_closed() {
    let server = ServerProc::start(
        SERVER,
        &[
            "--keepalive-interval-ms",
            "500",
            "--keepalive-timeout-ms",
            "500",
            "--idle-timeout-ms",
            "1000",
        ],
    )
    .await;
    let raw = raw_tcp_link(&server.addr).await;
    let (mut r, mut w) = raw.into_split();
    let t0 = Instant::now();
    let reader = tokio::spawn(async move {
        let mut kinds = Vec::new();
        while let Some(f) = read_frame(&mut r).await {
            kinds.push(f[3]);
        }
        (kinds, t0.elapsed())
    });
    w.write_all(&(1u32 << 20).to_be_bytes()).await.unwrap();
    let bound = Duration::from_secs(6);
    while t0.elapsed() < bound && !reader.is_finished() {
        if w.write_all(&[0u8]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        reader.is_finished(),
        "a peer trickling 1 byte / 200 ms of a 1 MiB frame was still open after {bound:?} \
         (keepalive 500 + 500 ms, idle 1 s)"
    );
    let (kinds, _) = reader.await.unwrap();
    // the server asked (PING, kind 7) before it gave up
    assert!(
        kinds.contains(&7),
        "no PING before the close: frames {kinds:?}"
    );
}
