//! Issue 23, item 3 ("Lengths"): native calls over TCP with request bodies around 16 MiB, past
//! 1 GiB and past 4 GiB arrive whole (64-bit message lengths: the header's FLAG_LONG and the
//! TCP frame's escape), and a message over the receiver's `max_message` fails its own call
//! RESOURCE_EXHAUSTED while the link lives on.
//!
//! Memory: the 4 GiB + 1 request is held once by the client (the body it sends) and once by
//! the server (the frame it read), about 8.1 GiB at the peak, plus the client's 4 GiB while
//! the refusal test drains its request unbuffered on the server. The large cases run one at
//! a time ([`BIG`]); the whole file needs about 9 GiB of free memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use byteexpress_rpc::{
    Client, Code, Config, Metadata, Request, Response, Server, ServerRequest, Status, TransportPref,
};
use bytes::Bytes;

/// Serialises the tests of this file: each may hold several GiB.
static BIG: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

/// A TCP config whose messages may reach `max_message` bytes, with a memory budget to hold
/// one of them.
fn cfg(max_message: usize) -> Config {
    Config {
        transport: TransportPref::Tcp,
        max_message,
        memory_budget: max_message,
        ..Config::default()
    }
}

/// `len` bytes of a position-dependent pattern: 64-bit word `i` is `(i + 1) * 0x9E37...`, so
/// no two nearby words are equal and a moved, lost or repeated block changes the checksum.
fn pattern(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (i, w) in v.chunks_mut(8).enumerate() {
        let x = (i as u64 + 1)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .to_le_bytes();
        w.copy_from_slice(&x[..w.len()]);
    }
    v
}

/// A checksum that depends on every byte and its position: word `i` (little-endian, the last
/// one zero-padded) times `2i + 1`, summed mod 2^64, then mixed with the length.
fn checksum(b: &[u8]) -> u64 {
    let mut sum = 0u64;
    for (i, w) in b.chunks(8).enumerate() {
        let mut x = [0u8; 8];
        x[..w.len()].copy_from_slice(w);
        sum = sum.wrapping_add(u64::from_le_bytes(x).wrapping_mul(2 * i as u64 + 1));
    }
    sum ^ (b.len() as u64).rotate_left(32)
}

/// Starts a server answering `/t/Sum` with the request body's checksum (8 bytes LE) and
/// `/t/Echo` with the body itself and its checksum in metadata `sum`. Returns its address and
/// the count of connections it accepted.
async fn server(cfg: Config) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let handler = |req: ServerRequest| async move {
        let sum = checksum(&req.body);
        if req.method == "/t/Echo" {
            let mut metadata = Metadata::new();
            metadata.insert("sum", sum.to_string()).unwrap();
            return Ok::<_, Status>(Response {
                metadata,
                body: req.body,
            });
        }
        Ok(Response {
            metadata: Metadata::new(),
            body: Bytes::copy_from_slice(&sum.to_le_bytes()),
        })
    };
    let server = Arc::new(Server::new(handler, cfg));
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let server = server.clone();
            tokio::spawn(async move { server.serve_connection(stream).await });
        }
    });
    (addr, accepted)
}

fn request(method: &str, body: Bytes) -> Request {
    Request {
        method: method.into(),
        metadata: Metadata::new(),
        body,
        // a hang guard only
        timeout: Some(Duration::from_secs(600)),
    }
}

/// The server's checksum of `body`, sent to `/t/Sum`.
async fn remote_sum(c: &Client, body: Bytes) -> Result<u64, Status> {
    let r = c.call(request("/t/Sum", body)).await?;
    Ok(u64::from_le_bytes(r.body[..].try_into().expect("8 bytes")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_from_16_mib_to_past_4_gib_arrive_whole_over_tcp() {
    let _one_at_a_time = BIG.lock().await;
    let max = 4 * GIB + 64 * MIB;
    let (addr, accepted) = server(cfg(max)).await;
    let c = Client::connect_unshared(&addr, &cfg(max)).await.unwrap();
    assert_eq!(c.max_message(), max);
    // 16 MiB - 1, 16 MiB, 16 MiB + 1: echoed back whole, and summed
    for len in [16 * MIB - 1, 16 * MIB, 16 * MIB + 1] {
        let body = Bytes::from(pattern(len));
        let want = checksum(&body);
        let r = c.call(request("/t/Echo", body.clone())).await.unwrap();
        assert_eq!(r.body.len(), len);
        assert!(r.body == body, "{len}: echoed body differs");
        let sum = r.metadata.get("sum").map(|b| b.to_vec());
        assert_eq!(sum, Some(want.to_string().into_bytes()), "{len}");
    }
    // 1 GiB + 1 and 4 GiB + 1 (a body over u32::MAX: long header, escaped frame): summed
    for len in [GIB + 1, 4 * GIB + 1] {
        let body = Bytes::from(pattern(len));
        let want = checksum(&body);
        assert_eq!(remote_sum(&c, body).await.unwrap(), want, "{len}");
    }
    assert!(!c.is_closed());
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one link for every call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4_gib_message_over_the_peer_s_max_message_fails_its_call_and_the_link_lives_on() {
    let _one_at_a_time = BIG.lock().await;
    // the server accepts 64 MiB; the client would send up to 4 GiB + 64 MiB
    let (addr, accepted) = server(cfg(64 * MIB)).await;
    let c = Client::connect_unshared(&addr, &cfg(4 * GIB + 64 * MIB))
        .await
        .unwrap();
    let huge = Bytes::from(pattern(4 * GIB + 1));
    let err = remote_sum(&c, huge).await.unwrap_err();
    assert_eq!(err.code, Code::ResourceExhausted, "{err}");
    assert!(
        err.message.contains("exceeds"),
        "refused for its size: {err}"
    );
    let small = Bytes::from(pattern(MIB + 3));
    let want = checksum(&small);
    assert_eq!(remote_sum(&c, small).await.unwrap(), want);
    assert!(!c.is_closed());
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "the next call went on the same link"
    );
}

#[tokio::test]
async fn the_own_max_message_fails_a_call_before_sending() {
    let (addr, accepted) = server(cfg(64 * MIB)).await;
    let c = Client::connect_unshared(&addr, &cfg(64 * MIB))
        .await
        .unwrap();
    // zeroed pages, never touched: 4 GiB + 1 of address space only
    let huge = Bytes::from(vec![0u8; 4 * GIB + 1]);
    let err = remote_sum(&c, huge).await.unwrap_err();
    assert_eq!(err.code, Code::ResourceExhausted, "{err}");
    let small = Bytes::from(pattern(1000));
    let want = checksum(&small);
    assert_eq!(remote_sum(&c, small).await.unwrap(), want);
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}
