//! `bx pingpong` against rdma-core's own `ibv_rc_pingpong`, and `bx devices`, on the kernel's
//! Soft-RoCE device `rxe0`. Runs only inside the Soft-RoCE VM (`scripts/vm-tests.sh`, feature
//! `vm-tests`), where `RXE_GID_INDEX` names the IPv4-mapped RoCE v2 GID; a missing device or
//! tool fails, nothing skips. Iteration counts stay small: TCG emulation costs ~560 µs per
//! 4 KiB round trip.

mod pingpong_common;

use std::time::Duration;

use pingpong_common::*;

const RC_PINGPONG: &str = "ibv_rc_pingpong";
const LIMIT: Duration = Duration::from_secs(120);
const ITERS: &str = "100";

fn gid_index() -> String {
    std::env::var("RXE_GID_INDEX").unwrap_or_else(|_| "1".into())
}

/// Runs `server_prog server_args` as the server, waits until it listens on `port`, runs
/// `client_prog client_args` as the client; both outputs.
fn pair(port: u16, server: (&str, &[&str]), client: (&str, &[&str])) -> (Finished, Finished) {
    let mut s = spawn(server.0, server.1);
    wait_listening(port, &mut s, LIMIT);
    let c = finish(spawn(client.0, client.1), LIMIT);
    (finish(s, LIMIT), c)
}

fn assert_all_iterations(who: &str, f: &Finished, iters: u32) {
    assert!(f.status.success(), "{who}: {}", f.both());
    assert_eq!(iters_done(&f.stdout), Some(iters), "{who}: {}", f.both());
}

fn assert_bx_latency_table(f: &Finished) {
    assert!(f.stdout.contains("t_typical[usec]"), "bx: {}", f.both());
    assert!(f.stdout.contains("819200 bytes in"), "bx: {}", f.both());
}

#[test]
fn bx_server_serves_ibv_rc_pingpong_on_the_default_port() {
    let g = gid_index();
    let (bx, rc) = pair(
        18515,
        (BX, &["pingpong", "-d", "rxe0", "-g", &g, "-n", ITERS]),
        (
            RC_PINGPONG,
            &["-d", "rxe0", "-g", &g, "-n", ITERS, "localhost"],
        ),
    );
    assert_all_iterations("bx pingpong (server)", &bx, 100);
    assert_all_iterations("ibv_rc_pingpong (client)", &rc, 100);
    assert_bx_latency_table(&bx);
}

#[test]
fn bx_client_talks_to_an_ibv_rc_pingpong_server() {
    let g = gid_index();
    let port = free_port().to_string();
    let (rc, bx) = pair(
        port.parse().unwrap(),
        (
            RC_PINGPONG,
            &["-d", "rxe0", "-g", &g, "-n", ITERS, "-p", &port],
        ),
        (
            BX,
            &[
                "pingpong",
                "-d",
                "rxe0",
                "-g",
                &g,
                "-n",
                ITERS,
                "-p",
                &port,
                "localhost",
            ],
        ),
    );
    assert_all_iterations("ibv_rc_pingpong (server)", &rc, 100);
    assert_all_iterations("bx pingpong (client)", &bx, 100);
    assert_bx_latency_table(&bx);
}

#[test]
fn bx_client_sleeping_on_cq_events_talks_to_ibv_rc_pingpong_with_events() {
    let g = gid_index();
    let port = free_port().to_string();
    let (rc, bx) = pair(
        port.parse().unwrap(),
        (
            RC_PINGPONG,
            &[
                "-d", "rxe0", "-g", &g, "-e", "-n", "50", "-s", "64", "-p", &port,
            ],
        ),
        (
            BX,
            &[
                "pingpong",
                "-d",
                "rxe0",
                "-g",
                &g,
                "-e",
                "-n",
                "50",
                "-s",
                "64",
                "-p",
                &port,
                "localhost",
            ],
        ),
    );
    assert_all_iterations("ibv_rc_pingpong (server)", &rc, 50);
    assert_all_iterations("bx pingpong (client)", &bx, 50);
}

/// `-g 0` is not the device's own choice (index 1): bx must really use the link-local GID,
/// which it announces in its "local address" line and rc_pingpong routes to.
#[test]
fn gid_index_flag_selects_another_gid_than_the_default() {
    let port = free_port().to_string();
    let (bx, rc) = pair(
        port.parse().unwrap(),
        (
            BX,
            &["pingpong", "-d", "rxe0", "-g", "0", "-n", "20", "-p", &port],
        ),
        (
            RC_PINGPONG,
            &[
                "-d",
                "rxe0",
                "-g",
                "0",
                "-n",
                "20",
                "-p",
                &port,
                "localhost",
            ],
        ),
    );
    assert_all_iterations("bx pingpong (server)", &bx, 20);
    assert_all_iterations("ibv_rc_pingpong (client)", &rc, 20);
    let local = bx
        .stdout
        .lines()
        .find(|l| l.contains("local address"))
        .unwrap_or("");
    assert!(local.contains("GID fe80:"), "{}", bx.both());
}

#[test]
fn two_bx_complete_every_iteration_over_rxe0() {
    let port = free_port().to_string();
    let (s, c) = pair(
        port.parse().unwrap(),
        (BX, &["pingpong", "-d", "rxe0", "-n", ITERS, "-p", &port]),
        (
            BX,
            &[
                "pingpong",
                "-d",
                "rxe0",
                "-n",
                ITERS,
                "-p",
                &port,
                "localhost",
            ],
        ),
    );
    assert_all_iterations("bx pingpong (server)", &s, 100);
    assert_all_iterations("bx pingpong (client)", &c, 100);
    assert_bx_latency_table(&c);
}

#[test]
fn devices_lists_rxe0_with_the_ipv4_mapped_gid_at_index_1_in_use() {
    let f = finish(spawn(BX, &["devices"]), LIMIT);
    assert!(f.status.success(), "{}", f.both());
    assert!(
        f.stdout.starts_with("hca_id:\trxe0\t(rdma-core)\n"),
        "{}",
        f.both()
    );
    assert!(!f.stdout.contains("no RDMA device"), "{}", f.both());
    let ip = std::env::var("RXE_IP").unwrap_or_else(|_| "10.0.2.15".into());
    let want = format!("GID[  1]:\t\t::ffff:{ip}, RoCE v2 (used by QPs)");
    assert!(f.stdout.contains(&want), "{want}: {}", f.both());
    assert!(f.stdout.contains("GID[  0]:\t\tfe80:"), "{}", f.both());
    assert!(f.stdout.contains("active_mtu:\t\t1024"), "{}", f.both());
    assert!(
        f.stdout.contains("hca_id:\tsoft0\t(soft, userspace)"),
        "{}",
        f.both()
    );
}

/// `-g` and `BX_GID_INDEX` naming different GIDs: the error says which came from where.
#[test]
fn a_gid_index_from_g_that_conflicts_with_bx_gid_index_names_both() {
    let g = gid_index();
    let other = if g == "0" { "1" } else { "0" };
    let f = finish(
        spawn_env(
            BX,
            &["pingpong", "-d", "rxe0", "-g", other, "-n", "1"],
            &[("BX_GID_INDEX", &g)],
        ),
        LIMIT,
    );
    assert!(!f.status.success(), "{}", f.both());
    let want = format!("GID index {other} (from -g) conflicts with BX_GID_INDEX={g}");
    assert!(f.stderr.contains(&want), "{want:?}: {}", f.both());
    assert!(!f.stderr.contains("Some("), "{}", f.both());
}
