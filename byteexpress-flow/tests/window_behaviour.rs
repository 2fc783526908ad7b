//! Unit tests of the window: static and BDP caps, the single-chunk escape, the device cap,
//! and each rule of the adaptive (AIMD) mode.

use byteexpress_flow::window::{
    AdaptiveConfig, Adjust, Blocked, DeviceWindow, Limit, Window, WindowError, bdp_bytes,
};

const KIB: u64 = 1024;

fn adaptive(min: u64, max: u64, target_us: u64) -> AdaptiveConfig {
    AdaptiveConfig::new(min, max, target_us).unwrap()
}

#[test]
fn bdp_is_bandwidth_times_rtt_rounded_up() {
    // 100 Gbit/s × 10 µs.
    assert_eq!(bdp_bytes(12_500_000_000, 10), 125_000);
    assert_eq!(bdp_bytes(1, 1), 1);
    assert_eq!(bdp_bytes(0, 10), 0);
    assert_eq!(bdp_bytes(u64::MAX, u64::MAX), u64::MAX);
    assert_eq!(Window::from_bdp(12_500_000_000, 10).unwrap().cap(), 125_000);
    assert_eq!(Window::from_bdp(0, 10).unwrap_err(), WindowError::ZeroCap);
    assert_eq!(DeviceWindow::from_bdp(1_000_000, 1).unwrap().cap(), 1);
}

#[test]
fn invalid_configurations_are_rejected() {
    assert_eq!(Window::fixed(0).unwrap_err(), WindowError::ZeroCap);
    assert_eq!(DeviceWindow::new(0).unwrap_err(), WindowError::ZeroCap);
    assert_eq!(AdaptiveConfig::new(0, 10, 5), Err(WindowError::ZeroCap));
    assert_eq!(
        AdaptiveConfig::new(11, 10, 5),
        Err(WindowError::BadRange { min: 11, max: 10 })
    );
    assert_eq!(
        AdaptiveConfig::new(1, 10, 0),
        Err(WindowError::ZeroTargetDelay)
    );
    let cfg = adaptive(4, 10, 5);
    assert!(matches!(
        cfg.with_initial(11),
        Err(WindowError::InitialOutOfRange { .. })
    ));
    assert_eq!(
        cfg.with_additive_increase(0),
        Err(WindowError::ZeroIncrease)
    );
    assert_eq!(
        cfg.with_beta_permille(0),
        Err(WindowError::PermilleOutOfRange(0))
    );
    assert_eq!(
        cfg.with_max_decrease_permille(1001),
        Err(WindowError::PermilleOutOfRange(1001))
    );
}

#[test]
fn static_window_blocks_at_cap_and_reopens_on_completion() {
    let mut dev = DeviceWindow::unlimited();
    let mut w = Window::fixed(100).unwrap();
    assert_eq!(w.try_post(&mut dev, 60).unwrap().bytes, 60);
    assert!(!w.try_post(&mut dev, 40).unwrap().over_cap);
    assert_eq!(
        w.try_post(&mut dev, 1),
        Err(Blocked {
            limit: Limit::Qp,
            in_flight: 100,
            cap: 100
        })
    );
    assert!(!w.can_post(&dev, 1));
    assert_eq!(w.on_complete(&mut dev, 60, 5, 5), Ok(Adjust::Hold));
    assert_eq!(
        (w.in_flight(), dev.in_flight(), w.available()),
        (40, 40, 60)
    );
    assert!(w.try_post(&mut dev, 60).is_ok());
    let s = w.stats();
    assert_eq!(
        (s.posted, s.blocked, s.posted_bytes, s.completed_bytes),
        (3, 1, 160, 60)
    );
}

#[test]
fn window_smaller_than_a_chunk_passes_one_chunk_when_empty() {
    let mut dev = DeviceWindow::unlimited();
    let mut w = Window::fixed(4 * KIB).unwrap();
    let t = w.try_post(&mut dev, 64 * KIB).unwrap();
    assert!(t.over_cap);
    // Only one: a second chunk waits.
    assert_eq!(w.try_post(&mut dev, 1).unwrap_err().limit, Limit::Qp);
    w.on_complete(&mut dev, t.bytes, 5, 5).unwrap();
    assert!(w.try_post(&mut dev, 64 * KIB).unwrap().over_cap);
    assert_eq!(w.stats().escapes, 2);
}

#[test]
fn device_cap_applies_across_qps() {
    let mut dev = DeviceWindow::new(100).unwrap();
    let mut a = Window::fixed(80).unwrap();
    let mut b = Window::fixed(80).unwrap();
    let _ = a.try_post(&mut dev, 70).unwrap();
    // b's own cap admits 40, the device does not.
    assert_eq!(
        b.try_post(&mut dev, 40),
        Err(Blocked {
            limit: Limit::Device,
            in_flight: 70,
            cap: 100
        })
    );
    assert_eq!(b.in_flight(), 0, "nothing charged on refusal");
    let _ = b.try_post(&mut dev, 30).unwrap();
    assert_eq!(dev.in_flight(), 100);
    a.on_complete(&mut dev, 70, 5, 5).unwrap();
    let _ = b.try_post(&mut dev, 40).unwrap();
    assert_eq!(dev.in_flight(), 70);
}

#[test]
fn empty_device_passes_one_oversized_post() {
    let mut dev = DeviceWindow::new(10).unwrap();
    let mut w = Window::fixed(1000).unwrap();
    assert!(w.try_post(&mut dev, 500).unwrap().over_cap);
    assert_eq!(w.try_post(&mut dev, 1).unwrap_err().limit, Limit::Device);
}

#[test]
fn overcompletion_is_an_error_and_changes_nothing() {
    let mut dev = DeviceWindow::unlimited();
    let mut w = Window::fixed(100).unwrap();
    let _ = w.try_post(&mut dev, 10).unwrap();
    assert_eq!(
        w.on_complete(&mut dev, 11, 1, 1),
        Err(WindowError::Overcomplete {
            limit: Limit::Qp,
            bytes: 11,
            in_flight: 10
        })
    );
    let mut other_dev = DeviceWindow::unlimited();
    assert_eq!(
        w.on_complete(&mut other_dev, 10, 1, 1).unwrap_err(),
        WindowError::Overcomplete {
            limit: Limit::Device,
            bytes: 10,
            in_flight: 0
        }
    );
    assert_eq!((w.in_flight(), dev.in_flight()), (10, 10));
}

#[test]
fn adaptive_grows_by_the_increase_once_per_window_of_completions_below_target() {
    let cfg = adaptive(10 * KIB, 1024 * KIB, 50)
        .with_initial(100 * KIB)
        .unwrap()
        .with_additive_increase(8 * KIB)
        .unwrap();
    let mut dev = DeviceWindow::unlimited();
    let mut w = Window::adaptive(cfg);
    let _ = w.try_post(&mut dev, 100 * KIB).unwrap();
    // 99 KiB completed: not yet a window's worth.
    assert_eq!(w.on_complete(&mut dev, 99 * KIB, 20, 20), Ok(Adjust::Hold));
    assert_eq!(w.cap(), 100 * KIB);
    assert_eq!(w.on_complete(&mut dev, KIB, 20, 21), Ok(Adjust::Increased));
    assert_eq!(w.cap(), 108 * KIB);
}

#[test]
fn adaptive_delay_at_target_holds() {
    let mut dev = DeviceWindow::unlimited();
    let mut w = Window::adaptive(adaptive(1, 100, 50).with_initial(10).unwrap());
    for t in 0..10 {
        let _ = w.try_post(&mut dev, 10).unwrap();
        assert_eq!(w.on_complete(&mut dev, 10, 50, t * 100), Ok(Adjust::Hold));
    }
    assert_eq!(w.cap(), 10);
}

#[test]
fn adaptive_decrease_is_proportional_to_excess_delay() {
    // beta 1000 ‰, max cut 1000 ‰: cut = (rtt - target) / rtt of the window.
    let cfg = adaptive(1, 1_000_000, 100)
        .with_beta_permille(1000)
        .unwrap()
        .with_max_decrease_permille(1000)
        .unwrap();
    let cut_after = |rtt| {
        let mut dev = DeviceWindow::unlimited();
        let mut w = Window::adaptive(cfg);
        let _ = w.try_post(&mut dev, 1).unwrap();
        assert_eq!(w.on_complete(&mut dev, 1, rtt, 1000), Ok(Adjust::Decreased));
        1_000_000 - w.cap()
    };
    assert_eq!(cut_after(125), 200_000); // 20 % above-target share
    assert_eq!(cut_after(200), 500_000);
    assert_eq!(cut_after(400), 750_000);
    // Barely above target still cuts at least one byte.
    assert!(cut_after(101) >= 1);
}

#[test]
fn adaptive_cut_is_bounded_by_max_decrease() {
    let cfg = adaptive(1, 1000, 10)
        .with_beta_permille(1000)
        .unwrap()
        .with_max_decrease_permille(300)
        .unwrap();
    let mut dev = DeviceWindow::unlimited();
    let mut w = Window::adaptive(cfg);
    let _ = w.try_post(&mut dev, 1).unwrap();
    w.on_complete(&mut dev, 1, 1_000_000, 0).unwrap();
    assert_eq!(w.cap(), 700);
}

#[test]
fn adaptive_decreases_at_most_once_per_rtt() {
    let mut dev = DeviceWindow::unlimited();
    let mut w = Window::adaptive(adaptive(1, 1_000_000, 100));
    for _ in 0..4 {
        let _ = w.try_post(&mut dev, 1).unwrap();
    }
    assert_eq!(w.on_complete(&mut dev, 1, 300, 1000), Ok(Adjust::Decreased));
    let after_first = w.cap();
    // Within one RTT (300 µs) of the decrease: hold.
    assert_eq!(w.on_complete(&mut dev, 1, 300, 1299), Ok(Adjust::Hold));
    assert_eq!(w.cap(), after_first);
    // One RTT later: decrease again.
    assert_eq!(w.on_complete(&mut dev, 1, 300, 1300), Ok(Adjust::Decreased));
    assert!(w.cap() < after_first);
    assert_eq!(w.stats().decreases, 2);
}

#[test]
fn adaptive_window_stays_clamped() {
    let mut dev = DeviceWindow::unlimited();
    let mut w = Window::adaptive(
        adaptive(1000, 2000, 10)
            .with_additive_increase(5000)
            .unwrap()
            .with_initial(1500)
            .unwrap(),
    );
    let _ = w.try_post(&mut dev, 1500).unwrap();
    w.on_complete(&mut dev, 1500, 1, 1).unwrap();
    assert_eq!(w.cap(), 2000);
    let mut now = 1;
    for _ in 0..50 {
        now += 1_000_000;
        let _ = w.try_post(&mut dev, 1).unwrap();
        w.on_complete(&mut dev, 1, 1_000_000, now).unwrap();
    }
    assert_eq!(w.cap(), 1000);
    assert_eq!(w.adaptive_config().unwrap().min(), 1000);
    assert!(Window::fixed(5).unwrap().adaptive_config().is_none());
}
