//! Issue 19 through the native API, server and client in one process: a client-streaming call
//! under a retry policy is replayed until it commits (its request messages sent again on the
//! next attempt), and commits without a retry once its buffered request passes A6's per-RPC
//! buffer limit; a draining server refuses new calls before dispatch and lets running ones
//! finish.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use byteexpress_rpc::retry::PER_RPC_BUFFER_LIMIT;
use byteexpress_rpc::stream::{OpenStream, RequestReceiver, ResponseSender, StreamRequest};
use byteexpress_rpc::{
    Client, Code, Config, Metadata, Response, Server, ServerRequest, ServiceConfig, Status,
};
use bytes::Bytes;

const POLICY: &str = r#"{"methodConfig": [{"name": [{"service": "t.T"}],
   "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
                   "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#;

/// Collect: reads every request message, then fails UNAVAILABLE on the first `fail` attempts
/// and answers the concatenation of the messages on the later ones.
async fn collect(
    attempts: Arc<AtomicU64>,
    fail: u64,
    mut rx: RequestReceiver,
    mut tx: ResponseSender,
) -> Result<Metadata, Status> {
    let n = attempts.fetch_add(1, Ordering::SeqCst);
    let mut all = Vec::new();
    while let Some(m) = rx.message().await? {
        all.extend_from_slice(&m);
    }
    if n < fail {
        return Err(Status::new(Code::Unavailable, "fail on purpose"));
    }
    tx.send_last(Bytes::from(all));
    Ok(Metadata::new())
}

async fn server(fail: u64) -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let attempts = Arc::new(AtomicU64::new(0));
    let a = attempts.clone();
    let unary = |_req: ServerRequest| async { Ok::<_, Status>(Response::default()) };
    let server = Server::new(unary, Config::default()).with_streams(
        move |_req: StreamRequest, rx: RequestReceiver, tx: ResponseSender| {
            collect(a.clone(), fail, rx, tx)
        },
    );
    tokio::spawn(server.serve(listener));
    (addr, attempts)
}

fn open() -> OpenStream {
    OpenStream {
        method: "/t.T/Collect".into(),
        metadata: Metadata::new(),
        timeout: Some(Duration::from_secs(10)),
        first: Some(Bytes::from_static(b"a")),
        half_close: false,
    }
}

/// A client of its own link to `addr` with [`POLICY`].
async fn client_with_policy(addr: &str) -> Client {
    Client::connect_unshared(addr, &Config::default())
        .await
        .unwrap()
        .with_service_config(ServiceConfig::from_json(POLICY).unwrap())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stream_is_replayed_whole_on_each_retry_until_it_succeeds() {
    let (addr, attempts) = server(2).await;
    let c = client_with_policy(&addr).await;
    let (mut tx, mut rx) = c.open_stream(open()).await.unwrap();
    for m in [b"b", b"c", b"d"] {
        tx.send(Bytes::from_static(m)).await.unwrap();
    }
    tx.finish().unwrap();
    let got = rx.message().await.expect("the third attempt succeeds");
    assert_eq!(got.as_deref(), Some(&b"abcd"[..]));
    assert_eq!(rx.message().await.unwrap(), None);
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    let st = c.retry_stats();
    assert_eq!(
        (st.retries, st.commits, st.buffer_commits),
        (2, 1, 0),
        "{st:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stream_past_the_buffer_limit_commits_and_is_not_retried() {
    let (addr, attempts) = server(1).await;
    let c = client_with_policy(&addr).await;
    let (mut tx, mut rx) = c.open_stream(open()).await.unwrap();
    let chunk = Bytes::from(vec![7u8; 32 << 10]);
    for _ in 0..(PER_RPC_BUFFER_LIMIT / chunk.len() + 1) {
        tx.send(chunk.clone()).await.unwrap();
    }
    tx.finish().unwrap();
    let r = rx.message().await;
    assert!(
        matches!(&r, Err(e) if e.code == Code::Unavailable),
        "{:?}",
        r.map(|m| m.map(|b| b.len()))
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    let st = c.retry_stats();
    assert_eq!((st.retries, st.buffer_commits), (0, 1), "{st:?}");
}

/// `Drain`: once started, a new call is refused before dispatch (UNAVAILABLE, after its one
/// transparent retry), while the call already running finishes OK; `drained()` resolves after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_refuses_new_calls_and_lets_running_ones_finish() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let started = Arc::new(AtomicU64::new(0));
    let s = started.clone();
    let server = Server::new(
        move |_req: ServerRequest| {
            let (g, s) = (g.clone(), s.clone());
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                g.notified().await;
                Ok::<_, Status>(Response {
                    body: Bytes::from_static(b"done"),
                    ..Response::default()
                })
            }
        },
        Config::default(),
    );
    let drain = server.drain();
    tokio::spawn(server.serve(listener));
    let c = Client::connect_unshared(&addr, &Config::default())
        .await
        .unwrap();
    let req = || byteexpress_rpc::Request {
        method: "/t.T/Slow".into(),
        timeout: Some(Duration::from_secs(10)),
        ..Default::default()
    };
    let running = tokio::spawn({
        let c = c.clone();
        async move { c.call(req()).await }
    });
    while started.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drain.start();
    assert_eq!(drain.in_flight(), 1);
    let refused = c.call(req()).await.unwrap_err();
    assert_eq!(refused.code, Code::Unavailable, "{refused}");
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "a refused call reached the handler"
    );
    assert_eq!(c.retry_stats().transparent_retries, 1);
    gate.notify_one();
    let done = running.await.unwrap().expect("the running call finishes");
    assert_eq!(&done.body[..], b"done");
    tokio::time::timeout(Duration::from_secs(10), drain.drained())
        .await
        .expect("drained once the running call ended");
}

/// A6's transparent retry of a call that never left the client: the client's test hook fails
/// its next 3 sends before any byte reaches the wire; the call (no service config, so no
/// policy) is retried each time and succeeds, the handler runs once and sees no
/// `grpc-previous-rpc-attempts` (no attempt reached a server before), and the client counts 3
/// transparent retries. Another client of the same server is untouched by the hook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_sends_fail_before_the_wire_is_retried_transparently_and_runs_once() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let runs = Arc::new(AtomicU64::new(0));
    let with_previous = Arc::new(AtomicU64::new(0));
    let (r, p) = (runs.clone(), with_previous.clone());
    let server = Server::new(
        move |req: ServerRequest| {
            r.fetch_add(1, Ordering::SeqCst);
            if req.metadata.get("grpc-previous-rpc-attempts").is_some() {
                p.fetch_add(1, Ordering::SeqCst);
            }
            async move {
                Ok::<_, Status>(Response {
                    body: req.body,
                    ..Response::default()
                })
            }
        },
        Config::default(),
    );
    tokio::spawn(server.serve(listener));
    let c = Client::connect_unshared(&addr, &Config::default())
        .await
        .unwrap();
    let other = Client::connect_unshared(&addr, &Config::default())
        .await
        .unwrap();
    let req = || byteexpress_rpc::Request {
        method: "/t.T/Echo".into(),
        body: Bytes::from_static(b"once"),
        timeout: Some(Duration::from_secs(10)),
        ..Default::default()
    };
    c.fail_next_sends(3);
    let got = c.call(req()).await.expect("retried transparently");
    assert_eq!(&got.body[..], b"once");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(with_previous.load(Ordering::SeqCst), 0);
    let st = c.retry_stats();
    assert_eq!((st.transparent_retries, st.attempts), (3, 4), "{st:?}");
    // the hook belongs to `c` only
    other.call(req()).await.unwrap();
    assert_eq!(other.retry_stats().transparent_retries, 0);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The same for a stream's opening frame: a client stream whose first 2 opens fail before
/// the wire opens on the third, and its handler runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_open_fails_before_the_wire_is_retried_transparently() {
    let (addr, attempts) = server(0).await;
    let c = Client::connect_unshared(&addr, &Config::default())
        .await
        .unwrap();
    c.fail_next_sends(2);
    let (mut tx, mut rx) = c
        .open_stream(open())
        .await
        .expect("opened on the third try");
    tx.send(Bytes::from_static(b"b")).await.unwrap();
    tx.finish().unwrap();
    assert_eq!(rx.message().await.unwrap().as_deref(), Some(&b"ab"[..]));
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    assert_eq!(c.retry_stats().transparent_retries, 2);
}

const HEDGED: &str = r#"{"methodConfig": [{"name": [{"service": "t.T"}],
   "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.05s",
                     "nonFatalStatusCodes": ["UNAVAILABLE"]}}]}"#;

/// Counts a stalled handler's end when it is dropped (the server stopped it).
struct Dropped(Arc<AtomicU64>);
impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A replica serving Collect (the concatenation of the request messages, tagged with its id),
/// or, stalled, never answering: `(addr, handlers started, handlers dropped)`.
async fn replica(id: &'static str, stalled: bool) -> (String, Arc<AtomicU64>, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (started, dropped) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (s, d) = (started.clone(), dropped.clone());
    let unary = |_req: ServerRequest| async { Ok::<_, Status>(Response::default()) };
    let server = Server::new(unary, Config::default()).with_streams(
        move |_req: StreamRequest, mut rx: RequestReceiver, mut tx: ResponseSender| {
            let (s, d) = (s.clone(), d.clone());
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                let _end = Dropped(d);
                if stalled {
                    std::future::pending::<()>().await;
                }
                let mut all = id.as_bytes().to_vec();
                while let Some(m) = rx.message().await? {
                    all.extend_from_slice(&m);
                }
                tx.send_last(Bytes::from(all));
                Ok::<_, Status>(Metadata::new())
            }
        },
    );
    tokio::spawn(server.serve(listener));
    (addr, started, dropped)
}

/// A6's hedging applies to streams too: a client stream under a hedging policy, over three
/// replicas of which one is stalled, completes from another (each hedged attempt is sent the
/// request messages so far, and the first to answer commits), and the stalled replica's
/// attempt is cancelled: its handler is dropped. Fails when hedged streams commit at open (the
/// stream stays on the stalled replica until its deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_client_stream_completes_past_a_stalled_replica_whose_attempt_is_cancelled() {
    use byteexpress_rpc::balance::EndpointState;
    use byteexpress_rpc::{BalanceConfig, CallOptions, Policy, ReplicaSet};
    let (a, _, _) = replica("A", false).await;
    let (b, stalled_started, stalled_dropped) = replica("B", true).await;
    let (c, _, _) = replica("C", false).await;
    let bal = BalanceConfig {
        policy: Policy::RoundRobin,
        ..BalanceConfig::default()
    };
    let set = ReplicaSet::from_static([&a, &b, &c], &Config::default(), &bal)
        .with_service_config(ServiceConfig::from_json(HEDGED).unwrap())
        .unwrap();
    set.connect_now();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let changed = set.changed();
            if set
                .endpoints()
                .iter()
                .all(|e| e.state == EndpointState::Ready)
            {
                return;
            }
            changed.await;
        }
    })
    .await
    .expect("all three ready");
    // round robin: one of three calls opens its first attempt on the stalled replica
    for _ in 0..3 {
        let (mut tx, mut rx) = set
            .open_stream_with(open(), CallOptions::default())
            .await
            .unwrap();
        for m in [b"b", b"c"] {
            tx.send(Bytes::from_static(m)).await.unwrap();
        }
        tx.finish().unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), rx.message())
            .await
            .expect("not stuck on the stalled replica")
            .expect("answered by a healthy replica")
            .expect("a message");
        assert!(
            &got[..] == b"Aabc" || &got[..] == b"Cabc",
            "{:?}",
            String::from_utf8_lossy(&got)
        );
        assert_eq!(rx.message().await.unwrap(), None);
    }
    let started = stalled_started.load(Ordering::SeqCst);
    assert!(started >= 1, "the stalled replica got no attempt");
    tokio::time::timeout(Duration::from_secs(5), async {
        while stalled_dropped.load(Ordering::SeqCst) < started {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the stalled replica's attempts were cancelled and their handlers dropped");
    assert!(set.retry_stats().hedges >= 1, "{:?}", set.retry_stats());
}

/// Review of issue 19: a client stream under a retry policy that the caller cancels before it
/// commits (both halves dropped while the server has not answered) must cancel its attempt, as
/// a stream without a policy does: the server's handler is dropped. Fails while the relay task
/// keeps running the attempt (and would retry it) after the caller has gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_stream_dropped_before_commit_cancels_its_attempt() {
    for policy in [None, Some(POLICY)] {
        let (addr, started, dropped) = replica("B", true).await;
        let mut c = Client::connect_unshared(&addr, &Config::default())
            .await
            .unwrap();
        if let Some(p) = policy {
            c = c
                .with_service_config(ServiceConfig::from_json(p).unwrap())
                .unwrap();
        }
        let mut o = open();
        o.timeout = Some(Duration::from_secs(60));
        let (mut tx, rx) = c.open_stream(o).await.unwrap();
        tx.send(Bytes::from_static(b"b")).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), async {
            while started.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the handler started");
        drop(rx);
        drop(tx);
        let r = tokio::time::timeout(Duration::from_secs(5), async {
            while dropped.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(
            r.is_ok(),
            "policy {:?}: the handler still runs 5 s after the caller dropped the stream",
            policy.is_some()
        );
    }
}
