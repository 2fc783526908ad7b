//! Issue 26, "Validation first": the simulator reproduces four known behaviours before any
//! claim is made from it. (The crate is built at opt-level 2 in the test profile, so each runs
//! in about a second.)

use byteexpress_sim::arms::{self, Arm};
use byteexpress_sim::config::{EcnMode, SimConfig};
use byteexpress_sim::event::FlowId;
use byteexpress_sim::rpc::WindowMode;
use byteexpress_sim::world::{App, NoApp, World};

const MS: u64 = 1_000_000;

/// Jain's fairness index of `x`: (Σx)² / (n Σx²).
fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    s * s / (x.len() as f64 * q)
}

#[test]
fn two_dcqcn_flows_on_a_40g_bottleneck_converge_to_a_fair_share() {
    let mut cfg = SimConfig::default();
    cfg.net.link_bps = 40_000_000_000;
    let mut w = World::new(cfg, 3);
    let a = w.add_rc_flow(0, 2);
    let b = w.add_rc_flow(1, 2);
    // Flow a runs alone at line rate for 10 ms, then b joins: b must win its share from a.
    w.send(a, 4 << 30, 1);
    w.run(&mut NoApp, 10 * MS, |_| false);
    w.send(b, 4 << 30, 2);
    w.run(&mut NoApp, 150 * MS, |_| false);
    let pauses_before = w.switch.stats.xoff_frames;
    // Last 50 ms: throughput and DCQCN rate per 5 ms bin.
    let mut tput_jain = Vec::new();
    let mut rate_jain = Vec::new();
    let mut total_gbps = Vec::new();
    for k in 1..=10u64 {
        let before = [
            w.flows[a as usize].delivered_bytes,
            w.flows[b as usize].delivered_bytes,
        ];
        w.run(&mut NoApp, 150 * MS + k * 5 * MS, |_| false);
        let got: Vec<f64> = [a, b]
            .iter()
            .zip(before)
            .map(|(&f, b0)| (w.flows[f as usize].delivered_bytes - b0) as f64 * 8.0 / 5e6)
            .collect();
        tput_jain.push(jain(&got));
        total_gbps.push(got.iter().sum::<f64>());
        let rates: Vec<f64> = [a, b]
            .iter()
            .map(|&f| w.flows[f as usize].rate_bps().expect("DCQCN on"))
            .collect();
        rate_jain.push(jain(&rates));
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (tj, rj, tot) = (mean(&tput_jain), mean(&rate_jain), mean(&total_gbps));
    eprintln!("throughput Jain {tj:.4}, rate Jain {rj:.4}, total {tot:.2} Gb/s");
    assert!(tj >= 0.95, "throughput Jain's index {tj}");
    assert!(rj >= 0.95, "DCQCN rate Jain's index {rj}");
    // DCQCN, not PFC, shares the link: no pause in the last 50 ms, and the link stays busy.
    assert_eq!(
        w.switch.stats.xoff_frames, pauses_before,
        "PFC paused in the last 50 ms"
    );
    assert!(tot > 0.8 * 40.0, "bottleneck utilization {tot} Gb/s");
}

/// Bytes the innocent flow (host 0 → host 33) delivers between 2 and 10 ms, and the XOFF frames
/// sent, with `senders` hosts (0..senders) sending line rate into host 32 and no congestion
/// control.
fn innocent_flow(senders: u16) -> (u64, u64) {
    let mut cfg = SimConfig::default();
    cfg.dcqcn.enabled = false;
    cfg.net.ecn = EcnMode::Off;
    let mut w = World::new(cfg, 34);
    for s in 0..senders {
        let f = w.add_rc_flow(s, 32);
        w.send(f, 1 << 30, 1);
    }
    let innocent = w.add_rc_flow(0, 33);
    w.send(innocent, 1 << 30, 2);
    w.run(&mut NoApp, 2 * MS, |_| false);
    let b0 = w.flows[innocent as usize].delivered_bytes;
    w.run(&mut NoApp, 10 * MS, |_| false);
    (
        w.flows[innocent as usize].delivered_bytes - b0,
        w.switch.stats.xoff_frames,
    )
}

#[test]
fn pfc_pauses_from_an_incast_stop_an_innocent_flow_sharing_the_upstream_port() {
    // Alone, host 0 splits its link between its incast flow and the innocent flow.
    let (alone, alone_pauses) = innocent_flow(1);
    // With 31 more senders into host 32, the switch pauses host 0's whole link (PFC is per
    // ingress queue): the innocent flow, whose path (port 33) is idle, stops with it.
    let (incast, pauses) = innocent_flow(32);
    let gbps = |b: u64| b as f64 * 8.0 / 8e6;
    eprintln!(
        "innocent flow: alone {:.1} Gb/s ({alone_pauses} XOFF), in incast {:.1} Gb/s ({pauses} XOFF)",
        gbps(alone),
        gbps(incast)
    );
    assert_eq!(alone_pauses, 0);
    assert!(gbps(alone) > 40.0, "alone: {} Gb/s", gbps(alone));
    assert!(pauses > 0, "the incast made no PFC pause");
    assert!(
        (incast as f64) < 0.25 * alone as f64,
        "head-of-line blocking not shown: {} vs {} Gb/s",
        gbps(incast),
        gbps(alone)
    );
}

/// Counts deliveries down to zero, noting when the last came.
struct Done {
    left: usize,
    at: u64,
}

impl App for Done {
    fn delivered(&mut self, w: &mut World, _: FlowId, _: u64) {
        self.left -= 1;
        self.at = w.now;
    }
    fn acked(&mut self, _: &mut World, _: FlowId, _: u64) {}
    fn compute_done(&mut self, _: &mut World, _: u32) {}
}

/// Goodput (fraction of the link) of `n` NewReno senders each sending `bytes` at once into one
/// port capped at `port_cap` bytes (0: the shared buffer's dynamic threshold).
fn newreno_incast(n: u16, bytes: u64, port_cap: u64) -> (f64, u64) {
    let mut cfg = SimConfig::default();
    cfg.net.pfc = false;
    cfg.net.ecn = EcnMode::Off;
    cfg.net.port_buffer_bytes = port_cap;
    cfg.tcp.dctcp = false;
    let link = cfg.net.link_bps as f64;
    let mut w = World::new(cfg, n as usize + 1);
    let flows: Vec<_> = (0..n).map(|s| w.add_tcp_flow(s, n)).collect();
    for &f in &flows {
        w.send(f, bytes, 1);
    }
    let want = bytes * u64::from(n);
    // Runs until the last message is delivered; `done.at` is when (ns).
    let mut done = Done {
        left: n as usize,
        at: 0,
    };
    w.run(&mut done, 20_000 * MS, |d| d.left == 0);
    assert_eq!(done.left, 0, "incast did not finish in 20 s");
    let done_at = done.at;
    let timeouts = flows.iter().map(|&f| w.flows[f as usize].timeouts).sum();
    (want as f64 * 8.0 / (done_at as f64 / 1e9) / link, timeouts)
}

#[test]
fn newreno_incast_with_a_shallow_port_buffer_collapses_below_20_percent_goodput() {
    for n in [32u16, 64] {
        let (g, timeouts) = newreno_incast(n, 256 << 10, 128 << 10);
        eprintln!(
            "N = {n}: goodput {:.2} % of the link, {timeouts} RTOs",
            g * 100.0
        );
        assert!(g < 0.20, "N = {n}: goodput {g}");
        assert!(timeouts > 0);
    }
    // The same incast with the shared buffer's 3.5 MB per port does not collapse: the collapse
    // above is the shallow buffer's losses waiting out the 200 ms RTO floor.
    let (g, _) = newreno_incast(32, 256 << 10, 0);
    eprintln!("N = 32, deep buffer: goodput {:.2} %", g * 100.0);
    assert!(g > 0.5, "deep buffer goodput {g}");
}

#[test]
fn the_same_seed_gives_the_same_numbers() {
    let mut cfg = SimConfig::default();
    cfg.trace.workers = 24;
    cfg.trace.steps = 3;
    cfg.trace.compute_jitter_ns = 200_000;
    let arm = Arm::Bx {
        window: WindowMode::Adaptive {
            min: 64 << 10,
            max: 1 << 20,
            target_us: 30,
        },
        device_window: 0,
    };
    let key = |seed: u64| {
        let mut c = cfg.clone();
        c.seed = seed;
        let r = arms::run(&c, arm).expect("run");
        (
            r.lat_us_sorted.clone(),
            r.pfc_pause_frames,
            r.pfc_pause_ms.to_bits(),
            r.max_queue_bytes,
            r.ecn_marks,
            r.cnps,
            r.events,
            r.packets,
            r.sim_ms.to_bits(),
        )
    };
    let a = key(7);
    assert_eq!(a, key(7), "same seed, different run");
    // The seed is used (RED marking, compute jitter): another seed gives another run.
    assert_ne!(a, key(8), "the seed changed nothing");
}
