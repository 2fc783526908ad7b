//! The rows of `bx ps bench` that measure transports (issue 25): `floor/tcp`, `native/rdma`,
//! `native/tcp` and `tonic/inproc` run briefly, their calls checked by the bench (the init
//! before measuring, every answer's shape while measuring), with CPU and syscalls per call,
//! and per-row medians over rounds with ratios to the floor; and pushes through the native
//! and floor ports of `bx ps serve` land in the store the tonic ports serve.

mod pingpong_common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use byteexpress_ps::native::{self, Method, PULL_PATH, PUSH_PATH};
use byteexpress_ps::pb::ps::PullRequest;
use byteexpress_ps::pb::ps::parameter_server_client::ParameterServerClient;
use byteexpress_ps::{decode_f32s, init_value};
use bytes::Bytes;
use pingpong_common::*;

const LIMIT: Duration = Duration::from_secs(120);

/// Whether `perf stat` can count this machine's syscalls (the rows then print numbers, else
/// `n/a`).
fn perf_counts() -> bool {
    Command::new("perf")
        .args([
            "stat",
            "-x",
            ",",
            "-e",
            "raw_syscalls:sys_enter",
            "--",
            "true",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map(|o| bx::ps::usage::parse_perf_count(&String::from_utf8_lossy(&o.stderr)).is_some())
        .unwrap_or(false)
}

/// The values of `field` in every row of the JSON whose transport starts with `prefix`.
fn field_of(json: &str, prefix: &str, field: &str) -> Vec<String> {
    json.lines()
        .filter(|l| l.contains(&format!("\"transport\": \"{prefix}")))
        .map(|l| {
            let at = l.find(&format!("\"{field}\": ")).expect(field) + field.len() + 4;
            l[at..].split([',', '}']).next().unwrap().trim().to_string()
        })
        .collect()
}

/// A fresh directory for one test's bench output, and the JSON file's path in it.
fn json_dir(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("bx-{name}-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join(format!("{name}.json"));
    (dir, json)
}

#[test]
fn the_transport_rows_run_interleaved_answer_correctly_and_report_medians_against_the_floor() {
    let (dir, json) = json_dir("rows");
    let f = finish(
        spawn(
            BX,
            &[
                "ps",
                "bench",
                "--transports",
                "floor/tcp,native/rdma,native/tcp,tonic/inproc",
                "--keys",
                "1000",
                "--keys-per-call",
                "8",
                "--workers",
                "2",
                "--in-flight",
                "4",
                "--push-ratio",
                "0.3",
                "--ring-keys",
                "5000",
                "--duration",
                "0.3",
                "--warmup",
                "0",
                "--rounds",
                "2",
                "--json",
                json.to_str().unwrap(),
            ],
        ),
        LIMIT,
    );
    assert!(f.status.success(), "{}", f.both());
    assert!(
        f.stderr
            .contains("keys drawn before measuring: a ring of 5000 keys"),
        "{}",
        f.both()
    );
    let j = std::fs::read_to_string(&json).unwrap();
    let perf = perf_counts();
    for (prefix, server_measured) in [
        ("floor/tcp", true),
        ("native/rdma(", true),
        ("native/tcp", true),
        ("tonic/inproc", false),
    ] {
        let calls = field_of(&j, prefix, "calls");
        assert_eq!(calls.len(), 2, "{prefix}: one row per round\n{j}");
        assert!(
            calls.iter().all(|c| c.parse::<u64>().unwrap() > 0),
            "{prefix}: no calls\n{j}"
        );
        assert_eq!(field_of(&j, prefix, "round"), ["0", "1"], "{j}");
        let sys = field_of(&j, prefix, "client_syscalls");
        assert!(
            sys.iter().all(|v| (v != "null") == perf),
            "{prefix}: syscalls {sys:?} with perf {perf}"
        );
        let server = field_of(&j, prefix, "server_cpu_us");
        assert!(
            server.iter().all(|v| (v != "null") == server_measured),
            "{prefix}: server CPU {server:?}"
        );
    }
    // the medians: one line per row, the floor's ratio to itself 1.00x
    let medians: Vec<&str> = f
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("median of rounds"))
        .collect();
    assert_eq!(medians.len(), 5, "{}", f.stdout);
    assert!(medians[1].starts_with("floor/tcp"), "{}", f.stdout);
    assert!(medians[1].contains(" 1.00x "), "{}", f.stdout);
    assert!(
        medians[1..].iter().all(|l| l.contains("x ")),
        "every row has a ratio: {}",
        f.stdout
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--idle`: after its calls each row keeps its connections open for the idle phase and
/// reports both processes' CPU then, in % of one core (the server's unknown for tonic/inproc,
/// whose server is the client process).
#[test]
fn an_idle_phase_reports_each_rows_cpu_while_its_connections_stay_open() {
    let (dir, json) = json_dir("idle");
    let f = finish(
        spawn(
            BX,
            &[
                "ps",
                "bench",
                "--transports",
                "floor/tcp,native/rdma,rdma,tonic/inproc",
                "--keys",
                "1000",
                "--keys-per-call",
                "8",
                "--workers",
                "2",
                "--in-flight",
                "4",
                "--ring-keys",
                "5000",
                "--duration",
                "0.2",
                "--warmup",
                "0",
                "--idle",
                "0.6",
                "--json",
                json.to_str().unwrap(),
            ],
        ),
        LIMIT,
    );
    assert!(f.status.success(), "{}", f.both());
    assert!(
        f.stdout
            .lines()
            .next()
            .unwrap_or("")
            .contains("idle client %"),
        "{}",
        f.stdout
    );
    let j = std::fs::read_to_string(&json).unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    for (prefix, server_measured) in [
        ("floor/tcp", true),
        ("native/rdma(", true),
        ("bx/rdma(", true),
        ("tonic/inproc", false),
    ] {
        let secs: Vec<f64> = field_of(&j, prefix, "idle_s")
            .iter()
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(secs.len(), 1, "{prefix}\n{j}");
        assert!(secs[0] >= 0.6, "{prefix}: the idle phase lasts --idle\n{j}");
        let in_range = |v: &str| {
            let v: f64 = v.parse().unwrap();
            (0.0..=100.0 * cores).contains(&v)
        };
        let client = field_of(&j, prefix, "idle_client_core_pct");
        assert!(in_range(&client[0]), "{prefix}: {client:?}\n{j}");
        let server = field_of(&j, prefix, "idle_server_core_pct");
        if server_measured {
            assert!(in_range(&server[0]), "{prefix}: {server:?}\n{j}");
        } else {
            assert_eq!(server, ["null"], "{prefix}\n{j}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--idle` that is not a number of seconds (NaN, infinite, negative) is refused before
/// anything starts, not a panic in the middle of the bench (a reviewer's find).
#[test]
fn an_idle_phase_that_is_not_a_number_of_seconds_is_refused() {
    for bad in ["--idle=nan", "--idle=inf", "--idle=-1"] {
        let f = finish(
            spawn(BX, &["ps", "bench", "--transports", "tcp", bad]),
            LIMIT,
        );
        assert!(!f.status.success(), "{bad}: {}", f.both());
        assert!(
            f.both().contains("--idle must be") && !f.both().contains("panicked"),
            "{bad}: {}",
            f.both()
        );
    }
}

/// A `bx ps serve` with its native and floor ports; its `NATIVE`, `FLOOR` and `LISTENING`
/// addresses. Killed on drop.
struct Serve {
    child: std::process::Child,
    native: String,
    floor: String,
    tonic: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve() -> Serve {
    let mut child = Command::new(BX)
        .args([
            "ps",
            "serve",
            "--dim",
            "4",
            "--native-addr",
            "127.0.0.1:0",
            "--floor-addr",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = |prefix: &str| {
        let l = lines.next().expect("a line").unwrap();
        l.strip_prefix(prefix)
            .unwrap_or_else(|| panic!("{l:?} is not {prefix}"))
            .to_string()
    };
    let (native, floor, tonic) = (next("NATIVE "), next("FLOOR "), next("LISTENING "));
    Serve {
        child,
        native,
        floor,
        tonic,
    }
}

#[tokio::test(flavor = "current_thread")]
async fn pushes_through_the_native_and_floor_ports_land_in_the_store_the_tonic_port_serves() {
    let s = serve();
    // 2^-10 per push keeps every value exact in f32
    let step = 2f32.powi(-10);
    let grads = Bytes::from(
        std::iter::repeat_n(step.to_le_bytes(), 4)
            .flatten()
            .collect::<Vec<u8>>(),
    );
    let key = 77u64;
    let push = native::push_request("emb", vec![key], grads, 1.0);
    for transport in [
        byteexpress::TransportPref::Rdma,
        byteexpress::TransportPref::Tcp,
    ] {
        let cfg = byteexpress::Config {
            transport,
            ..Default::default()
        };
        let c = byteexpress_rpc::Client::connect(&s.native, &cfg)
            .await
            .unwrap();
        assert_eq!(
            c.transport().kind(),
            format!("{transport:?}").to_lowercase()
        );
        c.call(byteexpress_rpc::Request {
            method: PUSH_PATH.into(),
            body: Bytes::from(push.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let mut floor = bx::ps::floor::connect(&s.floor).await.unwrap();
    bx::ps::floor::call(&mut floor, Method::Push, &push)
        .await
        .unwrap();
    let want: Vec<f32> = (0..4)
        .map(|i| init_value("emb", key, i) - 3.0 * step)
        .collect();
    // pulled back through all three doors
    let body = native::pull_request("emb", vec![key]);
    let a = bx::ps::floor::call(&mut floor, Method::Pull, &body)
        .await
        .unwrap();
    assert_eq!(
        decode_f32s(&native::pull_response(a).unwrap().1),
        want,
        "floor"
    );
    let c = byteexpress_rpc::Client::connect(&s.native, &Default::default())
        .await
        .unwrap();
    let a = c
        .call(byteexpress_rpc::Request {
            method: PULL_PATH.into(),
            body: Bytes::from(body.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        decode_f32s(&native::pull_response(a.body).unwrap().1),
        want,
        "native"
    );
    let ch = byteexpress::Channel::connect(&format!("bx://{}", s.tonic))
        .await
        .unwrap();
    let r = ParameterServerClient::new(ch)
        .pull(PullRequest {
            table: "emb".into(),
            keys: vec![key],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decode_f32s(&r.values), want, "tonic facade");
    // a bad request is refused, not answered
    let e = bx::ps::floor::call(&mut floor, Method::Pull, &[0xff, 0xff])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("does not decode"), "{e}");
}
