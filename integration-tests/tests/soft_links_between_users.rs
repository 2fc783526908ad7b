//! Soft-RDMA links between processes of two users on one host (a new user's trip, issue 22).
//!
//! The soft device lets only processes of its own user, or of `BX_SOFT_ALLOW_UIDS`, connect
//! (`SO_PEERCRED`). A client and a server of different users therefore link over TCP, and a
//! client that requires RDMA fails; that failure named the wrong cause ("no hardware RDMA
//! device on this host", although soft0 was there and was refused). With the uids allowed on
//! both sides, the link is soft RDMA.
//!
//! The server runs as `nobody` (65534): the test runs as root, as CI does; elsewhere it needs
//! `BX_ALLOW_SKIP=soft_links_between_users` to be skipped.

use std::time::Duration;

use integration_tests::ServerProc;
use tokio::io::AsyncReadExt;

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");
const LINK: &str = env!("CARGO_BIN_EXE_bx-test-link");
const NOBODY: u32 = 65534;

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Runs `bx-test-link ADDR` with `env` (it requires RDMA) until it prints its link or fails;
/// returns (linked line or None, its stderr).
async fn link(addr: &str, env: &[(&str, &str)]) -> (Option<String>, String) {
    let mut child = tokio::process::Command::new(LINK)
        .arg(addr)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start bx-test-link");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let mut line = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(30), out.read(&mut line))
        .await
        .expect("bx-test-link answered")
        .unwrap();
    let linked = String::from_utf8_lossy(&line[..n]).trim().to_string();
    drop(child.stdin.take()); // lets a linked child exit
    let mut stderr = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), err.read_to_string(&mut stderr)).await;
    let _ = child.wait().await;
    ((!linked.is_empty()).then_some(linked), stderr)
}

#[tokio::test]
async fn processes_of_two_users_link_over_soft_rdma_only_when_each_allows_the_other() {
    if !running_as_root() {
        let skip = std::env::var("BX_ALLOW_SKIP").unwrap_or_default();
        assert!(
            skip.split(',').any(|s| s == "soft_links_between_users"),
            "needs root to run the server as another user (or BX_ALLOW_SKIP=soft_links_between_users)"
        );
        return;
    }
    // Not allowed: the client requires RDMA and fails, naming the cause.
    let server = ServerProc::start_as(SERVER, &[], &[], Some(NOBODY)).await;
    let (linked, stderr) = link(&server.addr, &[]).await;
    assert_eq!(
        linked, None,
        "no link without the allow-list; stderr: {stderr}"
    );
    assert!(
        stderr.contains("peer unreachable over RDMA") && stderr.contains("BX_SOFT_ALLOW_UIDS"),
        "the error names the cause: {stderr}"
    );
    assert!(
        !stderr.contains("no hardware RDMA device"),
        "the error blames hardware: {stderr}"
    );
    drop(server);
    // Each side allows the other's uid: soft RDMA.
    let server =
        ServerProc::start_as(SERVER, &[], &[("BX_SOFT_ALLOW_UIDS", "0")], Some(NOBODY)).await;
    let allow = NOBODY.to_string();
    let (linked, stderr) = link(&server.addr, &[("BX_SOFT_ALLOW_UIDS", allow.as_str())]).await;
    let linked = linked.unwrap_or_else(|| panic!("no link with both uids allowed: {stderr}"));
    assert!(
        linked.starts_with("LINKED") && linked.contains("soft0"),
        "{linked}"
    );
}
