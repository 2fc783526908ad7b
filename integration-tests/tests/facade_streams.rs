//! Issue 21: gRPC streams through `byteexpress::Channel` (soft RDMA and TCP): messages as they
//! are sent both ways, initial metadata first, trailers after the messages, cancellation,
//! per-stream windows, health Watch, compression and message limits. Server and client in
//! one process; synchronised by the messages themselves and polled counters, never sleeps.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use byteexpress::{Channel, Config, Server, Transport, TransportPref};
use byteexpress_ps::pb::streams::streams_client::StreamsClient;
use byteexpress_ps::pb::streams::streams_server::{Streams, StreamsServer};
use byteexpress_ps::pb::streams::{Msg, ProduceRequest};
use bytes::Bytes;
use futures::Stream;
use tokio::sync::Semaphore;
use tonic::codec::CompressionEncoding;
use tonic::{Code, Request, Response, Status, Streaming};

const BOUND: Duration = Duration::from_secs(10);

struct Counters {
    produced: AtomicU64,
    dropped: AtomicU64,
    gate: Semaphore,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            produced: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            gate: Semaphore::new(0),
        }
    }
}

#[derive(Clone, Default)]
struct Svc(Arc<Counters>);

/// Counts a producer's stream dropped (its handler cancelled).
struct DropCount(Arc<Counters>);
impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

type Out = Pin<Box<dyn Stream<Item = Result<Msg, Status>> + Send>>;

#[tonic::async_trait]
impl Streams for Svc {
    type PingPongStream = Out;
    type ProduceStream = Out;

    async fn ping_pong(&self, req: Request<Streaming<Msg>>) -> Result<Response<Out>, Status> {
        let big: Option<usize> = req
            .metadata()
            .get("x-big")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let mut resp = Response::new(Box::pin(req.into_inner()) as Out);
        resp.metadata_mut()
            .insert("x-initial", "before-any-message".parse().unwrap());
        if let Some(n) = big {
            resp.metadata_mut()
                .insert("x-big", "h".repeat(n).parse().unwrap());
        }
        Ok(resp)
    }

    async fn produce(&self, req: Request<ProduceRequest>) -> Result<Response<Out>, Status> {
        let r = req.into_inner();
        let c = self.0.clone();
        let guard = DropCount(c.clone());
        let s = futures::stream::unfold((0u64, guard), move |(i, guard)| {
            let c = guard.0.clone();
            async move {
                if i == r.count {
                    if r.fail_code != 0 {
                        let st = Status::with_details(
                            Code::from_i32(r.fail_code),
                            "failed after its messages",
                            Bytes::from_static(b"\x01details"),
                        );
                        return Some((Err(st), (i + 1, guard)));
                    }
                    return None;
                }
                if i > r.count {
                    return None;
                }
                if i > 0 && r.gate {
                    c.gate.acquire().await.unwrap().forget();
                }
                c.produced.fetch_add(1, Ordering::SeqCst);
                let msg = Msg {
                    seq: i,
                    payload: Bytes::from(vec![7u8; r.size as usize]),
                };
                Some((Ok(msg), (i + 1, guard)))
            }
        });
        let _ = c;
        Ok(Response::new(Box::pin(s) as Out))
    }

    async fn collect(&self, req: Request<Streaming<Msg>>) -> Result<Response<Msg>, Status> {
        let mut s = req.into_inner();
        let (mut n, mut bytes) = (0u64, 0usize);
        while let Some(m) = s.message().await? {
            n += 1;
            bytes += m.payload.len();
        }
        Ok(Response::new(Msg {
            seq: n,
            payload: Bytes::from(bytes.to_string()),
        }))
    }
}

async fn serve(svc: Svc, cfg: Config, gzip_only: bool) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut server = StreamsServer::new(svc)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip);
    if !gzip_only {
        server = server
            .accept_compressed(CompressionEncoding::Zstd)
            .send_compressed(CompressionEncoding::Zstd);
    }
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("watched", tonic_health::ServingStatus::Serving)
        .await;
    REPORTER.lock().unwrap().push((addr, reporter));
    tokio::spawn(
        Server::builder()
            .config(Config {
                transport: TransportPref::Auto,
                ..cfg
            })
            .add_service(server)
            .add_service(health)
            .serve_with_listener(listener),
    );
    addr
}

static REPORTER: std::sync::Mutex<
    Vec<(std::net::SocketAddr, tonic_health::server::HealthReporter)>,
> = std::sync::Mutex::new(Vec::new());

async fn channel(addr: std::net::SocketAddr, t: TransportPref, cfg: Config) -> Channel {
    let ch = Channel::connect_with(
        &format!("bx://{addr}"),
        &Config {
            transport: t,
            ..cfg
        },
    )
    .await
    .expect("connect");
    let want = if t == TransportPref::Rdma {
        integration_tests::rdma_here()
    } else {
        Transport::Tcp
    };
    assert_eq!(ch.transport(), want);
    ch
}

const BOTH: [TransportPref; 2] = [TransportPref::Rdma, TransportPref::Tcp];

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {BOUND:?}"))
}

/// Polls `f` until it holds, for at most 5 s.
async fn poll_until(what: &str, f: impl Fn() -> bool) {
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(tokio::time::Instant::now() < end, "{what}: not within 5 s");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidi_ping_pong_of_100_alternating_messages_with_initial_metadata_first() {
    let addr = serve(Svc::default(), Config::default(), false).await;
    for t in BOTH {
        let mut client = StreamsClient::new(channel(addr, t, Config::default()).await);
        let (tx, rx) = futures::channel::mpsc::unbounded::<Msg>();
        // no message sent yet: the answer's headers come first
        let resp = within("headers before any message", client.ping_pong(rx))
            .await
            .expect("ping_pong");
        assert_eq!(
            resp.metadata().get("x-initial").unwrap(),
            "before-any-message"
        );
        let mut answers = resp.into_inner();
        for i in 0..100u64 {
            tx.unbounded_send(Msg {
                seq: i,
                payload: Bytes::from(vec![i as u8; (i as usize) * 100]),
            })
            .unwrap();
            let got = within("pong", answers.message())
                .await
                .expect("pong")
                .expect("a message");
            assert_eq!(got.seq, i, "{t:?}");
            assert_eq!(got.payload.len(), i as usize * 100);
        }
        drop(tx);
        assert!(within("end", answers.message()).await.unwrap().is_none());
    }
}

/// Initial metadata of 100 KiB (several RDMA chunks) with the first message already waiting:
/// the headers still reach the client whole, before the message (they used to be overtaken
/// on RDMA and lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_metadata_larger_than_a_chunk_is_not_overtaken_by_the_first_message() {
    let big = 100usize << 10;
    let addr = serve(Svc::default(), Config::default(), false).await;
    for t in BOTH {
        let mut client = StreamsClient::new(channel(addr, t, Config::default()).await);
        for round in 0..10u64 {
            let (tx, rx) = futures::channel::mpsc::unbounded::<Msg>();
            // the first message is there before the call, so the server echoes it right after
            // its headers
            tx.unbounded_send(Msg {
                seq: round,
                payload: Bytes::from_static(b"first"),
            })
            .unwrap();
            let mut req = Request::new(rx);
            req.metadata_mut()
                .insert("x-big", big.to_string().parse().unwrap());
            let resp = within("headers", client.ping_pong(req))
                .await
                .expect("ping_pong");
            let h = resp.metadata().get("x-big").unwrap_or_else(|| {
                panic!(
                    "{t:?} round {round}: initial metadata lost: {:?}",
                    resp.metadata()
                )
            });
            assert_eq!(h.len(), big);
            let mut answers = resp.into_inner();
            let got = within("first", answers.message())
                .await
                .expect("first")
                .expect("a message");
            assert_eq!((got.seq, &got.payload[..]), (round, &b"first"[..]), "{t:?}");
            drop(tx);
            assert!(within("end", answers.message()).await.unwrap().is_none());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stream_first_message_arrives_before_the_second_is_sent() {
    let svc = Svc::default();
    let c = svc.0.clone();
    let addr = serve(svc, Config::default(), false).await;
    for t in BOTH {
        c.produced.store(0, Ordering::SeqCst);
        let mut client = StreamsClient::new(channel(addr, t, Config::default()).await);
        let mut s = within(
            "call",
            client.produce(ProduceRequest {
                count: 4,
                size: 10,
                fail_code: 0,
                gate: true,
            }),
        )
        .await
        .unwrap()
        .into_inner();
        for i in 0..4u64 {
            let m = within("message", s.message()).await.unwrap().unwrap();
            assert_eq!(m.seq, i);
            // the handler has produced exactly this message: the next waits for the gate
            assert_eq!(c.produced.load(Ordering::SeqCst), i + 1, "{t:?}");
            if i < 3 {
                c.gate.add_permits(1);
            }
        }
        assert!(within("end", s.message()).await.unwrap().is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_after_n_messages_delivers_the_n_messages_then_the_status_with_details() {
    let addr = serve(Svc::default(), Config::default(), false).await;
    for t in BOTH {
        let mut client = StreamsClient::new(channel(addr, t, Config::default()).await);
        let mut s = client
            .produce(ProduceRequest {
                count: 3,
                size: 100_000,
                fail_code: Code::FailedPrecondition as i32,
                gate: false,
            })
            .await
            .unwrap()
            .into_inner();
        for i in 0..3 {
            let m = within("message", s.message()).await.unwrap().unwrap();
            assert_eq!(m.seq, i, "{t:?}");
        }
        let err = within("status", s.message()).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{t:?}: {err:?}");
        assert_eq!(err.message(), "failed after its messages");
        assert_eq!(err.details(), b"\x01details");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_cancellation_drops_the_server_handler() {
    let svc = Svc::default();
    let c = svc.0.clone();
    let addr = serve(svc, Config::default(), false).await;
    for t in BOTH {
        let before = c.dropped.load(Ordering::SeqCst);
        let mut client = StreamsClient::new(channel(addr, t, Config::default()).await);
        let mut s = client
            .produce(ProduceRequest {
                count: u64::MAX - 1,
                size: 10,
                fail_code: 0,
                gate: true,
            })
            .await
            .unwrap()
            .into_inner();
        within("first", s.message()).await.unwrap().unwrap();
        assert_eq!(c.dropped.load(Ordering::SeqCst), before, "still running");
        drop(s);
        poll_until("server handler dropped", || {
            c.dropped.load(Ordering::SeqCst) == before + 1
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_bounds_the_whole_stream() {
    let svc = Svc::default();
    let c = svc.0.clone();
    let addr = serve(svc, Config::default(), false).await;
    for t in BOTH {
        let before = c.dropped.load(Ordering::SeqCst);
        let mut client = StreamsClient::new(channel(addr, t, Config::default()).await);
        let mut req = Request::new(ProduceRequest {
            count: 10,
            size: 10,
            fail_code: 0,
            gate: true,
        });
        req.set_timeout(Duration::from_millis(300));
        let mut s = client.produce(req).await.unwrap().into_inner();
        within("first", s.message()).await.unwrap().unwrap();
        let err = within("deadline", s.message()).await.unwrap_err();
        assert_eq!(err.code(), Code::DeadlineExceeded, "{t:?}: {err:?}");
        poll_until("server handler dropped at the deadline", || {
            c.dropped.load(Ordering::SeqCst) > before
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_stream_holds_the_server_at_the_window_while_a_unary_call_completes() {
    let svc = Svc::default();
    let c = svc.0.clone();
    let window = 1u64 << 20;
    let size = 64u64 << 10;
    let addr = serve(svc, Config::default(), false).await;
    for t in BOTH {
        c.produced.store(0, Ordering::SeqCst);
        let ch = channel(addr, t, Config::default()).await;
        let mut client = StreamsClient::new(ch.clone());
        let unread = client
            .produce(ProduceRequest {
                count: 1000,
                size,
                fail_code: 0,
                gate: false,
            })
            .await
            .unwrap()
            .into_inner();
        let at_window = window / (size + 50);
        poll_until("server fills the window", || {
            c.produced.load(Ordering::SeqCst) >= at_window
        })
        .await;
        // a call on the same link completes while the stream is stuck
        let (tx, rx) = futures::channel::mpsc::unbounded::<Msg>();
        for i in 0..3 {
            tx.unbounded_send(Msg {
                seq: i,
                payload: Bytes::from_static(b"abc"),
            })
            .unwrap();
        }
        drop(tx);
        let got = within("call beside an unread stream", client.collect(rx))
            .await
            .expect("collect")
            .into_inner();
        assert_eq!(got.seq, 3);
        let produced = c.produced.load(Ordering::SeqCst);
        // the window, plus the messages held by tonic's encoder and the handler's loop
        assert!(
            produced <= at_window + 4,
            "{t:?}: {produced} messages of {size} bytes produced into a window of {window}"
        );
        drop(unread);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watch_delivers_the_initial_status_and_a_later_change() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let addr = serve(Svc::default(), Config::default(), false).await;
    let reporter = REPORTER
        .lock()
        .unwrap()
        .iter()
        .find(|(a, _)| *a == addr)
        .unwrap()
        .1
        .clone();
    for t in BOTH {
        reporter
            .set_service_status("watched", tonic_health::ServingStatus::Serving)
            .await;
        let mut client = HealthClient::new(channel(addr, t, Config::default()).await);
        let mut w = within(
            "watch",
            client.watch(HealthCheckRequest {
                service: "watched".into(),
            }),
        )
        .await
        .unwrap()
        .into_inner();
        let first = within("initial", w.message()).await.unwrap().unwrap();
        assert_eq!(first.status, 1, "SERVING");
        reporter
            .set_service_status("watched", tonic_health::ServingStatus::NotServing)
            .await;
        let next = within("change", w.message()).await.unwrap().unwrap();
        assert_eq!(next.status, 2, "NOT_SERVING");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_and_zstd_both_ways_and_an_unknown_encoding_is_unimplemented() {
    let addr = serve(Svc::default(), Config::default(), false).await;
    let gzip_only = serve(Svc::default(), Config::default(), true).await;
    for t in BOTH {
        for enc in [CompressionEncoding::Gzip, CompressionEncoding::Zstd] {
            let mut client = StreamsClient::new(channel(addr, t, Config::default()).await)
                .send_compressed(enc)
                .accept_compressed(enc);
            let (tx, rx) = futures::channel::mpsc::unbounded::<Msg>();
            let resp = client.ping_pong(rx).await.unwrap();
            let mut answers = resp.into_inner();
            for i in 0..3u64 {
                tx.unbounded_send(Msg {
                    seq: i,
                    payload: Bytes::from(vec![b'z'; 10_000]),
                })
                .unwrap();
                let m = within("compressed pong", answers.message())
                    .await
                    .unwrap_or_else(|e| panic!("{t:?} {enc:?}: {e:?}"))
                    .unwrap();
                assert_eq!(m.payload.len(), 10_000);
            }
            drop(tx);
        }
        let mut client = StreamsClient::new(channel(gzip_only, t, Config::default()).await)
            .send_compressed(CompressionEncoding::Zstd);
        let (tx, rx) = futures::channel::mpsc::unbounded::<Msg>();
        tx.unbounded_send(Msg::default()).unwrap();
        drop(tx);
        let err = within("unknown encoding", client.collect(rx))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unimplemented, "{t:?}: {err:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_up_to_16_mib_pass_with_limits_raised_and_one_above_the_limit_fails_alone() {
    let cfg = Config {
        max_message: 32 << 20,
        ..Config::default()
    };
    let addr = serve(Svc::default(), cfg.clone(), false).await;
    for t in BOTH {
        let ch = channel(addr, t, cfg.clone()).await;
        let mut client = StreamsClient::new(ch.clone())
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        let sizes = [
            0usize,
            1,
            (64 << 10) - 1,
            64 << 10,
            (64 << 10) + 1,
            (4 << 20) - 1,
            4 << 20,
            (4 << 20) + 1,
            (16 << 20) - 1,
            16 << 20,
            (16 << 20) + 1,
        ];
        let (tx, rx) = futures::channel::mpsc::unbounded::<Msg>();
        let mut answers = client.ping_pong(rx).await.unwrap().into_inner();
        for (i, &n) in sizes.iter().enumerate() {
            tx.unbounded_send(Msg {
                seq: i as u64,
                payload: Bytes::from(vec![(i as u8).wrapping_add(1); n]),
            })
            .unwrap();
            let m = within("sized pong", answers.message())
                .await
                .unwrap_or_else(|e| panic!("{t:?} size {n}: {e:?}"))
                .unwrap();
            assert_eq!(m.payload.len(), n, "{t:?}");
            assert!(m.payload.iter().all(|&b| b == (i as u8).wrapping_add(1)));
        }
        drop(tx);
        // above the link's max_message: RESOURCE_EXHAUSTED for this call only (at the call or
        // at its first message, as the status reaches tonic before or after the headers)
        let over = client
            .produce(ProduceRequest {
                count: 1,
                size: (32 << 20) + 1,
                fail_code: 0,
                gate: false,
            })
            .await;
        let err = match over {
            Err(e) => e,
            Ok(r) => within("over max_message", r.into_inner().message())
                .await
                .unwrap_err(),
        };
        assert_eq!(err.code(), Code::ResourceExhausted, "{t:?}: {err:?}");
        // tonic's default decode limit (4 MiB) on this client: the answer above it fails its
        // own call as tonic fails it over HTTP/2 (OUT_OF_RANGE), and the next call on the
        // channel works
        let mut small = StreamsClient::new(ch.clone());
        let mut s = small
            .produce(ProduceRequest {
                count: 1,
                size: (4 << 20) + 1,
                fail_code: 0,
                gate: false,
            })
            .await
            .unwrap()
            .into_inner();
        let err = within("over the limit", s.message()).await.unwrap_err();
        assert_eq!(err.code(), Code::OutOfRange, "{t:?}: {err:?}");
        assert!(err.message().contains("too large"), "{err:?}");
        let mut s = small
            .produce(ProduceRequest {
                count: 1,
                size: 1000,
                fail_code: 0,
                gate: false,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            within("next call", s.message())
                .await
                .unwrap()
                .unwrap()
                .payload
                .len(),
            1000
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_stream_whose_large_first_message_is_overtaken_by_later_small_ones_is_whole() {
    let addr = serve(Svc::default(), Config::default(), false).await;
    for t in BOTH {
        let mut client = StreamsClient::new(channel(addr, t, Config::default()).await);
        for round in 0..5 {
            // all queued before the call: the opening frame carries the 200 KiB message (four
            // chunks on RDMA), the small ones and the half-close are one chunk each
            let (tx, rx) = futures::channel::mpsc::unbounded::<Msg>();
            tx.unbounded_send(Msg {
                seq: 0,
                payload: Bytes::from(vec![1u8; 200 << 10]),
            })
            .unwrap();
            for i in 1..4 {
                tx.unbounded_send(Msg {
                    seq: i,
                    payload: Bytes::from_static(b"x"),
                })
                .unwrap();
            }
            drop(tx);
            let got = within("collect", client.collect(rx))
                .await
                .unwrap_or_else(|e| panic!("{t:?} round {round}: {e:?}"))
                .into_inner();
            assert_eq!(got.seq, 4, "{t:?} round {round}");
            assert_eq!(got.payload, ((200 << 10) + 3).to_string(), "{t:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_channel_over_replicas_streams_too_and_cancels_on_drop() {
    let svc = Svc::default();
    let c = svc.0.clone();
    let addr = serve(svc, Config::default(), false).await;
    for t in BOTH {
        let ch = Channel::connect_lazy_with(
            &format!("bx://{addr}"),
            &Config {
                transport: t,
                ..Config::default()
            },
            &byteexpress::BalanceConfig::default(),
        )
        .unwrap();
        let mut client = StreamsClient::new(ch.clone());
        let (tx, rx) = futures::channel::mpsc::unbounded::<Msg>();
        let resp = within("headers", client.ping_pong(rx)).await.unwrap();
        let mut answers = resp.into_inner();
        for i in 0..10u64 {
            tx.unbounded_send(Msg {
                seq: i,
                payload: Bytes::new(),
            })
            .unwrap();
            let m = within("pong", answers.message()).await.unwrap().unwrap();
            assert_eq!(m.seq, i, "{t:?}");
        }
        drop(tx);
        assert!(within("end", answers.message()).await.unwrap().is_none());
        let before = c.dropped.load(Ordering::SeqCst);
        let mut s = client
            .produce(ProduceRequest {
                count: 100,
                size: 1,
                fail_code: 0,
                gate: true,
            })
            .await
            .unwrap()
            .into_inner();
        within("first", s.message()).await.unwrap().unwrap();
        drop(s);
        poll_until("handler dropped", || {
            c.dropped.load(Ordering::SeqCst) == before + 1
        })
        .await;
        let stats = ch.replica_set().unwrap().endpoints();
        assert_eq!(
            stats[0].outstanding, 0,
            "{t:?}: streams no longer outstanding"
        );
    }
}

/// A server-streaming answer from a native handler that never sends initial metadata (or a
/// peer that skips it): the facade streams it from the second message on instead of holding
/// every message until the end (before, nothing reached the tonic client until the handler
/// ended, and a peer could grow the client's memory without bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_initial_metadata_is_delivered_as_sent_not_held_to_its_end() {
    use byteexpress_rpc::stream::{RequestReceiver, ResponseSender, StreamRequest};
    fn framed(seq: u64) -> Bytes {
        let m = prost::Message::encode_to_vec(&Msg {
            seq,
            payload: Bytes::new(),
        });
        let mut out = vec![0u8];
        out.extend_from_slice(&(m.len() as u32).to_be_bytes());
        out.extend_from_slice(&m);
        out.into()
    }
    for t in BOTH {
        let gate = Arc::new(Semaphore::new(0));
        let g = gate.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = byteexpress_rpc::Server::new(
            |_req: byteexpress_rpc::ServerRequest| async move {
                Err(byteexpress_rpc::Status::new(
                    byteexpress_rpc::Code::Unimplemented,
                    "streams only",
                ))
            },
            Config::default(),
        )
        .with_streams(
            move |_req: StreamRequest, _rx: RequestReceiver, mut tx: ResponseSender| {
                let g = g.clone();
                async move {
                    tx.send(framed(1)).await?;
                    tx.send(framed(2)).await?;
                    g.acquire().await.unwrap().forget();
                    tx.send(framed(3)).await?;
                    let mut md = byteexpress_rpc::Metadata::new();
                    md.insert("grpc-status", Bytes::from_static(b"0")).unwrap();
                    Ok(md)
                }
            },
        );
        tokio::spawn(server.serve(listener));
        let mut client = StreamsClient::new(channel(addr, t, Config::default()).await);
        let mut s = within(
            "the answer's headers",
            client.produce(ProduceRequest::default()),
        )
        .await
        .expect("produce")
        .into_inner();
        for want in [1, 2] {
            let m = within("a message sent before the gate", s.message())
                .await
                .expect("message")
                .expect("not the end");
            assert_eq!(m.seq, want, "{t:?}");
        }
        gate.add_permits(1);
        let m = within("the last message", s.message())
            .await
            .expect("message")
            .expect("not the end");
        assert_eq!(m.seq, 3, "{t:?}");
        assert!(
            within("the end", s.message()).await.expect("end").is_none(),
            "{t:?}"
        );
    }
}

/// A Streams service whose Collect never answers (a stalled replica): counts the handlers
/// started and dropped.
#[derive(Clone, Default)]
struct StalledCollect(Arc<(AtomicU64, AtomicU64)>);

/// Counts a stalled handler dropped (the server stopped it).
struct StalledDrop(Arc<(AtomicU64, AtomicU64)>);
impl Drop for StalledDrop {
    fn drop(&mut self) {
        self.0.1.fetch_add(1, Ordering::SeqCst);
    }
}

#[tonic::async_trait]
impl Streams for StalledCollect {
    type PingPongStream = Out;
    type ProduceStream = Out;

    async fn ping_pong(&self, _: Request<Streaming<Msg>>) -> Result<Response<Out>, Status> {
        Err(Status::unimplemented("stalled replica"))
    }

    async fn produce(&self, _: Request<ProduceRequest>) -> Result<Response<Out>, Status> {
        Err(Status::unimplemented("stalled replica"))
    }

    async fn collect(&self, _: Request<Streaming<Msg>>) -> Result<Response<Msg>, Status> {
        self.0.0.fetch_add(1, Ordering::SeqCst);
        let _end = StalledDrop(self.0.clone());
        std::future::pending().await
    }
}

/// A6's hedging of a client-streaming call through the facade: over three replicas (round
/// robin), one of which stalls in Collect, every Collect completes from a healthy replica,
/// and each attempt the stalled replica got is cancelled (its handler dropped). Fails when
/// hedged streams commit at open: the call stays on the stalled replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_collect_completes_past_a_stalled_replica_whose_attempt_is_cancelled() {
    use byteexpress_rpc::{BalanceConfig, Policy, ServiceConfig};
    let healthy_a = serve(Svc::default(), Config::default(), false).await;
    let stalled = StalledCollect::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stalled_addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .add_service(StreamsServer::new(stalled.clone()))
            .serve_with_listener(listener),
    );
    let healthy_b = serve(Svc::default(), Config::default(), false).await;
    let uris = [healthy_a, stalled_addr, healthy_b].map(|a| format!("bx://{a}"));
    let bal = BalanceConfig {
        policy: Policy::RoundRobin,
        ..BalanceConfig::default()
    };
    let sc = ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{"service": "streams.Streams"}],
            "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.05s",
                              "nonFatalStatusCodes": ["UNAVAILABLE"]}}]}"#,
    )
    .unwrap();
    let ch = Channel::balance_list(&uris, &Config::default(), &bal)
        .unwrap()
        .with_service_config(sc)
        .unwrap();
    let set = ch.replica_set().unwrap().clone();
    set.connect_now();
    within("all three ready", async {
        loop {
            let changed = set.changed();
            if set
                .endpoints()
                .iter()
                .all(|e| e.state == byteexpress_rpc::balance::EndpointState::Ready)
            {
                return;
            }
            changed.await;
        }
    })
    .await;
    let mut client = StreamsClient::new(ch.clone());
    // round robin: one of three calls opens its first attempt on the stalled replica; a
    // slow host (the VM) may answer a call before its hedge reaches the stalled replica's
    // handler, so calls go on (at most 12) until that handler has started once
    for i in 0..12 {
        if i >= 3 && stalled.0.0.load(Ordering::SeqCst) >= 1 {
            break;
        }
        let msg = |seq| Msg {
            seq,
            payload: Bytes::from_static(b"xyz"),
        };
        // the second message only once the call's first attempt started, so that the call
        // opens with its request incomplete (a body complete at once opens half-closed)
        let before = ch.retry_stats().attempts;
        let stats = ch.clone();
        let second = futures::stream::once(async move {
            while stats.retry_stats().attempts == before {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            msg(1)
        });
        use futures::StreamExt;
        let msgs = futures::stream::iter([msg(0)]).chain(second);
        let got = within("a Collect past the stalled replica", async {
            let mut req = Request::new(msgs);
            req.set_timeout(Duration::from_secs(30));
            client.collect(req).await
        })
        .await
        .expect("answered by a healthy replica")
        .into_inner();
        assert_eq!((got.seq, &got.payload[..]), (2, &b"6"[..]));
    }
    let started = stalled.0.0.load(Ordering::SeqCst);
    assert!(started >= 1, "the stalled replica got no attempt");
    poll_until("the stalled replica's handlers dropped", || {
        stalled.0.1.load(Ordering::SeqCst) >= started
    })
    .await;
    assert!(ch.retry_stats().hedges >= 1, "{:?}", ch.retry_stats());
}
