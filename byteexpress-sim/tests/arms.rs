//! The arms on small traces: each finishes, the ByteExpress arm's READs follow the engine's
//! piece rule, and its windows bound what is in flight.

use byteexpress_sim::arms::{self, Arm};
use byteexpress_sim::config::SimConfig;
use byteexpress_sim::rpc::WindowMode;
use byteexpress_sim::trace::Carrier;
use byteexpress_sim::world::World;

fn small(workers: usize, steps: u32) -> SimConfig {
    let mut c = SimConfig::default();
    c.trace.workers = workers;
    c.trace.steps = steps;
    c.trace.compute_ns = 1_000_000;
    c
}

/// READ WRs posted over the run of `arm`.
fn reads(cfg: &SimConfig, arm: Arm) -> u64 {
    let (mut w, mut t): (World, _) = arms::build(cfg, arm).expect("build");
    t.start(&mut w);
    w.run(&mut t, 10_000_000_000, |t| t.over());
    assert!(t.over() && t.error.is_none(), "{:?}", t.error);
    match &t.carrier {
        Carrier::Rdma { rpc, .. } => rpc.reads,
        Carrier::Tcp { .. } => 0,
    }
}

#[test]
fn every_arm_finishes_a_small_trace_no_faster_than_the_ps_link_allows() {
    let cfg = small(8, 2);
    for arm in [
        Arm::Dctcp,
        Arm::NewReno,
        Arm::Dcqcn,
        Arm::Bx {
            window: WindowMode::Static(256 << 10),
            device_window: 0,
        },
        Arm::Bx {
            window: WindowMode::Adaptive {
                min: 64 << 10,
                max: 4 << 20,
                target_us: 30,
            },
            device_window: 0,
        },
    ] {
        let r = arms::run(&cfg, arm).expect("run");
        assert_eq!(
            r.lat_us_sorted.len(),
            16,
            "{}: one push per worker and step",
            r.arm
        );
        // 8 × 4 MiB through one 100 Gb/s port: the last push cannot finish before 2.68 ms.
        let floor_ms = 8.0 * (4u64 << 20) as f64 * 8.0 / 100e9 * 1e3;
        assert!(r.push_max_ms >= floor_ms, "{}: {} ms", r.arm, r.push_max_ms);
        assert!(
            r.push_goodput_frac <= 1.0,
            "{}: {}",
            r.arm,
            r.push_goodput_frac
        );
    }
}

#[test]
fn read_pieces_are_half_the_window_or_the_largest_read() {
    // 4 MiB + 40-byte header, pushed and pulled by each of 4 workers, 1 step.
    let cfg = small(4, 1);
    let body = (4u64 << 20) + 40;
    // Static 256 KiB window: pieces of 128 KiB (half the window, engine `post_reads`).
    let r = reads(
        &cfg,
        Arm::Bx {
            window: WindowMode::Static(256 << 10),
            device_window: 0,
        },
    );
    assert_eq!(r, 4 * 2 * body.div_ceil(128 << 10));
    // No window: pieces of 1 MiB (READ_PIECE).
    let r = reads(&cfg, Arm::Dcqcn);
    assert_eq!(r, 4 * 2 * body.div_ceil(1 << 20));
}

#[test]
fn a_device_window_keeps_the_ps_queue_below_it_and_pfc_quiet() {
    let cfg = small(32, 2);
    let open = arms::run(
        &cfg,
        Arm::Bx {
            window: WindowMode::Static(4 << 20),
            device_window: 0,
        },
    )
    .expect("run");
    let capped = arms::run(
        &cfg,
        Arm::Bx {
            window: WindowMode::Static(4 << 20),
            device_window: 1 << 20,
        },
    )
    .expect("run");
    assert!(
        open.pfc_pause_frames > 0,
        "4 MiB QP windows × 32 make PFC pause"
    );
    assert_eq!(capped.pfc_pause_frames, 0);
    // The PS reads at most 1 MiB at a time (plus one piece through the escape): its port
    // queue stays near that.
    assert!(
        capped.max_queue_bytes < 2 << 20,
        "{}",
        capped.max_queue_bytes
    );
    assert!(open.max_queue_bytes > 8 << 20, "{}", open.max_queue_bytes);
}

#[test]
fn the_adaptive_window_shrinks_under_incast() {
    let r = arms::run(
        &small(64, 2),
        Arm::Bx {
            window: WindowMode::Adaptive {
                min: 64 << 10,
                max: 4 << 20,
                target_us: 30,
            },
            device_window: 0,
        },
    )
    .expect("run");
    assert_eq!(
        r.min_window_bytes,
        64 << 10,
        "completions far above 30 µs cut it to its floor"
    );
    assert!(
        r.gate_refusals
            .iter()
            .any(|(g, n)| g == "qp_window" && *n > 0)
    );
}
