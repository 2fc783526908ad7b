//! `bx sim incast` as an operator runs it: a tiny trace over every arm, then a sweep; the table
//! on stdout, `--json` with every row and the configuration, `--plot-dir` with the SVG plots,
//! and a flag reaching the simulator (`--link-gbps` halves the rate, so the pushes take longer).

use std::process::Command;

fn bx(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_bx"))
        .args(["sim", "incast"])
        .args(args)
        .output()
        .expect("run bx");
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "bx sim incast {args:?}: {e}");
    (o, e)
}

fn p99(json: &serde_json::Value, arm: &str) -> f64 {
    json["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|r| r["arm"] == arm)
        .and_then(|r| r["push_p99_ms"].as_f64())
        .expect("row")
}

#[test]
fn incast_writes_a_table_json_and_plots_for_every_arm() {
    let dir = std::env::temp_dir().join(format!("bx-sim-test-{}", std::process::id()));
    let json = dir.join("out.json");
    std::fs::create_dir_all(&dir).expect("dir");
    let (out, _) = bx(&[
        "--workers",
        "4",
        "--steps",
        "2",
        "--json",
        json.to_str().expect("utf-8"),
        "--plot-dir",
        dir.to_str().expect("utf-8"),
    ]);
    for arm in [
        "tcp-dctcp",
        "tcp-newreno",
        "rdma-dcqcn",
        "bx-static-256K",
        "bx-adaptive-30us-max4096K",
    ] {
        assert!(
            out.contains(&format!("| {arm} | 4 | 2 |")),
            "{arm} missing in:\n{out}"
        );
    }
    assert!(out.contains("p99 rdma-dcqcn / bx-static-256K"), "{out}");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json")).expect("parse");
    assert_eq!(v["results"].as_array().map(Vec::len), Some(5));
    assert_eq!(v["config"]["trace"]["workers"], 4);
    for f in ["sim-arms-n4-latency-cdf.svg", "sim-arms-n4-queue.svg"] {
        let svg = std::fs::read_to_string(dir.join(f)).expect("plot");
        assert!(svg.starts_with("<svg") && svg.contains("rdma-dcqcn"), "{f}");
    }

    // Half the link rate: 4 × 4 MiB take twice as long to reach the PS.
    let slow = dir.join("slow.json");
    bx(&[
        "--workers",
        "4",
        "--steps",
        "2",
        "--arms",
        "dcqcn",
        "--link-gbps",
        "50",
        "--json",
        slow.to_str().expect("utf-8"),
    ]);
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&slow).expect("json")).expect("parse");
    assert!(p99(&s, "rdma-dcqcn") > 1.5 * p99(&v, "rdma-dcqcn"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sweep_reports_whether_the_adaptive_window_is_within_ten_percent() {
    let (out, _) = bx(&[
        "--sweep",
        "--workers",
        "8",
        "--steps",
        "2",
        "--sweep-windows",
        "65536,262144",
    ]);
    assert!(out.contains("| bx-static-64K | 8 | 2 |"), "{out}");
    assert!(out.contains("| bx-static-256K | 8 | 2 |"), "{out}");
    assert!(out.contains("within 10 %"), "{out}");
}
