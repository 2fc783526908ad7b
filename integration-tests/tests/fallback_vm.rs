//! Issue 20's VM acceptance test of the RDMA→TCP fallback: in the Soft-RoCE VM, a server on
//! side a and a client on side b of `scripts/vm-fallback-net.sh`'s topology (a veth pair with an
//! rxe device on each end, TCP on the same veth); under load, RoCE v2 (UDP 4791) is dropped at
//! side b: calls continue over TCP (`transport()` shows `tcp(fallback)`); the rule removed, they
//! return to RDMA. Prints the times from the rule to the first status line on TCP and from its
//! removal to the first on RDMA.
//!
//! Needs root in the VM, `nft` (`RXE_VM_EXTRA_PKGS=nftables`) and the netfilter modules of the
//! VM's kernel (`scripts/vm-fallback-net.sh host-prep` on the host first). Run alone:
//! `cargo test -p integration-tests --features vm-tests --test fallback_vm --no-run`, then in
//! the VM `BX_SOFT=0 BX_PROVIDER=ibverbs <binary> --exact
//! calls_move_to_tcp_when_roce_is_dropped_and_back_to_rdma_when_it_returns`.
//!
//! The client runs in side b's view (only its rxe device visible), so it is this binary run
//! again through the script, as [`client_load`], which prints one status line every 200 ms.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use byteexpress_rpc::{Client, Config, Request, TransportPref};
use bytes::Bytes;
use integration_tests::ServerProc;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
const NET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/vm-fallback-net.sh");
/// Side a's address (the server's), from the script.
const SERVER_IP: &str = "10.78.0.1";
/// The environment variable that makes [`client_load`] run, naming the server's address.
const CLIENT_ENV: &str = "BX_FALLBACK_SERVER";
/// Calls in flight on the client.
const IN_FLIGHT: usize = 8;
/// How long each phase may take to show (generous: TCG is slow, and the link must notice the
/// dead path and move).
const PHASE: Duration = Duration::from_secs(90);

fn net(args: &[&str]) {
    let st = std::process::Command::new("bash")
        .arg(NET)
        .args(args)
        .status()
        .expect("run vm-fallback-net.sh");
    assert!(st.success(), "vm-fallback-net.sh {args:?}: {st}");
}

/// The script's topology, taken down when the test ends, passed or not.
struct Topology;

impl Drop for Topology {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(NET)
            .arg("down")
            .status();
    }
}

/// One status line of [`client_load`]: `fallback: transport=T ok=N failed=N`.
#[derive(Debug, Clone)]
struct Status {
    transport: String,
    ok: u64,
    failed: u64,
}

fn parse(line: &str) -> Option<Status> {
    let rest = line.strip_prefix("fallback: ")?;
    let mut it = rest.split(' ');
    let transport = it.next()?.strip_prefix("transport=")?.to_string();
    let ok = it.next()?.strip_prefix("ok=")?.parse().ok()?;
    let failed = it.next()?.strip_prefix("failed=")?.parse().ok()?;
    Some(Status {
        transport,
        ok,
        failed,
    })
}

/// The client's status lines, read as they come.
struct StatusLines {
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    last: Option<Status>,
}

impl StatusLines {
    /// Reads status lines until `want(first, line)` holds, within [`PHASE`] (`first`: the
    /// last line read before this call, or all zero); returns that line and how long it took.
    async fn wait_for(
        &mut self,
        what: &str,
        want: impl Fn(&Status, &Status) -> bool,
    ) -> (Status, Duration) {
        let from = self.last.clone().unwrap_or(Status {
            transport: String::new(),
            ok: 0,
            failed: 0,
        });
        let t0 = Instant::now();
        loop {
            let left = PHASE.saturating_sub(t0.elapsed());
            let line = tokio::time::timeout(left, self.lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("{what}: not within {PHASE:?}; last {:?}", self.last))
                .expect("client stdout")
                .unwrap_or_else(|| panic!("{what}: the client ended; last {:?}", self.last));
            let Some(st) = parse(&line) else { continue };
            self.last = Some(st.clone());
            if want(&from, &st) {
                return (st, t0.elapsed());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_move_to_tcp_when_roce_is_dropped_and_back_to_rdma_when_it_returns() {
    let started = Instant::now();
    net(&["up"]);
    let _topology = Topology;
    let mut server = ServerProc::start_env(
        "bash",
        &[
            NET,
            "exec",
            "a",
            SERVER,
            "--addr",
            &format!("{SERVER_IP}:0"),
        ],
        &[("BX_SOFT", "0")],
    )
    .await;
    let me = std::env::current_exe().expect("this test binary");
    let mut client = Command::new("bash")
        .arg(NET)
        .args(["exec", "b"])
        .arg(&me)
        .args(["--ignored", "--exact", "client_load", "--nocapture"])
        .env(CLIENT_ENV, &server.addr)
        .env("BX_SOFT", "0")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the client on side b");
    let mut status = StatusLines {
        lines: BufReader::new(client.stdout.take().expect("stdout")).lines(),
        last: None,
    };
    let (on_rdma, _) = status
        .wait_for("calls on RDMA", |_, s| {
            s.transport == "rdma(bxb)" && s.ok >= 20
        })
        .await;
    net(&["drop"]);
    let (fell_back, to_tcp) = status
        .wait_for("the link on tcp(fallback)", |_, s| {
            s.transport == "tcp(fallback)"
        })
        .await;
    let (on_tcp, _) = status
        .wait_for("calls continuing over TCP", |from, s| {
            s.transport == "tcp(fallback)" && s.ok >= from.ok + 20
        })
        .await;
    net(&["undrop"]);
    let (back, to_rdma) = status
        .wait_for("the link back on RDMA", |_, s| s.transport == "rdma(bxb)")
        .await;
    let (on_rdma_again, _) = status
        .wait_for("calls on RDMA again", |from, s| {
            s.transport == "rdma(bxb)" && s.ok >= from.ok + 20
        })
        .await;
    let _ = client.kill().await;
    server.kill().await;
    println!(
        "fallback_vm: RDMA {on_rdma:?}; rule → tcp(fallback) in {to_tcp:?} ({fell_back:?}), \
         on TCP {on_tcp:?}; rule removed → RDMA in {to_rdma:?} ({back:?}), {on_rdma_again:?}; \
         {:?} in all",
        started.elapsed()
    );
    assert_eq!(
        on_rdma_again.failed, 0,
        "no call failed across the fallback and the return: {on_rdma_again:?}"
    );
}

/// The client of the test above, run by it on side b (does nothing unless `BX_FALLBACK_SERVER`
/// names the server): [`IN_FLIGHT`] echo loops on one RDMA link, and every 200 ms a line
/// `fallback: transport=T ok=N failed=N` (the link's `transport()`, calls answered, calls
/// failed), until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the client half of calls_move_to_tcp_when_roce_is_dropped_and_back_to_rdma_when_it_returns"]
async fn client_load() {
    let Ok(addr) = std::env::var(CLIENT_ENV) else {
        return;
    };
    let client = Client::connect(
        &addr,
        &Config {
            transport: TransportPref::Rdma,
            ..Config::default()
        },
    )
    .await
    .expect("RDMA link from side b");
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    for i in 0..IN_FLIGHT {
        let (client, ok, failed) = (client.clone(), ok.clone(), failed.clone());
        tokio::spawn(async move {
            let body: Bytes = (0..1024).map(|j| (i + j) as u8).collect();
            loop {
                let req = Request {
                    method: "/test.Test/Echo".into(),
                    body: body.clone(),
                    timeout: Some(Duration::from_secs(60)),
                    ..Default::default()
                };
                match client.call(req).await {
                    Ok(r) if r.body == body => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        });
    }
    loop {
        println!(
            "fallback: transport={} ok={} failed={}",
            client.transport(),
            ok.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
