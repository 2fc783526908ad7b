//! `bx pingpong` and `bx devices` as processes on this host, over the soft device: two `bx`
//! complete every iteration, a peer that breaks the address exchange gets an error message and
//! a non-zero exit (never a panic), and the device listing names soft0 and why rdma-core has
//! no device here. The rdma-core interop runs in the Soft-RoCE VM (`pingpong_vm.rs`).

mod pingpong_common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use pingpong_common::*;

const LIMIT: Duration = Duration::from_secs(60);

/// Server and client `bx pingpong` on `port` with `extra` flags on both; both outputs.
fn bx_pair(port: u16, extra: &[&str]) -> (Finished, Finished) {
    let p = port.to_string();
    let mut args = vec!["pingpong", "-d", "soft0", "-p", &p];
    args.extend_from_slice(extra);
    let mut server = spawn(BX, &args);
    wait_listening(port, &mut server, LIMIT);
    args.push("localhost");
    let client = finish(spawn(BX, &args), LIMIT);
    (finish(server, LIMIT), client)
}

#[test]
fn two_bx_complete_every_iteration_over_soft0() {
    let (server, client) = bx_pair(free_port(), &["-n", "300", "-s", "4096"]);
    for (who, f) in [("server", &server), ("client", &client)] {
        assert!(f.status.success(), "{who}: {}", f.both());
        assert_eq!(iters_done(&f.stdout), Some(300), "{who}: {}", f.both());
        assert!(f.stdout.contains("2457600 bytes in"), "{who}: {}", f.both());
        assert!(f.stdout.contains("t_typical[usec]"), "{who}: {}", f.both());
    }
}

#[test]
fn two_bx_complete_with_cq_events_tiny_messages_and_a_shallow_receive_queue() {
    let (server, client) = bx_pair(free_port(), &["-e", "-n", "200", "-s", "8", "-r", "2"]);
    for (who, f) in [("server", &server), ("client", &client)] {
        assert!(f.status.success(), "{who}: {}", f.both());
        assert_eq!(iters_done(&f.stdout), Some(200), "{who}: {}", f.both());
    }
}

fn assert_clean_failure(f: &Finished, needle: &str) {
    assert!(!f.status.success(), "{}", f.both());
    assert!(f.stderr.contains(needle), "{}", f.both());
    assert!(!f.stderr.contains("panicked"), "{}", f.both());
}

#[test]
fn a_server_given_a_malformed_address_line_says_so_and_exits_nonzero() {
    let port = free_port();
    let p = port.to_string();
    let mut server = spawn(BX, &["pingpong", "-d", "soft0", "-p", &p]);
    wait_listening(port, &mut server, LIMIT);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut line = *b"0000:000011:abcdef:00000000000000000000ffff0a00020f\0";
    line[7] = b'z';
    s.write_all(&line).unwrap();
    let f = finish(server, LIMIT);
    assert_clean_failure(&f, "malformed peer address line");
}

#[test]
fn a_client_given_a_short_answer_says_so_and_exits_nonzero() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let p = l.local_addr().unwrap().port().to_string();
    let client = spawn(BX, &["pingpong", "-d", "soft0", "-p", &p, "127.0.0.1"]);
    let (mut s, _) = l.accept().unwrap();
    let mut line = [0u8; 52];
    s.read_exact(&mut line).unwrap();
    assert_eq!(line[51], 0, "the client's line is NUL-terminated");
    s.write_all(b"0000:00").unwrap();
    drop(s);
    let f = finish(client, LIMIT);
    assert_clean_failure(&f, "couldn't read the remote address");
    // a peer that gave up mid-exchange is named as such, not as "failed to fill whole buffer"
    assert_clean_failure(&f, "the peer closed the connection during the exchange");
    assert!(!f.stderr.contains("fill whole buffer"), "{}", f.both());
}

#[test]
fn a_peer_that_never_answers_the_exchange_times_out_with_a_message_saying_so() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let p = l.local_addr().unwrap().port().to_string();
    let client = spawn(
        BX,
        &[
            "pingpong",
            "-d",
            "soft0",
            "-p",
            &p,
            "--idle-timeout",
            "1",
            "127.0.0.1",
        ],
    );
    let (mut s, _) = l.accept().unwrap();
    let mut line = [0u8; 52];
    s.read_exact(&mut line).unwrap();
    // never answer; keep the connection open until the client gives up
    let f = finish(client, LIMIT);
    drop(s);
    assert_clean_failure(
        &f,
        "timed out after 1 s waiting for the peer's QP information",
    );
    assert!(!f.stderr.contains("os error 11"), "{}", f.both());
}

/// `-n 4294967295` (the parser's maximum) used to reserve 16 bytes per iteration up front and
/// abort; the statistics now live in a fixed-size histogram. The server stops after 1000
/// exchanges: the client says so and exits non-zero, in bounded memory.
#[test]
fn a_huge_iteration_count_against_a_peer_that_stops_ends_with_a_message_in_bounded_memory() {
    let port = free_port();
    let p = port.to_string();
    let mut server = spawn(
        BX,
        &[
            "pingpong", "-d", "soft0", "-p", &p, "-n", "1000", "-s", "64",
        ],
    );
    wait_listening(port, &mut server, LIMIT);
    let client = spawn(
        BX,
        &[
            "pingpong",
            "-d",
            "soft0",
            "-p",
            &p,
            "-n",
            "4294967295",
            "-s",
            "64",
            "--idle-timeout",
            "3",
            "localhost",
        ],
    );
    let pid = client.id();
    // sample the client's peak RSS while it runs (VmHWM only grows)
    let sampler = std::thread::spawn(move || {
        let mut peak = 0;
        while let Some(kib) = peak_rss_kib(pid) {
            peak = peak.max(kib);
            std::thread::sleep(Duration::from_millis(5));
        }
        peak
    });
    let f = finish(client, LIMIT);
    let peak_kib = sampler.join().unwrap();
    let server = finish(server, LIMIT);
    assert!(server.status.success(), "server: {}", server.both());
    assert_clean_failure(&f, "the peer stopped after");
    assert!(f.stderr.contains("of 4294967295 exchanges"), "{}", f.both());
    assert!(
        f.status.code().is_some(),
        "killed by a signal: {}",
        f.both()
    );
    assert!(peak_kib > 0, "no RSS sample");
    assert!(peak_kib < 64 * 1024, "peak RSS {peak_kib} KiB");
}

#[test]
fn devices_with_the_soft_device_hidden_and_no_rdma_core_device_says_none_was_found() {
    if byteexpress_verbs::ibverbs_devices().is_ok() {
        // a host with rdma-core devices lists them; the message below is for hosts without
        let f = finish(spawn_env(BX, &["devices"], &[("BX_SOFT", "0")]), LIMIT);
        assert!(f.status.success(), "{}", f.both());
        return;
    }
    let f = finish(spawn_env(BX, &["devices"], &[("BX_SOFT", "0")]), LIMIT);
    assert!(!f.status.success(), "{}", f.both());
    assert!(f.stdout.contains("no device found"), "{}", f.both());
    assert!(!f.stdout.contains("soft device below"), "{}", f.both());
    assert!(f.stderr.contains("no RDMA device found"), "{}", f.both());
}

#[test]
fn a_client_without_a_server_says_so_and_exits_nonzero() {
    let p = free_port().to_string();
    let f = finish(
        spawn(BX, &["pingpong", "-d", "soft0", "-p", &p, "127.0.0.1"]),
        LIMIT,
    );
    assert_clean_failure(&f, "couldn't connect to 127.0.0.1");
}

#[test]
fn an_unknown_device_is_an_error_naming_the_devices() {
    let f = finish(spawn(BX, &["pingpong", "-d", "mlx9_9"]), LIMIT);
    assert_clean_failure(&f, "no device \"mlx9_9\"");
    assert!(f.stderr.contains("soft0"), "{}", f.both());
}

#[test]
fn devices_lists_soft0_with_its_limits_and_says_why_rdma_core_has_none() {
    let f = finish(spawn(BX, &["devices"]), LIMIT);
    assert!(f.status.success(), "{}", f.both());
    assert!(
        f.stdout.contains("hca_id:\tsoft0\t(soft, userspace)"),
        "{}",
        f.both()
    );
    for field in [
        "max_qp_wr:",
        "max_sge:",
        "max_inline_data:",
        "max_cqe:",
        "max_mr_size:",
        "active_mtu:",
    ] {
        assert!(f.stdout.contains(field), "{field}: {}", f.both());
    }
    match byteexpress_verbs::ibverbs_devices() {
        Err(e) => {
            let first = f.stdout.lines().next().unwrap_or("");
            assert!(
                first.starts_with("rdma-core: no RDMA device"),
                "{}",
                f.both()
            );
            assert!(first.contains(&e.to_string()), "{}", f.both());
            assert!(first.contains("soft device"), "{}", f.both());
        }
        Ok(names) => {
            for n in names {
                assert!(
                    f.stdout.contains(&format!("hca_id:\t{n}\t")),
                    "{n}: {}",
                    f.both()
                );
            }
        }
    }
}

/// rc_pingpong's fields cannot name a soft QP (no socket address): the constructor says so
/// instead of producing an endpoint that fails later; `bx` sends the full endpoint there.
#[test]
fn soft_endpoints_cannot_be_built_from_rc_pingpong_fields() {
    let ctx = byteexpress_verbs::devices()
        .into_iter()
        .find(|d| d.name() == "soft0")
        .expect("soft0 listed")
        .open()
        .expect("soft0 opens");
    let err = ctx
        .endpoint_for(0x11, 0xabcdef, 0, [0; 16], 1024)
        .unwrap_err();
    assert!(
        matches!(err, byteexpress_verbs::Error::Unsupported(_)),
        "{err:?}"
    );
    assert_eq!(ctx.gid_index(), None);
    assert!(ctx.gids().is_empty());
}
