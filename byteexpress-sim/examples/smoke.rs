use byteexpress_sim::arms::{self, Arm};
use byteexpress_sim::config::SimConfig;
use byteexpress_sim::report;
use byteexpress_sim::rpc::WindowMode;

fn main() {
    let mut cfg = SimConfig::default();
    let args: Vec<String> = std::env::args().collect();
    cfg.trace.workers = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(8);
    cfg.trace.steps = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let mut rows = vec![];
    for arm in [
        Arm::Dctcp,
        Arm::NewReno,
        Arm::Dcqcn,
        Arm::Bx { window: WindowMode::Static(256 << 10), device_window: 0 },
        Arm::Bx { window: WindowMode::Adaptive { min: 64 << 10, max: 4 << 20, target_us: 30 }, device_window: 0 },
    ] {
        match arms::run(&cfg, arm) {
            Ok(r) => { eprintln!("{} wall {:.2}s pkts/s {:.0} events {} refusals {:?} minwin {}", r.arm, r.wall_s, r.packets_per_s, r.events, r.gate_refusals, r.min_window_bytes); rows.push(r) }
            Err(e) => eprintln!("{arm:?}: {e} {:?}", std::error::Error::source(&e)),
        }
    }
    println!("{}", report::table(&rows));
}
