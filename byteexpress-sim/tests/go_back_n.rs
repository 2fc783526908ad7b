//! RC go-back-N through the network: with PFC off and a shallow port, an RDMA incast loses
//! packets, and every message still arrives whole, in order, by NAK-driven resends.

use byteexpress_sim::config::{EcnMode, SimConfig};
use byteexpress_sim::event::FlowId;
use byteexpress_sim::world::{App, World};

/// Records each delivery as (flow, token).
#[derive(Default)]
struct Log(Vec<(FlowId, u64)>);

impl App for Log {
    fn delivered(&mut self, _: &mut World, f: FlowId, t: u64) {
        self.0.push((f, t));
    }
    fn acked(&mut self, _: &mut World, _: FlowId, _: u64) {}
    fn compute_done(&mut self, _: &mut World, _: u32) {}
}

#[test]
fn lost_packets_are_resent_and_every_message_arrives_whole_in_order() {
    let mut cfg = SimConfig::default();
    cfg.net.pfc = false;
    cfg.net.ecn = EcnMode::Off;
    cfg.net.port_buffer_bytes = 64 << 10;
    cfg.dcqcn.enabled = false;
    let n = 8u16;
    let mut w = World::new(cfg, n as usize + 1);
    let flows: Vec<FlowId> = (0..n).map(|s| w.add_rc_flow(s, n)).collect();
    for &f in &flows {
        for t in 1..=3u64 {
            w.send(f, 300_000, t);
        }
    }
    let mut log = Log::default();
    w.run(&mut log, 5_000_000_000, |l| l.0.len() == 3 * n as usize);
    assert!(w.switch.stats.drops > 0, "the shallow port dropped nothing");
    let resent: u64 = flows.iter().map(|&f| w.flows[f as usize].resent()).sum();
    assert!(resent > 0);
    for &f in &flows {
        let got: Vec<u64> = log.0.iter().filter(|d| d.0 == f).map(|d| d.1).collect();
        assert_eq!(got, vec![1, 2, 3], "flow {f}: messages in order, each once");
        assert_eq!(
            w.flows[f as usize].delivered_bytes, 900_000,
            "flow {f}: every byte once"
        );
    }
}
