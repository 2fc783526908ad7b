//! A TCP link writes what its callers queued together in one vectored write (issue 25: TCP
//! writes coalesced across calls). 64 calls started together on a current-thread runtime are
//! all queued before the link's write task runs; it must send them with a handful of
//! `writev(2)` calls, not one per call. Write syscalls are counted by the kernel
//! (`/proc/self/io` `syscw`, which counts write, writev and their kin per process); the test
//! is alone in its binary so no other test's writes are counted.

use std::time::Duration;

use byteexpress_rpc::{Client, Config, Request, TransportPref};
use bytes::Bytes;
use integration_tests::ServerProc;

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
const CALLS: usize = 64;

/// Write syscalls this process has made so far.
fn write_syscalls() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io");
    io.lines()
        .find_map(|l| l.strip_prefix("syscw: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("syscw in /proc/self/io")
}

#[tokio::test(flavor = "current_thread")]
async fn sixty_four_calls_queued_together_leave_in_a_few_writes_not_one_each() {
    let server = ServerProc::start(SERVER, &["--transport", "tcp"]).await;
    let cfg = Config {
        transport: TransportPref::Tcp,
        ..Config::default()
    };
    let client = Client::connect(&server.addr, &cfg).await.expect("connect");
    let call = |i: usize| {
        client.call(Request {
            method: "/test.Test/Echo".into(),
            body: Bytes::from(format!("call {i}")),
            timeout: Some(Duration::from_secs(10)),
            ..Default::default()
        })
    };
    // warm up: the link and its tasks exist, lazily made things are made
    call(0).await.expect("warm-up call");
    let before = write_syscalls();
    let answers = futures::future::join_all((0..CALLS).map(call)).await;
    let writes = write_syscalls() - before;
    for (i, a) in answers.into_iter().enumerate() {
        let a = a.unwrap_or_else(|s| panic!("call {i}: {s:?}"));
        assert_eq!(a.body, Bytes::from(format!("call {i}")));
    }
    assert!(
        writes <= 8,
        "{CALLS} calls queued together took {writes} write syscalls"
    );
}
