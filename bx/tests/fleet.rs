//! The parameter server as a fleet, as processes on this host: `bx ps serve --shard I
//! --shards N` refuses keys of other shards; `bx ps bench --servers N --replicas R` starts
//! N×R servers per row, splits calls over them, survives a replica killed mid-phase, and
//! leaves no server behind however it ends.

mod pingpong_common;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use byteexpress::{Channel, Config, TransportPref};
use byteexpress_ps::pb::ps::PullRequest;
use byteexpress_ps::pb::ps::parameter_server_client::ParameterServerClient;
use byteexpress_ps::shard_of;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pingpong_common::*;

const LIMIT: Duration = Duration::from_secs(120);

/// A small, quick fleet workload.
const SMALL: &[&str] = &["--keys", "1000", "--workers", "1", "--in-flight", "8"];

/// A process the test started, killed and reaped when dropped.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The pids of every `bx ps bench: ROW: fleet shard 0: pid P at A, ...` line, per line.
fn fleet_pids(stderr: &str) -> Vec<Vec<u32>> {
    stderr
        .lines()
        .filter(|l| l.contains(": fleet shard 0: "))
        .map(|l| {
            l.split("pid ")
                .skip(1)
                .map(|p| p.split_whitespace().next().unwrap().parse().unwrap())
                .collect()
        })
        .collect()
}

/// Fails the test if one of `pids` is still running 20 s from now (killing it then).
fn assert_all_gone(pids: &[u32]) {
    let t0 = Instant::now();
    for &pid in pids {
        while alive(pid) {
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                panic!("bx ps serve {pid} outlived its bench");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The value of `"field": N` in each row of the bench's JSON.
fn row_numbers(json: &str, field: &str) -> Vec<u64> {
    json.split(&format!("\"{field}\": "))
        .skip(1)
        .map(|r| r.split([',', '}']).next().unwrap().trim().parse().unwrap())
        .collect()
}

/// Runs `bx ps bench` on a fleet of 2 shards x 2 replicas for `transports`, `duration` s
/// measured, with `extra` flags and a JSON file; returns its output and the JSON.
fn bench(transports: &str, duration: &str, extra: &[&str]) -> (Finished, String) {
    let json = std::env::temp_dir().join(format!(
        "bx-fleet-{}-{}.json",
        extra.join(""),
        std::process::id()
    ));
    let mut args = vec!["ps", "bench", "--json", json.to_str().unwrap()];
    args.extend_from_slice(&["--servers", "2", "--replicas", "2", "--warmup", "0.2"]);
    args.extend_from_slice(&["--transports", transports, "--duration", duration]);
    args.extend_from_slice(extra);
    args.extend_from_slice(SMALL);
    let f = finish(spawn_env(BX, &args, &[("RUST_LOG", "warn")]), LIMIT);
    let j = std::fs::read_to_string(&json).unwrap_or_default();
    let _ = std::fs::remove_file(&json);
    (f, j)
}

#[tokio::test]
async fn a_shard_server_refuses_a_key_of_another_shard_with_failed_precondition() {
    let mut serve = KilledOnDrop(spawn(BX, &["ps", "serve", "--shard", "1", "--shards", "2"]));
    let mut line = String::new();
    BufReader::new(serve.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("LISTENING ")
        .expect(&line)
        .to_string();
    let cfg = Config {
        transport: TransportPref::Tcp,
        ..Config::default()
    };
    let ch = Channel::connect_with(&format!("bx://{addr}"), &cfg)
        .await
        .unwrap();
    let mut c = ParameterServerClient::new(ch);
    let own: Vec<u64> = (0..100).filter(|&k| shard_of(k, 2) == 1).collect();
    let foreign = (0..100).find(|&k| shard_of(k, 2) == 0).unwrap();
    let pull = |keys: Vec<u64>| PullRequest {
        table: "emb".into(),
        keys,
    };
    let r = c.pull(pull(own.clone())).await.unwrap().into_inner();
    assert_eq!(r.values.len(), own.len() * 64 * 4);
    let e = c.pull(pull(vec![own[0], foreign])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains(&format!(
            "key {foreign} belongs to shard 0 of 2; this server serves shard 1"
        )),
        "{e:?}"
    );
    // a bad shard setting is refused at start
    let f = finish(
        spawn(BX, &["ps", "serve", "--shard", "2", "--shards", "2"]),
        LIMIT,
    );
    assert!(!f.status.success(), "{}", f.both());
    assert!(f.stderr.contains("shard 2 of 2"), "{}", f.both());
}

#[test]
fn a_fleet_bench_without_faults_splits_calls_over_its_shards_and_fails_none() {
    // a deadline far above any call's time on a loaded machine: no failure but a real one
    let (f, json) = bench("rdma,tcp", "1", &["--deadline-ms", "10000"]);
    assert!(f.status.success(), "{}", f.both());
    let header = f.stdout.lines().next().unwrap();
    assert!(
        header.contains("failed") && header.contains("ejections"),
        "{}",
        f.both()
    );
    assert!(
        f.stdout.contains("bx/rdma(") && f.stdout.contains("bx/tcp"),
        "{}",
        f.both()
    );
    // a fresh fleet of 4 processes per row
    let fleets = fleet_pids(&f.stderr);
    assert_eq!(fleets.len(), 2, "{}", f.both());
    let mut all: Vec<u32> = fleets.concat();
    assert_eq!(all.len(), 8, "{}", f.both());
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 8, "{}", f.both());
    assert_all_gone(&all);
    assert!(
        json.contains("\"servers\": 2, \"replicas\": 2, \"fault\": null"),
        "{json}"
    );
    assert_eq!(row_numbers(&json, "failed"), [0, 0], "{json}");
    assert_eq!(row_numbers(&json, "ejections"), [0, 0], "{json}");
    assert!(row_numbers(&json, "calls").iter().all(|&c| c > 0), "{json}");
}

#[test]
fn a_replica_killed_mid_phase_is_survived_and_no_server_outlives_the_bench() {
    let (f, json) = bench("tcp", "2", &["--fault", "kill", "--fault-at", "0.5"]);
    assert!(f.status.success(), "{}", f.both());
    let fleets = fleet_pids(&f.stderr);
    assert_eq!(fleets.len(), 1, "{}", f.both());
    let victim = fleets[0][0];
    // the kill took effect: the bench reaped its victim, dead by SIGKILL
    assert!(
        f.stderr.contains(&format!(
            "tcp: fault kill at 0.50 s: replica 0 of shard 0 (pid {victim}) got SIGKILL; it exited: signal: 9 (SIGKILL)"
        )),
        "{}",
        f.both()
    );
    // the phase went on: calls after the kill succeeded, failures (if any) counted
    assert_eq!(row_numbers(&json, "failed").len(), 1, "{json}");
    assert!(row_numbers(&json, "calls")[0] > 0, "{json}");
    assert!(json.contains("\"fault\": \"kill\""), "{json}");
    assert_all_gone(&fleets[0]);
}

#[test]
fn a_bench_stopped_while_its_victim_is_stalled_leaves_no_server() {
    let mut args = vec![
        "ps",
        "bench",
        "--servers",
        "1",
        "--replicas",
        "2",
        "--transports",
        "tcp",
        "--duration",
        "60",
        "--warmup",
        "0",
        "--fault",
        "stall",
        "--fault-at",
        "0.2",
    ];
    args.extend_from_slice(SMALL);
    let mut bench = KilledOnDrop(spawn(BX, &args));
    let rx = stderr_lines(&mut bench.0);
    let (line, _) = wait_line(&rx, ": fleet shard 0: ", LIMIT);
    let pids = fleet_pids(&line)[0].clone();
    let (line, _) = wait_line(&rx, "SIGSTOP to pid", LIMIT);
    assert!(line.contains(&format!("pid {}", pids[0])), "{line}");
    kill(Pid::from_raw(bench.0.id() as i32), Signal::SIGTERM).unwrap();
    let st = bench.0.wait().unwrap();
    assert_eq!(st.code(), Some(128 + 15), "{st:?}");
    assert_all_gone(&pids);
}
