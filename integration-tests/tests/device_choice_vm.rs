//! Which device a link takes, on the kernel's Soft-RoCE device `rxe0` with the userspace soft
//! device `soft0` visible too. Runs only inside the Soft-RoCE VM (`scripts/vm-tests.sh`,
//! feature `vm-tests`); a missing `rxe0` fails, nothing skips.
//!
//! - `BX_TRANSPORT=rdma` (`Config::transport = Rdma`) takes hardware when it exists: the link
//!   is on rxe0, and it is never moved to soft0 even where soft0 alone would reach the peer;
//!   `rdma-any` (`Config::allow_soft`) and `auto` may take soft0 there.
//! - An invalid `BX_GID_INDEX` (out of range, an empty slot, not a number) is an error naming
//!   the index, rxe0 and its valid GID entries, under `rdma` and `auto` alike; no link is made.

use std::process::Stdio;
use std::time::Duration;

use byteexpress_rpc::{Client, Config, Metadata, Request, Transport, TransportPref};
use bytes::Bytes;
use integration_tests::ServerProc;

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
const BX: &str = env!("CARGO_BIN_EXE_bx-facade");
/// Set in the child copy of this test binary that connects under a bad `BX_GID_INDEX`.
const CHILD: &str = "BX_DEVICE_CHOICE_CHILD";

fn cfg(t: TransportPref, allow_soft: bool) -> Config {
    Config {
        transport: t,
        allow_soft,
        connect_timeout: Duration::from_secs(30),
        ..Config::default()
    }
}

fn echo() -> Request {
    Request {
        method: "/test.Test/Echo".into(),
        metadata: Metadata::new(),
        body: Bytes::from_static(b"which device?"),
        timeout: Some(Duration::from_secs(30)),
    }
}

fn assert_both_devices_listed() {
    let names: Vec<String> = byteexpress_verbs::devices()
        .iter()
        .map(|d| d.name().to_string())
        .collect();
    assert!(names.iter().any(|n| n == "rxe0"), "no rxe0 in {names:?}");
    assert!(names.iter().any(|n| n == "soft0"), "no soft0 in {names:?}");
}

/// `Client::transport` and the server's own view (`x-transport`) name the same device.
async fn assert_link_on(client: &Client, device: &'static str) {
    assert_eq!(client.transport(), Transport::Rdma { device });
    let r = client.call(echo()).await.expect("echo");
    assert_eq!(
        r.metadata.get("x-transport").map(|v| &v[..]),
        Some(format!("rdma({device})").as_bytes()),
        "server-side transport"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_with_rxe0_present_links_on_rxe0_never_soft0() {
    assert_both_devices_listed();
    let server = ServerProc::start(SERVER, &[]).await;
    let client = Client::connect(&server.addr, &cfg(TransportPref::Rdma, false))
        .await
        .expect("connect");
    assert_link_on(&client, "rxe0").await;
    // the soft device allowed: hardware still comes first
    let client = Client::connect(&server.addr, &cfg(TransportPref::Rdma, true))
        .await
        .expect("connect");
    assert_link_on(&client, "rxe0").await;
}

/// A server whose rxe0 is refused (its own bad `BX_GID_INDEX`) offers only soft0, which this
/// host's soft0 reaches. `rdma` must not move to soft0 because of that; `rdma-any` and `auto` may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_is_never_moved_to_soft0_when_only_soft0_reaches_the_peer() {
    assert_both_devices_listed();
    let server = ServerProc::start_env(SERVER, &[], &[("BX_GID_INDEX", "99")]).await;
    let err = Client::connect(&server.addr, &cfg(TransportPref::Rdma, false))
        .await
        .expect_err("rdma must not take soft0 while rxe0 exists");
    assert!(
        err.message.contains("none of rxe0 reaches"),
        "{}",
        err.message
    );
    let client = Client::connect(&server.addr, &cfg(TransportPref::Rdma, true))
        .await
        .expect("rdma-any connects");
    assert_link_on(&client, "soft0").await;
    let client = Client::connect(&server.addr, &cfg(TransportPref::Auto, false))
        .await
        .expect("auto connects");
    assert_link_on(&client, "soft0").await;
}

/// The valid GID indexes of rxe0 (as this process opened it; IPv6 addresses may add entries
/// later, so other processes may see more).
fn rxe0_gids() -> Vec<u32> {
    let ctx = byteexpress_verbs::devices()
        .into_iter()
        .find(|d| d.name() == "rxe0")
        .expect("rxe0")
        .open()
        .expect("rxe0 opens");
    ctx.gids().iter().map(|g| g.index).collect()
}

/// `bx ps bench --transports rdma` (the bench and its server child both under `bad`): fails,
/// naming the index, rxe0 and every valid entry; no link set up on either side.
#[test]
fn an_invalid_gid_index_fails_the_bench_naming_index_device_and_valid_entries() {
    let valid = rxe0_gids();
    assert!(!valid.is_empty(), "rxe0 has no valid GID");
    // an empty slot of rxe0's 1024-entry table, an index beyond it, not a number
    for bad in ["99", "100000", "x"] {
        for transport in ["rdma", "rdma-any"] {
            let out = std::process::Command::new(BX)
                .args(["ps", "bench", "--transports", "rdma", "--duration", "0.2"])
                .args(["--warmup", "0", "--keys", "100", "--workers", "1"])
                // a small key ring: drawing the default 8 Mi keys took 58 s per run in the VM
                // (debug build, emulated CPU), before the bench failed as it should
                .args(["--ring-keys", "4096"])
                .env("BX_GID_INDEX", bad)
                .env("BX_TRANSPORT", transport)
                .stdin(Stdio::null())
                .output()
                .expect("run bx ps bench");
            let err = String::from_utf8_lossy(&out.stderr);
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(!out.status.success(), "{bad}/{transport}: {stdout}\n{err}");
            assert!(
                err.contains(&format!("BX_GID_INDEX={bad}"))
                    || err.contains(&format!("BX_GID_INDEX=\"{bad}\"")),
                "{bad}: {err}"
            );
            assert!(err.contains("on rxe0; valid entries: "), "{bad}: {err}");
            for i in &valid {
                assert!(
                    err.contains(&format!("{i} (")),
                    "{bad}: entry {i} missing: {err}"
                );
            }
            assert!(!stdout.contains("bx/rdma"), "{bad}: a row ran: {stdout}");
            assert!(
                !err.contains("link set up"),
                "{bad}: a link was made: {err}"
            );
            assert!(
                !err.contains("link accepted"),
                "{bad}: a link was made: {err}"
            );
        }
    }
}

/// Under `auto` too: the child copy of this test connects with `BX_GID_INDEX` set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_gid_index_fails_auto_too_instead_of_moving_to_another_device() {
    if let Ok(addr) = std::env::var(CHILD) {
        // the child: report what connecting under auto gives
        match Client::connect(&addr, &cfg(TransportPref::Auto, false)).await {
            Ok(c) => println!("CONNECTED {}", c.transport()),
            Err(e) => println!("ERROR {}", e.message),
        }
        return;
    }
    let server = ServerProc::start(SERVER, &[]).await;
    let out = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "an_invalid_gid_index_fails_auto_too_instead_of_moving_to_another_device",
            "--nocapture",
        ])
        .env(CHILD, &server.addr)
        .env("BX_GID_INDEX", "99")
        .output()
        .await
        .expect("run the child");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("ERROR ") || l.starts_with("CONNECTED "))
        .unwrap_or_else(|| panic!("no result from the child: {text}"));
    assert!(line.starts_with("ERROR "), "{line}");
    assert!(line.contains("BX_GID_INDEX=99"), "{line}");
    assert!(line.contains("on rxe0; valid entries: "), "{line}");
}
