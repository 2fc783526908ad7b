//! Issue 20 item 4: the RDMA send path's admission gates (`byteexpress_flow::gate`) are counted
//! per gate in `LinkStats::gate_refusals` and in `bx_send_gate_refusals_total{gate}`, each
//! refusal under the gate that made it. Links here are starved of one resource at a time: the
//! device window, the QP window, send-queue slots, credits. (The CQ-entry and send-buffer
//! gates cannot refuse first in this engine, whose CQ holds both queues and whose send pool
//! has a buffer per send slot: their rules are tested in `byteexpress-flow/tests/gate_order.rs`.)
//!
//! One test in this binary: the device window is one account per device and process, capped
//! by the first link, and the metrics recorder is global.

use std::time::Duration;

use byteexpress_rpc::{Client, Config, GateRefusals, LinkStats, Request, TransportPref};
use bytes::Bytes;
use integration_tests::ServerProc;

const SERVER: &str = env!("CARGO_BIN_EXE_bx-test-server");

fn echo(len: usize, seed: usize) -> (Request, Bytes) {
    let body: Bytes = (0..len).map(|j| (j + seed) as u8).collect();
    let req = Request {
        method: "/test.Test/Echo".into(),
        body: body.clone(),
        timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    };
    (req, body)
}

/// `n` concurrent echoes of `len` bytes on `client`, every answer checked; the link's stats
/// after them.
async fn echoes(client: &Client, n: usize, len: usize) -> LinkStats {
    let calls = (0..n).map(|i| async move {
        let (req, body) = echo(len, i);
        let resp = client.call(req).await.expect("echo");
        assert!(resp.body == body, "call {i}");
    });
    futures::future::join_all(calls).await;
    let st = client.link_stats();
    assert_eq!((st.qp_errors, st.rnr_errors), (0, 0), "{st:?}");
    st
}

async fn connect(addr: &str, cfg: Config) -> Client {
    Client::connect(
        addr,
        &Config {
            transport: TransportPref::Rdma,
            ..cfg
        },
    )
    .await
    .expect("RDMA link")
}

/// The value of `bx_send_gate_refusals_total` with `gate="name"`, summed over its series.
fn metric(text: &str, gate: &str) -> u64 {
    text.lines()
        .filter(|l| {
            l.starts_with("bx_send_gate_refusals_total{") && l.contains(&format!("gate=\"{gate}\""))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_starved_resource_is_counted_under_its_own_gate_in_stats_and_metrics() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics_text = recorder.handle();
    metrics::set_global_recorder(recorder).expect("no recorder installed before");
    let server = ServerProc::start(SERVER, &[]).await;
    let mut links = Vec::new();

    // The device window: this first link caps the device at 1 byte (one SEND at a time over
    // all the device's links, the single-chunk escape), its own QP window unlimited. Small
    // calls at once, so a round has several to post: the first goes, the second waits.
    let dev_link = connect(
        &server.addr,
        Config {
            device_window_bytes: 1,
            window_bytes: 0,
            ..Config::default()
        },
    )
    .await;
    let st = echoes(&dev_link, 64, 1000).await;
    let g = st.gate_refusals;
    assert!(g.device_window > 0, "{st:?}");
    assert_eq!(
        g.qp_window, 0,
        "an unlimited QP window never refuses: {st:?}"
    );
    links.push(dev_link);

    // The QP window: 1 byte, so each SEND waits for the one before. Alone on the device,
    // a chunk the QP admits (its window empty) finds the device empty too.
    let qp_link = connect(
        &server.addr,
        Config {
            window_bytes: 1,
            ..Config::default()
        },
    )
    .await;
    let st = echoes(&qp_link, 64, 1000).await;
    let g = st.gate_refusals;
    assert!(g.qp_window > 0, "{st:?}");
    assert_eq!(g.device_window, 0, "the QP's gate comes first: {st:?}");
    assert_eq!(st.window_blocked, g.qp_window + g.device_window);
    links.push(qp_link);

    // Send-queue slots: one, for 64 calls at once. Its one send buffer would refuse too, but
    // the slot's gate comes first.
    let sq_link = connect(
        &server.addr,
        Config {
            max_send_wr: 1,
            ..Config::default()
        },
    )
    .await;
    let st = echoes(&sq_link, 64, 100).await;
    let g = st.gate_refusals;
    assert!(g.sq_slot > 0, "{st:?}");
    assert_eq!((g.send_buf, g.cq_entry), (0, 0), "{st:?}");
    links.push(sq_link);

    // Credits: a grant of 1, 64 calls at once.
    let credit_link = connect(
        &server.addr,
        Config {
            grant: 1,
            ..Config::default()
        },
    )
    .await;
    let st = echoes(&credit_link, 64, 100).await;
    let g = st.gate_refusals;
    assert!(g.credit > 0, "{st:?}");
    assert_eq!(st.credit_blocked, g.credit);
    links.push(credit_link);

    // The metric counts what the links' stats count, gate by gate (read until both agree:
    // an idle link may still count a credit update's refusal between the two reads).
    let names = [
        "sq_slot",
        "cq_entry",
        "send_buf",
        "credit",
        "qp_window",
        "device_window",
    ];
    let mut last = (Vec::new(), Vec::new(), String::new());
    for _ in 0..100 {
        let mut stats = vec![0u64; 6];
        for l in &links {
            let g: GateRefusals = l.link_stats().gate_refusals;
            for (i, n) in [
                g.sq_slot,
                g.cq_entry,
                g.send_buf,
                g.credit,
                g.qp_window,
                g.device_window,
            ]
            .into_iter()
            .enumerate()
            {
                stats[i] += n;
            }
        }
        let text = metrics_text.render();
        let recorded: Vec<u64> = names.iter().map(|n| metric(&text, n)).collect();
        if recorded == stats {
            return;
        }
        last = (stats, recorded, text);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "stats {:?} and metrics {:?} by gate {names:?}:\n{}",
        last.0, last.1, last.2
    );
}
