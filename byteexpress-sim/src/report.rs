//! Results of a run: per arm, push latency percentiles, PFC pauses, queue depth, goodput, and
//! the simulator's own speed; a text table and JSON.

use std::time::Duration;

use serde::Serialize;

use crate::arms::Arm;
use crate::trace::{Carrier, Trace};
use crate::world::World;

/// What one arm produced.
#[derive(Debug, Clone, Serialize)]
pub struct ArmResult {
    /// The arm's name ([`Arm::name`]).
    pub arm: String,
    /// Workers.
    pub workers: usize,
    /// Steps.
    pub steps: u32,
    /// Push latency percentiles over all pushes of all steps, ms.
    pub push_p50_ms: f64,
    /// 99th percentile, ms.
    pub push_p99_ms: f64,
    /// 99.9th percentile, ms.
    pub push_p999_ms: f64,
    /// Largest push latency, ms.
    pub push_max_ms: f64,
    /// PFC XOFF frames sent by the switch.
    pub pfc_pause_frames: u64,
    /// Time hosts spent paused, summed over hosts, ms.
    pub pfc_pause_ms: f64,
    /// Largest queue at a PS port, bytes.
    pub max_queue_bytes: u64,
    /// Largest shared-buffer occupancy, bytes.
    pub max_buffer_bytes: u64,
    /// Push goodput: shard bytes of all pushes over the summed push phases (first push of a
    /// step queued → last push fully at its PS), Gb/s.
    pub push_goodput_gbps: f64,
    /// Push goodput as a fraction of one PS link times the number of PSs.
    pub push_goodput_frac: f64,
    /// Data packets dropped at the switch.
    pub drops: u64,
    /// Data packets marked CE.
    pub ecn_marks: u64,
    /// CNPs the senders reacted to.
    pub cnps: u64,
    /// Packets resent (go-back-N or TCP).
    pub resent: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// ByteExpress gate refusals (arm 3; 0 otherwise), by gate name.
    pub gate_refusals: Vec<(String, u64)>,
    /// Smallest QP window cap reached (adaptive), bytes; 0 when not arm 3.
    pub min_window_bytes: u64,
    /// Simulated time, ms.
    pub sim_ms: f64,
    /// Packets put on wires.
    pub packets: u64,
    /// Events processed.
    pub events: u64,
    /// Wall-clock time of the run, s.
    pub wall_s: f64,
    /// Simulated packets per wall-clock second.
    pub packets_per_s: f64,
    /// Sorted push latencies, µs (for CDF plots; not in JSON).
    #[serde(skip)]
    pub lat_us_sorted: Vec<f64>,
    /// PS-port queue depth over time: (ms, bytes) per sample bin (not in JSON).
    #[serde(skip)]
    pub queue_samples: Vec<(f64, u64)>,
}

/// The `q`-quantile (0..=1) of sorted `v` (nearest rank), 0 when empty.
pub fn quantile(v: &[u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

impl ArmResult {
    /// Summarizes a finished run.
    pub fn summarize(arm: &Arm, w: &World, t: &Trace, wall: Duration) -> Self {
        let mut lat = t.push_lat_ns.clone();
        lat.sort_unstable();
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut phase_ns = 0u64;
        let mut steps_done = 0u64;
        for (s, e) in t.step_start.iter().zip(&t.step_pushed) {
            if *s != u64::MAX && *e >= *s {
                phase_ns += e - s;
                steps_done += 1;
            }
        }
        let cfg = &w.cfg;
        let push_bytes = cfg.trace.shard_bytes * cfg.trace.workers as u64 * steps_done;
        let gbps = if phase_ns > 0 {
            push_bytes as f64 * 8.0 / phase_ns as f64
        } else {
            0.0
        };
        let cap = cfg.net.link_bps as f64 / 1e9 * cfg.trace.servers.max(1) as f64;
        let n = cfg.trace.workers;
        let ps_ports = n..n + cfg.trace.servers.max(1);
        let max_queue = ps_ports
            .map(|p| w.switch.ports[p].max_bytes)
            .max()
            .unwrap_or(0);
        let (refusals, min_window) = match &t.carrier {
            Carrier::Rdma { rpc, .. } if matches!(arm, Arm::Bx { .. }) => (
                rpc.refusals
                    .iter()
                    .filter(|(_, c)| *c > 0)
                    .map(|(g, c)| (g.name().to_string(), c))
                    .collect(),
                rpc.eps.iter().map(|e| e.min_cap).min().unwrap_or(0),
            ),
            _ => (Vec::new(), 0),
        };
        let wall_s = wall.as_secs_f64();
        ArmResult {
            arm: arm.name(),
            workers: n,
            steps: cfg.trace.steps,
            push_p50_ms: ms(quantile(&lat, 0.5)),
            push_p99_ms: ms(quantile(&lat, 0.99)),
            push_p999_ms: ms(quantile(&lat, 0.999)),
            push_max_ms: ms(lat.last().copied().unwrap_or(0)),
            pfc_pause_frames: w.switch.stats.xoff_frames,
            pfc_pause_ms: w.nics.iter().map(|n| n.pause_ns_at(w.now)).sum::<u64>() as f64 / 1e6,
            max_queue_bytes: max_queue,
            max_buffer_bytes: w.switch.stats.max_used,
            push_goodput_gbps: gbps,
            push_goodput_frac: gbps / cap,
            drops: w.switch.stats.drops,
            ecn_marks: w.switch.stats.marks,
            cnps: w.flows.iter().map(|f| f.cnps()).sum(),
            resent: w.flows.iter().map(|f| f.resent()).sum(),
            timeouts: w.flows.iter().map(|f| f.timeouts).sum(),
            gate_refusals: refusals,
            min_window_bytes: min_window,
            sim_ms: ms(w.now),
            packets: w.packets,
            events: w.events(),
            wall_s,
            packets_per_s: if wall_s > 0.0 {
                w.packets as f64 / wall_s
            } else {
                0.0
            },
            lat_us_sorted: lat.iter().map(|&x| x as f64 / 1e3).collect(),
            queue_samples: w
                .samples
                .iter()
                .map(|&(t, b)| (t as f64 / 1e6, b))
                .collect(),
        }
    }
}

/// A Markdown table of `rows`.
pub fn table(rows: &[ArmResult]) -> String {
    let mut s = String::from(
        "| arm | N | steps | push p50 ms | p99 ms | p99.9 ms | PFC pauses | pause ms | max PS queue KB | push goodput Gb/s | drops | CNPs | timeouts |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {} | {:.2} | {:.0} | {:.1} | {} | {} | {} |\n",
            r.arm,
            r.workers,
            r.steps,
            r.push_p50_ms,
            r.push_p99_ms,
            r.push_p999_ms,
            r.pfc_pause_frames,
            r.pfc_pause_ms,
            r.max_queue_bytes as f64 / 1e3,
            r.push_goodput_gbps,
            r.drops,
            r.cnps,
            r.timeouts,
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(quantile(&v, 0.5), 500);
        assert_eq!(quantile(&v, 0.99), 990);
        assert_eq!(quantile(&v, 0.999), 999);
        assert_eq!(quantile(&[], 0.5), 0);
    }
}
