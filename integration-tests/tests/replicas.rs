//! Issue 18 "endpoints that change, balanced and ejected": a client over a service's replicas,
//! each replica a `bx-test-server` process (or `bx ps serve` for the tonic facade).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use byteexpress_rpc::balance::{
    Backoff, Change, EndpointInfo, EndpointState, OutlierDetection, OutlierEventKind, Resolve,
    SystemResolver,
};
use byteexpress_rpc::{
    BalanceConfig, BoxFuture, CallOptions, Client, Code, Config, Metadata, Policy, ReplicaSet,
    Request, Status, TransportPref,
};
use bytes::Bytes;
use integration_tests::{ServerProc, rdma_here};

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
const BX: &str = env!("CARGO_BIN_EXE_bx-facade");

fn tcp() -> Config {
    Config {
        transport: TransportPref::Tcp,
        ..Config::default()
    }
}

fn echo(timeout: Duration) -> Request {
    Request {
        method: "/test.Test/Echo".into(),
        metadata: Metadata::new(),
        body: Bytes::from_static(b"hi"),
        timeout: Some(timeout),
    }
}

fn sleep_call(ms: u64, timeout: Duration) -> Request {
    Request {
        method: "/test.Test/Sleep".into(),
        metadata: Metadata::new(),
        body: Bytes::from(ms.to_string()),
        timeout: Some(timeout),
    }
}

/// Which replica answered (`--id`).
fn server_of(r: &byteexpress_rpc::Response) -> String {
    String::from_utf8_lossy(r.metadata.get("x-server").expect("x-server")).into_owned()
}

async fn replica(id: &str, extra: &[&str]) -> ServerProc {
    let mut args = vec!["--id", id];
    args.extend_from_slice(extra);
    ServerProc::start(SERVER, &args).await
}

/// A port on 127.0.0.1 that nothing listens on (bound, then released).
async fn free_addr() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().to_string()
}

/// Polls `set` (woken by its changes, re-checking at least every 50 ms) until `pred` holds;
/// panics after `limit`.
async fn wait_until(
    set: &ReplicaSet,
    limit: Duration,
    what: &str,
    pred: impl Fn(&[EndpointInfo]) -> bool,
) {
    let t0 = Instant::now();
    loop {
        let changed = set.changed();
        if pred(&set.endpoints()) {
            return;
        }
        assert!(
            t0.elapsed() < limit,
            "{what}: not within {limit:?}: {:?}",
            set.endpoints()
        );
        let _ = tokio::time::timeout(Duration::from_millis(50), changed).await;
    }
}

fn fast_backoff() -> Backoff {
    Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_millis(400),
        ..Backoff::default()
    }
}

// ---- the deadline bounds connecting ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200ms_deadline_against_an_accept_and_hang_port_is_deadline_exceeded_within_700ms() {
    let hang = ServerProc::start(SERVER, &["--hang"]).await;
    let set = ReplicaSet::from_static([&hang.addr], &tcp(), &BalanceConfig::default());
    for wait_for_ready in [false, true] {
        let t0 = Instant::now();
        let err = set
            .call_with(
                echo(Duration::from_millis(200)),
                CallOptions {
                    wait_for_ready: Some(wait_for_ready),
                },
            )
            .await
            .unwrap_err();
        let took = t0.elapsed();
        assert_eq!(err.code, Code::DeadlineExceeded, "{err:?}");
        assert!(took < Duration::from_millis(700), "took {took:?}");
        assert!(took >= Duration::from_millis(190), "took {took:?}");
    }
    assert_eq!(set.endpoints()[0].state, EndpointState::Connecting);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reconnecting_to_an_accept_and_hang_port_is_bounded_by_the_call_deadline() {
    let mut server = ServerProc::start(SERVER, &[]).await;
    let client = Client::connect(&server.addr, &tcp())
        .await
        .expect("connect");
    client
        .call(echo(Duration::from_secs(10)))
        .await
        .expect("echo");
    server.kill().await;
    tokio::time::timeout(Duration::from_secs(10), client.link_closed())
        .await
        .expect("link closes when the server dies");
    // the same address now accepts and never answers
    let _hang = ServerProc::start(SERVER, &["--hang", "--addr", &server.addr]).await;
    let t0 = Instant::now();
    let err = client
        .call(echo(Duration::from_millis(200)))
        .await
        .unwrap_err();
    let took = t0.elapsed();
    assert_eq!(err.code, Code::DeadlineExceeded, "{err:?}");
    assert!(took < Duration::from_millis(700), "took {took:?}");
}

/// A call whose link must be set up again first: the deadline counts from the call's start,
/// set-up included (it was restarted once the link was up, so a call could take nearly twice
/// its timeout and the server was told more time was left than there was). Through a proxy
/// whose second connection takes 400 ms to reach the server, a 400 ms handler under a 600 ms
/// deadline fails DEADLINE_EXCEEDED at about 600 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_deadline_counts_the_link_set_up_before_it() {
    let server = ServerProc::start(SERVER, &[]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = listener.local_addr().unwrap().to_string();
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let to = server.addr.clone();
    tokio::spawn(async move {
        let mut first_tx = Some(first_tx);
        for n in 0..10 {
            let Ok((mut inbound, _)) = listener.accept().await else {
                return;
            };
            let to = to.clone();
            let task = tokio::spawn(async move {
                if n > 0 {
                    // a slow path to the server: the link's set-up takes this much longer
                    tokio::time::sleep(Duration::from_millis(400)).await;
                }
                let mut out = tokio::net::TcpStream::connect(&to).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
            });
            if let Some(tx) = first_tx.take() {
                let _ = tx.send(task.abort_handle());
            }
        }
    });
    let client = Client::connect(&proxy, &tcp()).await.expect("connect");
    client
        .call(echo(Duration::from_secs(10)))
        .await
        .expect("echo");
    // the first connection is cut: the link closes, the next call sets up another
    first_rx.await.unwrap().abort();
    tokio::time::timeout(Duration::from_secs(10), client.link_closed())
        .await
        .expect("link closes when its connection is cut");
    let t0 = Instant::now();
    let r = client
        .call(sleep_call(400, Duration::from_millis(600)))
        .await;
    let took = t0.elapsed();
    let err = r.expect_err("a 400 ms handler after 400 ms of set-up within a 600 ms deadline");
    assert_eq!(err.code, Code::DeadlineExceeded, "{err:?}");
    assert!(took < Duration::from_millis(900), "took {took:?}");
}

// ---- connect_lazy, wait_for_ready, backoff ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lazy_set_before_its_server_fails_fast_without_wait_for_ready_and_waits_with_it() {
    let addr = free_addr().await;
    let bal = BalanceConfig {
        backoff: fast_backoff(),
        ..BalanceConfig::default()
    };
    let set = ReplicaSet::from_static([&addr], &tcp(), &bal);
    assert_eq!(set.endpoints()[0].state, EndpointState::Idle, "lazy");
    // nobody listens: the first attempt is refused, the set is in TRANSIENT_FAILURE
    let t0 = Instant::now();
    let err = set.call(echo(Duration::from_secs(10))).await.unwrap_err();
    assert_eq!(err.code, Code::Unavailable, "{err:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "fail fast: {:?}",
        t0.elapsed()
    );
    // a wait-for-ready call, started before the server exists, waits for it
    let waiting = {
        let set = set.clone();
        tokio::spawn(async move {
            set.call_with(
                echo(Duration::from_secs(20)),
                CallOptions {
                    wait_for_ready: Some(true),
                },
            )
            .await
        })
    };
    // still failing fast meanwhile
    let err = set.call(echo(Duration::from_secs(10))).await.unwrap_err();
    assert_eq!(err.code, Code::Unavailable, "{err:?}");
    assert!(!waiting.is_finished(), "the wait-for-ready call waits");
    let _server = ServerProc::start(SERVER, &["--addr", &addr, "--id", "late"]).await;
    let resp = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("within the deadline")
        .unwrap()
        .expect("the first call with wait_for_ready succeeds");
    assert_eq!(server_of(&resp), "late");
    let e = &set.endpoints()[0];
    assert_eq!(e.state, EndpointState::Ready);
    assert!(e.transport.is_some(), "transport reported per endpoint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_turns_wait_for_ready_off_fails_fast_despite_the_service_configs_wait_for_ready()
 {
    let addr = free_addr().await;
    let bal = BalanceConfig {
        backoff: fast_backoff(),
        ..BalanceConfig::default()
    };
    let sc = byteexpress_rpc::ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{"service": "test.Test"}], "waitForReady": true}]}"#,
    )
    .unwrap();
    let set = ReplicaSet::from_static([&addr], &tcp(), &bal)
        .with_service_config(sc)
        .unwrap();
    // nobody listens: once the first attempt is refused the endpoint is in TRANSIENT_FAILURE
    set.connect_now();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let changed = set.changed();
            if set.endpoints()[0].state == EndpointState::TransientFailure {
                return;
            }
            changed.await;
        }
    })
    .await
    .expect("in TRANSIENT_FAILURE");
    // the call's own `false` wins over the config's `true`: UNAVAILABLE at once
    let t0 = Instant::now();
    let err = set
        .call_with(
            echo(Duration::from_secs(10)),
            CallOptions {
                wait_for_ready: Some(false),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::Unavailable, "{err:?}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // a call that set nothing takes the config's: it waits until its deadline
    let err = set
        .call_with(echo(Duration::from_millis(300)), CallOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::DeadlineExceeded, "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnection_attempts_to_an_absent_server_back_off_by_the_multiplier_up_to_the_max() {
    let addr = free_addr().await;
    let bal = BalanceConfig {
        backoff: Backoff {
            initial: Duration::from_millis(100),
            multiplier: 2.0,
            jitter: 0.0,
            max: Duration::from_millis(400),
            min_connect_timeout: Duration::from_secs(20),
        },
        ..BalanceConfig::default()
    };
    let set = ReplicaSet::from_static([&addr], &tcp(), &bal);
    set.connect_now();
    // when each attempt was first seen (attempts are counted as they start, and every start
    // wakes `changed`)
    let mut starts: Vec<Instant> = vec![];
    let t0 = Instant::now();
    while starts.len() < 6 && t0.elapsed() < Duration::from_secs(10) {
        let changed = set.changed();
        let n = set.endpoints()[0].attempts as usize;
        while starts.len() < n {
            starts.push(Instant::now());
        }
        let _ = tokio::time::timeout(Duration::from_millis(20), changed).await;
    }
    assert!(starts.len() >= 6, "{} attempts", starts.len());
    let gaps: Vec<Duration> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    // gaps 100, 200, 400 (max), 400, 400 ms; observed within 20 ms polls
    let want = [100u64, 200, 400, 400, 400];
    for (g, w) in gaps.iter().zip(want) {
        let w = Duration::from_millis(w);
        assert!(
            *g + Duration::from_millis(25) >= w && *g < w + Duration::from_millis(300),
            "gaps {gaps:?}"
        );
    }
    // The loop above stops as soon as the 6th attempt has started, when the endpoint is
    // still Connecting until the refusal arrives: wait for the state that attempt ends in
    // (TransientFailure, held for the 400 ms backoff before the next one).
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let changed = set.changed();
            if set.endpoints()[0].state == EndpointState::TransientFailure {
                return;
            }
            changed.await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "never in TransientFailure: {:?}",
        set.endpoints()[0].state
    );
}

// ---- the facade: connect_lazy, poll_ready, WaitForReady ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_over_connect_lazy_poll_ready_pends_until_a_server_is_ready_and_wait_for_ready_is_per_call()
 {
    use byteexpress::{Channel, WaitForReady};
    use byteexpress_ps::pb::echo::EchoRequest;
    use byteexpress_ps::pb::echo::echo_client::EchoClient;
    use tower_service::Service;

    let addr = free_addr().await;
    let uri = format!("bx://{addr}");
    let bal = BalanceConfig {
        backoff: fast_backoff(),
        ..BalanceConfig::default()
    };
    let fail_fast = Channel::connect_lazy_with(&uri, &tcp(), &bal).unwrap();
    let mut waiting_channel = fail_fast.clone().wait_for_ready(true);
    // a wait-for-ready channel: poll_ready is Pending while no endpoint is ready
    let ready = futures::future::poll_fn(|cx| {
        Service::<http::Request<tonic::body::Body>>::poll_ready(&mut waiting_channel, cx)
    });
    tokio::pin!(ready);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), ready.as_mut())
            .await
            .is_err(),
        "poll_ready must pend while no endpoint is ready"
    );
    // a fail-fast call through tonic: UNAVAILABLE at once
    let mut client = EchoClient::new(fail_fast.clone());
    let t0 = Instant::now();
    let err = client
        .echo(EchoRequest {
            payload: Bytes::from_static(b"x"),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    // a wait-for-ready call through tonic on the fail-fast channel (request extension)
    let call = tokio::spawn(async move {
        let mut req = tonic::Request::new(EchoRequest {
            payload: Bytes::from_static(b"late"),
        });
        req.set_timeout(Duration::from_secs(20));
        req.extensions_mut().insert(WaitForReady(true));
        client.echo(req).await
    });
    let _server = ServerProc::start(BX, &["ps", "serve", "--addr", &addr]).await;
    tokio::time::timeout(Duration::from_secs(20), ready)
        .await
        .expect("poll_ready becomes Ready once the server is up")
        .expect("never an error");
    let resp = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("in time")
        .unwrap()
        .expect("wait-for-ready call succeeds");
    assert_eq!(&resp.get_ref().payload[..], b"late");
}

// ---- a replica killed under load ----

/// When a call started, and which replica answered it or its error.
type Outcome = (Instant, Result<String, Code>);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_one_killed_under_load_new_calls_go_to_the_two_others() {
    let mut a = replica("a", &[]).await;
    let b = replica("b", &[]).await;
    let c = replica("c", &[]).await;
    let set = ReplicaSet::from_static(
        [&a.addr, &b.addr, &c.addr],
        &Config::default(),
        &BalanceConfig::default(),
    );
    set.connect_now();
    wait_until(&set, Duration::from_secs(20), "all ready", |e| {
        e.iter().all(|e| e.state == EndpointState::Ready)
    })
    .await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // (when the call started, which replica answered or the error)
    let seen: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (set, stop, seen) = (set.clone(), stop.clone(), seen.clone());
            tokio::spawn(async move {
                let t0 = Instant::now();
                for _ in 0..20_000 {
                    if stop.load(std::sync::atomic::Ordering::SeqCst)
                        || t0.elapsed() > Duration::from_secs(30)
                    {
                        break;
                    }
                    let started = Instant::now();
                    let r = set.call(sleep_call(1, Duration::from_secs(5))).await;
                    let r = r.as_ref().map(server_of).map_err(|e| e.code);
                    seen.lock().unwrap().push((started, r));
                }
            })
        })
        .collect();
    // load runs on all three
    let t0 = Instant::now();
    while seen.lock().unwrap().len() < 300 && t0.elapsed() < Duration::from_secs(20) {
        let _ = tokio::time::timeout(Duration::from_millis(20), set.changed()).await;
    }
    let killed_at = Instant::now();
    a.kill().await;
    // the killed replica's link closes and its calls in flight end
    wait_until(&set, Duration::from_secs(10), "a out", |e| {
        let a = e.iter().find(|x| x.addr == a.addr).unwrap();
        a.state != EndpointState::Ready && a.outstanding == 0
    })
    .await;
    let settled = Instant::now();
    let n_settled = seen.lock().unwrap().len();
    while seen.lock().unwrap().len() < n_settled + 1000
        && settled.elapsed() < Duration::from_secs(20)
    {
        let _ = tokio::time::timeout(Duration::from_millis(20), set.changed()).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    let seen = seen.lock().unwrap();
    let before: Vec<_> = seen.iter().filter(|(t, _)| *t < killed_at).collect();
    assert!(
        before.iter().any(|(_, r)| r.as_deref() == Ok("a")),
        "a took calls before"
    );
    let mut failed_codes = HashMap::new();
    for (t, r) in seen.iter() {
        if let Err(c) = r {
            *failed_codes.entry(format!("{c:?}")).or_insert(0) += 1;
            assert_eq!(
                *c,
                Code::Unavailable,
                "only UNAVAILABLE on the killed replica"
            );
            assert!(*t < settled, "only calls started before a was out fail");
        }
    }
    // the calls started once a's calls in flight had ended
    let after: Vec<_> = seen.iter().filter(|(t, _)| *t > settled).collect();
    assert!(after.len() >= 1000, "{} calls after", after.len());
    for (_, r) in &after {
        let who = r.as_ref().expect("every new call succeeds");
        assert!(who == "b" || who == "c", "new call went to {who}");
    }
    for who in ["b", "c"] {
        assert!(
            after.iter().any(|(_, r)| r.as_deref() == Ok(who)),
            "{who} took calls"
        );
    }
    eprintln!("failed while a died: {failed_codes:?}");
    drop((b, c));
}

// ---- outlier ejection ----

/// Consecutive-failure ejection only, swept every 250 ms; round robin, so that the failing
/// replica takes every third call whatever its latency estimate (and, re-admitted, is ejected
/// again well before the next sweep would lower its ejection multiplier).
fn ejecting(consecutive: u32, base: Duration, max_percent: u32) -> BalanceConfig {
    BalanceConfig {
        policy: Policy::RoundRobin,
        outlier: OutlierDetection {
            interval: Duration::from_millis(250),
            base_ejection_time: base,
            max_ejection_time: Duration::from_secs(60),
            max_ejection_percent: max_percent,
            success_rate_ejection: None,
            failure_percentage_ejection: None,
            consecutive_failures: Some(consecutive),
        },
        ..BalanceConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_failing_every_call_is_ejected_readmitted_and_ejected_longer_the_second_time() {
    // the only test of this binary that installs a metrics recorder (others may add to the
    // counters, never take from them)
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics_text = recorder.handle();
    metrics::set_global_recorder(recorder).expect("no recorder installed before");
    let bad = replica("bad", &["--fail-all", "13"]).await;
    let good1 = replica("g1", &[]).await;
    let good2 = replica("g2", &[]).await;
    let base = Duration::from_millis(600);
    let set = ReplicaSet::from_static(
        [&bad.addr, &good1.addr, &good2.addr],
        &tcp(),
        &ejecting(5, base, 10),
    );
    let mut events = set.outlier_events();
    let bad_of = |set: &ReplicaSet| {
        set.endpoints()
            .into_iter()
            .find(|e| e.addr == bad.addr)
            .unwrap()
    };
    let t0 = Instant::now();
    let mut failures_at_first_ejection = None;
    let mut failed_while_ejected = 0;
    for _ in 0..200_000 {
        if set.stats().readmissions >= 2 || t0.elapsed() > Duration::from_secs(30) {
            break;
        }
        let out_before = bad_of(&set).ejected;
        let r = set.call(echo(Duration::from_secs(5))).await;
        let e = bad_of(&set);
        if out_before && e.ejected && r.is_err() {
            failed_while_ejected += 1;
        }
        if e.ejected && failures_at_first_ejection.is_none() {
            failures_at_first_ejection = Some(e.failures);
        }
        if let Err(s) = &r {
            assert_eq!(s.code, Code::Internal, "{s:?}");
        }
    }
    assert_eq!(
        failures_at_first_ejection,
        Some(5),
        "ejected after the 5th consecutive failure"
    );
    assert_eq!(
        failed_while_ejected, 0,
        "no call reaches an ejected replica"
    );
    let mut ev = vec![];
    while let Ok(e) = events.try_recv() {
        ev.push(e);
    }
    assert!(ev.len() >= 4, "{ev:?}");
    assert!(ev.iter().all(|e| e.addr == bad.addr), "{ev:?}");
    let (e1, r1, e2, r2) = (&ev[0], &ev[1], &ev[2], &ev[3]);
    assert_eq!(
        e1.kind,
        OutlierEventKind::Ejected {
            duration: base,
            reason: "consecutive_failures"
        }
    );
    assert_eq!(r1.kind, OutlierEventKind::Readmitted);
    assert_eq!(
        e2.kind,
        OutlierEventKind::Ejected {
            duration: base * 2,
            reason: "consecutive_failures"
        },
        "the second ejection lasts twice the base"
    );
    assert_eq!(r2.kind, OutlierEventKind::Readmitted);
    // ejections and re-admissions are counted in the metrics too
    let text = metrics_text.render();
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    assert!(
        value("bx_endpoint_ejections_total{reason=\"consecutive_failures\"}") >= 2.0,
        "{text}"
    );
    assert!(value("bx_endpoint_readmissions_total") >= 2.0, "{text}");
    let out1 = r1.at - e1.at;
    let out2 = r2.at - e2.at;
    // re-admission happens at the first sweep (every 250 ms) after the ejection time (loose
    // upper bounds, for a loaded machine)
    assert!(
        out1 >= base && out1 < base + Duration::from_millis(1500),
        "{out1:?}"
    );
    assert!(
        out2 >= base * 2 && out2 < base * 2 + Duration::from_millis(1500),
        "{out2:?}"
    );
    let st = set.stats();
    assert!(st.ejections >= 2 && st.readmissions >= 2, "{st:?}");
    drop((good1, good2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_ejection_percent_no_further_replica_is_ejected() {
    let bad1 = replica("bad1", &["--fail-all", "13"]).await;
    let bad2 = replica("bad2", &["--fail-all", "13"]).await;
    let good = replica("good", &[]).await;
    // 10 % of 3: one ejected endpoint already makes 33 %, so a second is never ejected
    let set = ReplicaSet::from_static(
        [&bad1.addr, &bad2.addr, &good.addr],
        &tcp(),
        &ejecting(5, Duration::from_secs(30), 10),
    );
    let t0 = Instant::now();
    let mut failures_while_one_out = 0;
    for _ in 0..5_000 {
        if failures_while_one_out >= 50 || t0.elapsed() > Duration::from_secs(20) {
            break;
        }
        let r = set.call(echo(Duration::from_secs(5))).await;
        let out = set.endpoints().iter().filter(|e| e.ejected).count();
        assert!(out <= 1, "{:?}", set.endpoints());
        if out == 1 && r.is_err() {
            failures_while_one_out += 1;
        }
    }
    assert_eq!(set.stats().ejections, 1, "{:?}", set.endpoints());
    assert!(
        failures_while_one_out >= 50,
        "the other failing replica kept taking calls: {failures_while_one_out}"
    );
    drop((bad1, bad2, good));
}

// ---- endpoint sources ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_from_a_discover_stream_are_used_and_dropped_and_calls_in_flight_finish() {
    let a = replica("a", &[]).await;
    let b = replica("b", &[]).await;
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Change<u32, String>, Status>>();
    let set = ReplicaSet::from_discover(rx, &tcp(), &BalanceConfig::default());
    // before the stream says anything, a call waits (here: until its deadline)
    let err = set
        .call(echo(Duration::from_millis(100)))
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::DeadlineExceeded);
    tx.unbounded_send(Ok(Change::Insert(1, a.addr.clone())))
        .unwrap();
    let r = set
        .call(echo(Duration::from_secs(10)))
        .await
        .expect("via a");
    assert_eq!(server_of(&r), "a");
    // a slow call in flight on a
    let in_flight = {
        let set = set.clone();
        tokio::spawn(async move { set.call(sleep_call(3000, Duration::from_secs(10))).await })
    };
    wait_until(&set, Duration::from_secs(10), "call on a", |e| {
        e[0].outstanding == 1
    })
    .await;
    tx.unbounded_send(Ok(Change::Insert(2, b.addr.clone())))
        .unwrap();
    let mut by = HashMap::<String, u32>::new();
    let t0 = Instant::now();
    while by.get("b").copied().unwrap_or(0) == 0 && t0.elapsed() < Duration::from_secs(10) {
        let r = set.call(echo(Duration::from_secs(10))).await.expect("echo");
        *by.entry(server_of(&r)).or_default() += 1;
    }
    assert!(
        by.contains_key("b"),
        "the inserted endpoint is used: {by:?}"
    );
    tx.unbounded_send(Ok(Change::Remove(1))).unwrap();
    wait_until(&set, Duration::from_secs(10), "a removed", |e| e.len() == 1).await;
    assert!(
        !in_flight.is_finished(),
        "a is removed while its call is in flight"
    );
    for _ in 0..200 {
        let r = set.call(echo(Duration::from_secs(10))).await.expect("echo");
        assert_eq!(server_of(&r), "b", "the removed endpoint takes no call");
    }
    let r = in_flight
        .await
        .unwrap()
        .expect("the call in flight on a finishes");
    assert_eq!(server_of(&r), "a");
    let st = set.stats();
    assert_eq!((st.added, st.removed), (2, 1));
}

/// A resolver whose answer the test sets.
#[derive(Debug, Default)]
struct FixedResolver {
    addrs: Mutex<Vec<SocketAddr>>,
}

impl Resolve for FixedResolver {
    fn resolve(&self, _host: &str, _port: u16) -> BoxFuture<Result<Vec<SocketAddr>, Status>> {
        let a = self.addrs.lock().unwrap().clone();
        Box::pin(async move { Ok(a) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_resolution_through_the_resolver_adds_and_drops_replicas() {
    let a = replica("a", &[]).await;
    let b = replica("b", &[]).await;
    let resolver = Arc::new(FixedResolver::default());
    *resolver.addrs.lock().unwrap() = vec![a.addr.parse().unwrap()];
    let bal = BalanceConfig {
        resolve_every: Duration::from_millis(50),
        ..BalanceConfig::default()
    };
    let set = ReplicaSet::from_dns("replicas.test:1", resolver.clone(), &tcp(), &bal).unwrap();
    let r = set
        .call(echo(Duration::from_secs(10)))
        .await
        .expect("via a");
    assert_eq!(server_of(&r), "a");
    *resolver.addrs.lock().unwrap() = vec![a.addr.parse().unwrap(), b.addr.parse().unwrap()];
    wait_until(&set, Duration::from_secs(10), "b added", |e| e.len() == 2).await;
    let mut by = HashMap::<String, u32>::new();
    let t0 = Instant::now();
    while by.len() < 2 && t0.elapsed() < Duration::from_secs(10) {
        let r = set.call(echo(Duration::from_secs(10))).await.expect("echo");
        *by.entry(server_of(&r)).or_default() += 1;
    }
    assert_eq!(by.len(), 2, "both replicas used: {by:?}");
    *resolver.addrs.lock().unwrap() = vec![b.addr.parse().unwrap()];
    wait_until(&set, Duration::from_secs(10), "a dropped", |e| {
        e.len() == 1 && e[0].addr == b.addr
    })
    .await;
    for _ in 0..100 {
        let r = set.call(echo(Duration::from_secs(10))).await.expect("echo");
        assert_eq!(server_of(&r), "b");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_system_resolver_makes_a_replica_of_every_record_of_localhost() {
    let a = replica("a", &[]).await;
    let port = a.addr.rsplit_once(':').unwrap().1;
    let records: Vec<String> = tokio::net::lookup_host(format!("localhost:{port}"))
        .await
        .unwrap()
        .map(|s| s.to_string())
        .collect();
    let set = ReplicaSet::from_dns(
        &format!("localhost:{port}"),
        Arc::new(SystemResolver),
        &tcp(),
        &BalanceConfig::default(),
    )
    .unwrap();
    let r = set
        .call_with(
            echo(Duration::from_secs(10)),
            CallOptions {
                wait_for_ready: Some(true),
            },
        )
        .await
        .expect("via 127.0.0.1");
    assert_eq!(server_of(&r), "a");
    let mut got: Vec<String> = set.endpoints().into_iter().map(|e| e.addr).collect();
    let mut want: Vec<String> = records.clone();
    want.sort();
    want.dedup();
    got.sort();
    assert_eq!(got, want, "one endpoint per record");
    assert!(got.contains(&a.addr));
}

// ---- balancing ----

/// Sends `n` calls, 4 at a time, and counts which replica answered.
async fn spread(set: &ReplicaSet, n: usize) -> HashMap<String, usize> {
    let by: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let t0 = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (set, by) = (set.clone(), by.clone());
            tokio::spawn(async move {
                for _ in 0..n / 4 {
                    if t0.elapsed() > Duration::from_secs(60) {
                        break;
                    }
                    let r = set.call(echo(Duration::from_secs(10))).await.expect("echo");
                    *by.lock().unwrap().entry(server_of(&r)).or_default() += 1;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    by.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2c_sends_under_15_percent_of_calls_to_a_replica_answering_10ms_later() {
    let slow = replica("slow", &["--delay-ms", "10"]).await;
    let f1 = replica("f1", &[]).await;
    let f2 = replica("f2", &[]).await;
    let addrs = [&slow.addr, &f1.addr, &f2.addr];
    let set = ReplicaSet::from_static(addrs, &tcp(), &BalanceConfig::default());
    set.connect_now();
    wait_until(&set, Duration::from_secs(20), "all ready", |e| {
        e.iter().all(|e| e.state == EndpointState::Ready)
    })
    .await;
    let by = spread(&set, 2000).await;
    let total: usize = by.values().sum();
    let share = by.get("slow").copied().unwrap_or(0) as f64 / total as f64;
    eprintln!("p2c: {by:?}, slow share {:.1} %", share * 100.0);
    assert!(total >= 1000, "{by:?}");
    assert!(share < 0.15, "slow replica got {:.1} %", share * 100.0);
    // round robin, for contrast: every replica a third
    let rr = BalanceConfig {
        policy: Policy::RoundRobin,
        ..BalanceConfig::default()
    };
    let set = ReplicaSet::from_static(addrs, &tcp(), &rr);
    set.connect_now();
    wait_until(&set, Duration::from_secs(20), "all ready", |e| {
        e.iter().all(|e| e.state == EndpointState::Ready)
    })
    .await;
    let by = spread(&set, 600).await;
    eprintln!("round robin: {by:?}");
    for who in ["slow", "f1", "f2"] {
        let n = by.get(who).copied().unwrap_or(0);
        assert!((150..=250).contains(&n), "{who}: {n} of 600 ({by:?})");
    }
}

// ---- A50's success-rate and failure-percentage ejection over real replicas ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a50_success_rate_and_failure_percentage_eject_a_replica_failing_every_call() {
    use byteexpress_rpc::balance::{FailurePercentageEjection, SuccessRateEjection};
    let bad = replica("bad", &["--fail-all", "13"]).await;
    let g1 = replica("g1", &[]).await;
    let g2 = replica("g2", &[]).await;
    let addrs = [&bad.addr, &g1.addr, &g2.addr];
    let base = BalanceConfig {
        policy: Policy::RoundRobin,
        outlier: OutlierDetection {
            interval: Duration::from_millis(200),
            base_ejection_time: Duration::from_secs(30),
            max_ejection_percent: 50,
            success_rate_ejection: None,
            failure_percentage_ejection: None,
            consecutive_failures: None,
            ..OutlierDetection::default()
        },
        ..BalanceConfig::default()
    };
    let success_rate = BalanceConfig {
        outlier: OutlierDetection {
            // rates 0, 1, 1: mean 2/3, stdev 0.47; threshold at 1 stdev: 0.195
            success_rate_ejection: Some(SuccessRateEjection {
                stdev_factor: 1000,
                minimum_hosts: 3,
                request_volume: 20,
                ..SuccessRateEjection::default()
            }),
            ..base.outlier.clone()
        },
        ..base.clone()
    };
    let failure_percentage = BalanceConfig {
        outlier: OutlierDetection {
            failure_percentage_ejection: Some(FailurePercentageEjection {
                enforcement_percentage: 100,
                minimum_hosts: 3,
                request_volume: 20,
                ..FailurePercentageEjection::default()
            }),
            ..base.outlier.clone()
        },
        ..base.clone()
    };
    for (bal, reason) in [
        (success_rate, "success_rate"),
        (failure_percentage, "failure_percentage"),
        (base, ""),
    ] {
        let set = ReplicaSet::from_static(addrs, &tcp(), &bal);
        let mut events = set.outlier_events();
        let t0 = Instant::now();
        // calls until the bad replica is ejected, or 1.5 s (7 sweeps) without it
        for _ in 0..100_000 {
            if set.stats().ejections > 0 || t0.elapsed() > Duration::from_millis(1500) {
                break;
            }
            let _ = set.call(echo(Duration::from_secs(5))).await;
        }
        if reason.is_empty() {
            assert_eq!(set.stats().ejections, 0, "both checks off: nothing ejected");
            continue;
        }
        let ev = events.try_recv().expect("an ejection");
        assert_eq!(ev.addr, bad.addr);
        assert_eq!(
            ev.kind,
            OutlierEventKind::Ejected {
                duration: Duration::from_secs(30),
                reason
            }
        );
        let out: Vec<_> = set.endpoints().into_iter().filter(|e| e.ejected).collect();
        assert_eq!(out.len(), 1, "{out:?}");
    }
    drop((g1, g2));
}

// ---- several links to one server ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_shares_one_link_per_server_and_connect_unshared_gives_each_client_its_own() {
    let s = replica("s", &[]).await;
    let sends = |c: &Client| {
        let st = c.link_stats();
        st.chunks_sent + st.bypassed
    };
    let a = Client::connect(&s.addr, &Config::default()).await.unwrap();
    let b = Client::connect(&s.addr, &Config::default()).await.unwrap();
    assert_eq!(a.transport(), rdma_here());
    let before = sends(&b);
    a.call(echo(Duration::from_secs(10))).await.unwrap();
    assert!(sends(&b) > before, "a and b share one link");
    let c = Client::connect_unshared(&s.addr, &Config::default())
        .await
        .unwrap();
    let d = Client::connect_unshared(&s.addr, &Config::default())
        .await
        .unwrap();
    let (c0, d0) = (sends(&c), sends(&d));
    c.call(echo(Duration::from_secs(10))).await.unwrap();
    assert!(sends(&c) > c0);
    assert_eq!(sends(&d), d0, "c and d have links of their own");
    d.call(echo(Duration::from_secs(10))).await.unwrap();
    assert!(sends(&d) > d0);
}
