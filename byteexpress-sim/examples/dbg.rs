use byteexpress_sim::config::SimConfig;
use byteexpress_sim::world::{NoApp, World};
const MS: u64 = 1_000_000;
fn main() {
    let mut cfg = SimConfig::default();
    cfg.net.link_bps = 40_000_000_000;
    let mut w = World::new(cfg, 3);
    let a = w.add_rc_flow(0, 2);
    let b = w.add_rc_flow(1, 2);
    w.send(a, 4 << 30, 1);
    for k in 1..=40u64 {
        if k == 3 { w.send(b, 4 << 30, 2); }
        w.run(&mut NoApp, k * 5 * MS, |_| false);
        eprintln!("{} ms: a {} b {} rates {:?} {:?} xoff {} marks {} q {} timeouts {} {}", k*5, w.flows[0].delivered_bytes, w.flows[1].delivered_bytes, w.flows[0].rate_bps(), w.flows[1].rate_bps(), w.switch.stats.xoff_frames, w.switch.stats.marks, w.switch.ports[2].bytes, w.flows[0].timeouts, w.flows[1].timeouts);
    }
}
