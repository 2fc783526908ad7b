//! Retries, hedging and transparent retries with gRPC A6's semantics (issue 19), through the
//! facade's `Channel` and the tonic-generated `ps.ParameterServer` client, against
//! `bx-test-ps` processes that fail, stall, drain or die. Each server appends its handlers'
//! starts and ends to a log file (`bx-test-ps --log`), which survives a SIGKILL.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use byteexpress::{BalanceConfig, Channel, Config, EndpointState, Policy, ServiceConfig};
use byteexpress_ps::pb::ps::parameter_server_client::ParameterServerClient;
use byteexpress_ps::pb::ps::{PullRequest, PushRequest};
use integration_tests::ServerProc;

const PS: &str = env!("CARGO_BIN_EXE_bx-test-ps");

/// The issue's first document, verbatim.
const FIRST: &str = r#"{"methodConfig": [{"name": [{"service": "ps.ParameterServer", "method": "Pull"}],
   "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
                   "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}],
 "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#;

/// The issue's second document, verbatim.
const SECOND: &str = r#"{"methodConfig": [{"name": [{"service": "ps.ParameterServer", "method": "Pull"}],
   "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.02s",
                     "nonFatalStatusCodes": ["UNAVAILABLE"]}}]}"#;

/// A fresh log file path for one server.
fn log_path(name: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let p = std::env::temp_dir().join(format!(
        "bx-retries-{}-{}-{name}.log",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_file(&p);
    p.display().to_string()
}

/// The log's lines, split on spaces.
fn log(path: &str) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(' ').map(str::to_string).collect())
        .collect()
}

/// Lines `start <id> <method> ...` of a log.
fn starts(path: &str, method: &str) -> Vec<Vec<String>> {
    log(path)
        .into_iter()
        .filter(|l| l[0] == "start" && l[2] == method)
        .collect()
}

/// Waits (at most 5 s) until the log at `ls` shows `n` handlers ended "cancelled"; panics with
/// the count otherwise.
async fn all_cancelled(ls: &str, n: usize) {
    let t0 = Instant::now();
    loop {
        let cancelled = log(ls)
            .iter()
            .filter(|l| l[0] == "end" && l[4] == "cancelled")
            .count();
        if cancelled == n {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{cancelled} of {n} stalled attempts cancelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ps(id: &str, log: &str, extra: &[&str]) -> ServerProc {
    let mut args = vec!["--id", id, "--log", log];
    args.extend_from_slice(extra);
    ServerProc::start(PS, &args).await
}

fn uri(s: &ServerProc) -> String {
    format!("bx://{}", s.addr)
}

/// Round robin, no ejection for consecutive failures (so that a replica failing on purpose
/// keeps getting its share of first attempts).
fn round_robin() -> BalanceConfig {
    let mut bal = BalanceConfig {
        policy: Policy::RoundRobin,
        ..BalanceConfig::default()
    };
    bal.outlier.consecutive_failures = None;
    bal
}

/// A channel over `servers` with `json` as its service config (none for `None`), every
/// endpoint ready before it is returned.
async fn channel(servers: &[&ServerProc], json: Option<&str>) -> Channel {
    let mut ch = Channel::balance_list(
        servers.iter().map(|s| uri(s)),
        &Config::default(),
        &round_robin(),
    )
    .unwrap();
    if let Some(j) = json {
        ch = ch
            .with_service_config(ServiceConfig::from_json(j).unwrap())
            .unwrap();
    }
    let set = ch.replica_set().unwrap().clone();
    set.connect_now();
    let t0 = Instant::now();
    while !set
        .endpoints()
        .iter()
        .all(|e| e.state == EndpointState::Ready)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{:?}",
            set.endpoints()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ch
}

async fn pull(
    c: &mut ParameterServerClient<Channel>,
    rid: &str,
    timeout: Duration,
) -> Result<(), tonic::Status> {
    let mut req = tonic::Request::new(PullRequest {
        table: "emb".into(),
        keys: vec![1, 2, 3],
    });
    req.metadata_mut()
        .insert("x-request-id", rid.parse().unwrap());
    req.set_timeout(timeout);
    let r = c.pull(req).await?.into_inner();
    assert_eq!(r.values.len(), 3 * r.dim as usize * 4);
    Ok(())
}

async fn push(
    c: &mut ParameterServerClient<Channel>,
    rid: &str,
    timeout: Duration,
) -> Result<(), tonic::Status> {
    let mut req = tonic::Request::new(PushRequest {
        table: "emb".into(),
        keys: vec![7],
        grads: vec![0u8; 8 * 4].into(),
        lr: 0.1,
    });
    req.metadata_mut()
        .insert("x-request-id", rid.parse().unwrap());
    req.set_timeout(timeout);
    c.push(req).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_document_retries_a_pull_until_its_fourth_attempt_counting_previous_attempts() {
    let l = log_path("a");
    let s = ps("a", &l, &["--fail-first", "3"]).await;
    let ch = channel(&[&s], Some(FIRST)).await;
    let mut c = ParameterServerClient::new(ch.clone());
    pull(&mut c, "r1", Duration::from_secs(10))
        .await
        .expect("the 4th attempt succeeds");
    let prev: Vec<String> = starts(&l, "Pull").iter().map(|l| l[4].clone()).collect();
    assert_eq!(prev, ["0", "1", "2", "3"]);
    let st = ch.retry_stats();
    assert_eq!((st.retries, st.commits, st.attempts), (3, 1, 4), "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_outside_the_config_is_not_retried() {
    let l = log_path("a");
    let s = ps("a", &l, &["--fail-first", "1"]).await;
    let ch = channel(&[&s], Some(FIRST)).await;
    let mut c = ParameterServerClient::new(ch.clone());
    let e = push(&mut c, "p1", Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert_eq!(starts(&l, "Push").len(), 1);
    assert_eq!(ch.retry_stats().retries, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_stops_retries_once_tokens_drop_to_half_of_max_tokens() {
    let l = log_path("a");
    let s = ps("a", &l, &["--fail-first", "1000"]).await;
    let ch = channel(&[&s], Some(FIRST)).await;
    let mut c = ParameterServerClient::new(ch.clone());
    // call 1: four attempts take tokens 10 → 6; call 2: its failure takes 6 → 5, not above
    // 10/2, so no retry; call 3: 5 → 4, no retry
    for (i, want_attempts) in [(1, 4), (2, 1), (3, 1)] {
        let before = starts(&l, "Pull").len();
        let e = pull(&mut c, &format!("r{i}"), Duration::from_secs(10))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable);
        assert_eq!(starts(&l, "Pull").len() - before, want_attempts, "call {i}");
    }
    assert_eq!(ch.retry_stats().throttled, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_pushback_stops_retries_and_a_positive_one_sets_the_delay() {
    let l = log_path("a");
    let s = ps("a", &l, &["--fail-first", "1", "--pushback-ms", "-1"]).await;
    let ch = channel(&[&s], Some(FIRST)).await;
    let mut c = ParameterServerClient::new(ch);
    let e = pull(&mut c, "r1", Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert_eq!(starts(&l, "Pull").len(), 1);

    let l2 = log_path("b");
    let s2 = ps("b", &l2, &["--fail-first", "1", "--pushback-ms", "400"]).await;
    let ch = channel(&[&s2], Some(FIRST)).await;
    let mut c = ParameterServerClient::new(ch);
    let t0 = Instant::now();
    pull(&mut c, "r1", Duration::from_secs(10)).await.unwrap();
    // the policy's backoff before the first retry is at most 0.1 s; the pushback says 0.4 s
    assert!(
        t0.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(starts(&l2, "Pull").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_document_hedges_past_a_stalled_replica_and_cancels_its_attempt() {
    let (ls, la, lb) = (log_path("stalled"), log_path("a"), log_path("b"));
    let stalled = ps("stalled", &ls, &["--stall"]).await;
    let a = ps("a", &la, &[]).await;
    let b = ps("b", &lb, &[]).await;
    let ch = channel(&[&stalled, &a, &b], Some(SECOND)).await;
    let mut c = ParameterServerClient::new(ch.clone());
    // round robin: some first attempts land on the stalled replica
    for i in 0..6 {
        pull(&mut c, &format!("r{i}"), Duration::from_secs(10))
            .await
            .expect("answered by a healthy replica");
    }
    let n = starts(&ls, "Pull").len();
    assert!(n >= 1, "no attempt reached the stalled replica");
    assert!(
        ch.retry_stats().hedges >= n as u64,
        "{:?}",
        ch.retry_stats()
    );
    // every attempt on the stalled replica was cancelled (its handler dropped)
    all_cancelled(&ls, n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_under_load_fails_no_pull_and_runs_no_push_twice() {
    let logs = [log_path("a"), log_path("b"), log_path("c")];
    let mut servers = Vec::new();
    for (i, l) in logs.iter().enumerate() {
        // 50 ms handlers under 12 workers: about 4 calls in flight on each replica at the kill
        servers.push(ps(&format!("s{i}"), l, &["--delay-ms", "50"]).await);
    }
    let ch = {
        let refs: Vec<&ServerProc> = servers.iter().collect();
        channel(&refs, Some(FIRST)).await
    };
    let deadline = Duration::from_secs(3);
    let stop = Instant::now() + Duration::from_millis(1500);
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..12 {
        let (ch, next) = (ch.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut c = ParameterServerClient::new(ch);
            let mut out = Vec::new();
            while Instant::now() < stop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                let rid = format!("q{n}");
                let t0 = Instant::now();
                let r = if n % 2 == 0 {
                    ("Pull", pull(&mut c, &rid, deadline).await)
                } else {
                    ("Push", push(&mut c, &rid, deadline).await)
                };
                out.push((rid, r.0, r.1.map_err(|e| e.code()), t0.elapsed()));
            }
            out
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    servers[0].kill().await;
    let mut results = Vec::new();
    for w in workers {
        results.extend(w.await.unwrap());
    }
    assert!(results.len() > 30, "{} calls", results.len());
    let mut pulls_failed = Vec::new();
    for (rid, method, r, took) in &results {
        assert!(
            *took <= deadline + Duration::from_millis(500),
            "{rid} took {took:?}"
        );
        match (method, r) {
            (&"Pull", Err(code)) => pulls_failed.push((rid.clone(), *code)),
            (&"Push", Err(code)) => assert_eq!(*code, tonic::Code::Unavailable, "{rid}"),
            _ => {}
        }
    }
    assert!(pulls_failed.is_empty(), "failed Pulls: {pulls_failed:?}");
    // no Push ran twice, across the three servers' logs (the killed one's included)
    let mut runs: HashMap<String, usize> = HashMap::new();
    for l in &logs {
        for s in starts(l, "Push") {
            *runs.entry(s[3].clone()).or_default() += 1;
        }
    }
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "Pushes run twice: {twice:?}");
    assert!(ch.retry_stats().retries >= 1, "{:?}", ch.retry_stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_replica_refuses_before_dispatch_and_calls_succeed_elsewhere() {
    let (ld, lh) = (log_path("draining"), log_path("healthy"));
    let draining = ps("draining", &ld, &["--drain"]).await;
    let healthy = ps("healthy", &lh, &[]).await;
    // no service config: transparent retries only
    let ch = channel(&[&draining, &healthy], None).await;
    let mut c = ParameterServerClient::new(ch.clone());
    for i in 0..6 {
        pull(&mut c, &format!("r{i}"), Duration::from_secs(10))
            .await
            .expect("retried transparently on the healthy replica");
        push(&mut c, &format!("p{i}"), Duration::from_secs(10))
            .await
            .expect("a Push refused before dispatch may run elsewhere");
    }
    assert!(log(&ld).is_empty(), "the draining replica ran a handler");
    assert_eq!(starts(&lh, "Pull").len(), 6);
    assert_eq!(starts(&lh, "Push").len(), 6);
    let st = ch.retry_stats();
    assert!(st.transparent_retries >= 1, "{st:?}");
    assert_eq!(st.retries, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_refusing_every_call_fails_it_after_one_transparent_retry() {
    let l = log_path("draining");
    let draining = ps("draining", &l, &["--drain"]).await;
    let ch = channel(&[&draining], None).await;
    let mut c = ParameterServerClient::new(ch.clone());
    let t0 = Instant::now();
    let e = pull(&mut c, "r1", Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    // failed, not looped until the deadline
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let st = ch.retry_stats();
    assert_eq!((st.attempts, st.transparent_retries), (2, 1), "{st:?}");
    assert!(log(&l).is_empty());
}

/// A native unary Pull: the gRPC-framed protobuf body of a `PullRequest` as a ByteExpress
/// REQUEST (the facade server answers those as well as streams).
fn native_pull(rid: &str) -> byteexpress_rpc::Request {
    use prost::Message;
    let msg = PullRequest {
        table: "emb".into(),
        keys: vec![5],
    }
    .encode_to_vec();
    let mut body = vec![0u8];
    body.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    body.extend_from_slice(&msg);
    let mut metadata = byteexpress_rpc::Metadata::new();
    metadata.insert("x-request-id", rid.to_string()).unwrap();
    byteexpress_rpc::Request {
        method: "/ps.ParameterServer/Pull".into(),
        metadata,
        body: body.into(),
        timeout: Some(Duration::from_secs(10)),
    }
}

/// A native replica set over `servers` with `json`, every endpoint ready.
async fn native_set(servers: &[&ServerProc], json: &str) -> byteexpress_rpc::ReplicaSet {
    let set = byteexpress_rpc::ReplicaSet::from_static(
        servers.iter().map(|s| s.addr.clone()),
        &byteexpress_rpc::Config::default(),
        &round_robin(),
    )
    .with_service_config(ServiceConfig::from_json(json).unwrap())
    .unwrap();
    set.connect_now();
    let t0 = Instant::now();
    while !set
        .endpoints()
        .iter()
        .all(|e| e.state == EndpointState::Ready)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{:?}",
            set.endpoints()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    set
}

/// The native API with the second document: unary calls hedged past a stalled replica, whose
/// handler the server aborts when the losing attempt's CANCEL arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_hedging_cancels_the_stalled_replicas_unary_handler() {
    let (ls, la) = (log_path("stalled"), log_path("a"));
    let stalled = ps("stalled", &ls, &["--stall"]).await;
    let a = ps("a", &la, &[]).await;
    let set = native_set(&[&stalled, &a], SECOND).await;
    for i in 0..4 {
        let r = set.call(native_pull(&format!("r{i}"))).await;
        assert!(r.is_ok(), "{r:?}");
    }
    let n = starts(&ls, "Pull").len();
    assert!(n >= 1, "no attempt reached the stalled replica");
    all_cancelled(&ls, n).await;
}

/// The native API: a `ReplicaSet` with the first document calls the PS's Pull as a unary
/// ByteExpress call and is retried the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_replica_set_retries_by_the_same_service_config() {
    let l = log_path("a");
    let s = ps("a", &l, &["--fail-first", "2"]).await;
    let set = native_set(&[&s], FIRST).await;
    let r = set.call(native_pull("r1")).await;
    assert!(r.is_ok(), "{r:?}");
    let prev: Vec<String> = starts(&l, "Pull").iter().map(|l| l[4].clone()).collect();
    assert_eq!(prev, ["0", "1", "2"]);
    assert_eq!(set.retry_stats().retries, 2);
}

/// A native unary Push (no policy in the first document) with request id `rid`.
fn native_push(rid: &str, timeout: Duration) -> byteexpress_rpc::Request {
    use prost::Message;
    let msg = PushRequest {
        table: "emb".into(),
        keys: vec![7],
        grads: vec![0u8; 8 * 4].into(),
        lr: 0.1,
    }
    .encode_to_vec();
    let mut body = vec![0u8];
    body.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    body.extend_from_slice(&msg);
    let mut metadata = byteexpress_rpc::Metadata::new();
    metadata.insert("x-request-id", rid.to_string()).unwrap();
    byteexpress_rpc::Request {
        method: "/ps.ParameterServer/Push".into(),
        metadata,
        body: body.into(),
        timeout: Some(timeout),
    }
}

/// Review of issue 19: the native unary path. A call pending on a link that dies may have
/// run (its REQUEST was sent), so it must fail, not be retried transparently as a call that
/// never left the client: under load over three replicas, one killed with SIGKILL, no Push
/// (no policy) ran twice and every failed one failed UNAVAILABLE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_unary_calls_pending_on_a_killed_replica_are_not_run_twice() {
    let logs = [log_path("a"), log_path("b"), log_path("c")];
    let mut servers = Vec::new();
    for (i, l) in logs.iter().enumerate() {
        // 100 ms handlers under 12 workers: about 4 calls in flight on each replica at the kill
        servers.push(ps(&format!("s{i}"), l, &["--delay-ms", "100"]).await);
    }
    let set = {
        let refs: Vec<&ServerProc> = servers.iter().collect();
        native_set(&refs, FIRST).await
    };
    let deadline = Duration::from_secs(3);
    let stop = Instant::now() + Duration::from_millis(1500);
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..12 {
        let (set, next) = (set.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut out = Vec::new();
            while Instant::now() < stop {
                let rid = format!("n{}", next.fetch_add(1, Ordering::SeqCst));
                let r = set.call(native_push(&rid, deadline)).await;
                out.push((rid, r.map(|_| ()).map_err(|e| e.code)));
            }
            out
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    servers[0].kill().await;
    let mut results = Vec::new();
    for w in workers {
        results.extend(w.await.unwrap());
    }
    assert!(results.len() > 30, "{} calls", results.len());
    let failed: Vec<_> = results.iter().filter(|r| r.1.is_err()).collect();
    for (rid, r) in &failed {
        assert_eq!(*r, Err(byteexpress_rpc::Code::Unavailable), "{rid}");
    }
    let mut runs: HashMap<String, usize> = HashMap::new();
    for l in &logs {
        for s in starts(l, "Push") {
            *runs.entry(s[3].clone()).or_default() += 1;
        }
    }
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "Pushes run twice: {twice:?}");
    // the kill caught calls in flight on the killed replica (else this pins nothing)
    assert!(!starts(&logs[0], "Push").is_empty());
    assert!(
        !failed.is_empty(),
        "no call was pending on the killed replica"
    );
}
