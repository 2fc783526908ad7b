//! How far past its deadline a call ends when its only endpoint accepts TCP connections and
//! never answers (issue 18): 1,000 calls with a 200 ms deadline through a lazy
//! `ReplicaSet`, 50 at a time; prints the overrun (time taken − 200 ms) p50/p99/max.
//! `cargo bench -p integration-tests --bench connect_deadline`.

use std::time::{Duration, Instant};

use byteexpress_rpc::{BalanceConfig, Code, Config, Metadata, ReplicaSet, Request, TransportPref};
use bytes::Bytes;
use hdrhistogram::Histogram;
use integration_tests::ServerProc;

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
const CALLS: usize = 1000;
const AT_ONCE: usize = 50;
const DEADLINE: Duration = Duration::from_millis(200);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let hang = ServerProc::start(SERVER, &["--hang"]).await;
    let cfg = Config {
        transport: TransportPref::Tcp,
        ..Config::default()
    };
    let set = ReplicaSet::from_static([&hang.addr], &cfg, &BalanceConfig::default());
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    for _ in 0..CALLS / AT_ONCE {
        let calls = (0..AT_ONCE).map(|_| {
            let set = set.clone();
            async move {
                let t0 = Instant::now();
                let err = set
                    .call(Request {
                        method: "/test.Test/Echo".into(),
                        metadata: Metadata::new(),
                        body: Bytes::from_static(b"x"),
                        timeout: Some(DEADLINE),
                    })
                    .await
                    .expect_err("nothing answers");
                assert_eq!(err.code, Code::DeadlineExceeded, "{err:?}");
                t0.elapsed().saturating_sub(DEADLINE)
            }
        });
        for over in futures::future::join_all(calls).await {
            hist.record(over.as_micros() as u64).expect("record");
        }
    }
    println!(
        "connect_deadline: {} calls, deadline {:?}, overrun p50 {} µs, p99 {} µs, max {} µs",
        hist.len(),
        DEADLINE,
        hist.value_at_quantile(0.5),
        hist.value_at_quantile(0.99),
        hist.max()
    );
}
