//! The simulator's speed (issue 26: at least 10⁶ simulated packets per second on one core,
//! and a 256-worker step with 4 MiB shards in at most 30 s). Run:
//! `cargo bench -p byteexpress-sim --bench speed`. Single-threaded; prints what it measured.
//!
//! 1. Packets: 64 RDMA senders with DCQCN into one port for 50 ms of simulated time; packets
//!    put on a wire (data and control, NIC transmissions) per wall-clock second.
//! 2. A training step: 256 workers, 4 MiB shards, one step (push and pull) in arm 2 (DCQCN) and
//!    arm 3 (static 256 KiB window): wall-clock time of the whole run, set-up included.

use std::time::Instant;

use byteexpress_sim::arms::{self, Arm};
use byteexpress_sim::config::SimConfig;
use byteexpress_sim::rpc::WindowMode;
use byteexpress_sim::world::{NoApp, World};

fn packets() {
    let cfg = SimConfig::default();
    let senders = 64u16;
    let mut w = World::new(cfg, senders as usize + 1);
    for s in 0..senders {
        let f = w.add_rc_flow(s, senders);
        w.send(f, 1 << 40, 1);
    }
    let t0 = Instant::now();
    w.run(&mut NoApp, 50_000_000, |_| false);
    let wall = t0.elapsed().as_secs_f64();
    println!(
        "packets: {} packets ({} data) and {} events in 50 ms simulated, {:.3} s wall: {:.2} M packets/s, {:.2} M events/s",
        w.packets,
        w.data_packets,
        w.events(),
        wall,
        w.packets as f64 / wall / 1e6,
        w.events() as f64 / wall / 1e6
    );
}

fn step() {
    let mut cfg = SimConfig::default();
    cfg.trace.workers = 256;
    cfg.trace.steps = 1;
    for arm in [
        Arm::Dcqcn,
        Arm::Bx {
            window: WindowMode::Static(256 << 10),
            device_window: 0,
        },
    ] {
        let t0 = Instant::now();
        let r = arms::run(&cfg, arm).expect("run");
        println!(
            "step: N = 256, 4 MiB shards, {}: {:.3} s wall ({:.1} ms simulated, {} packets, {:.2} M packets/s)",
            r.arm,
            t0.elapsed().as_secs_f64(),
            r.sim_ms,
            r.packets,
            r.packets_per_s / 1e6
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this too, so keep it short.
    packets();
    step();
}
