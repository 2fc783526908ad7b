//! Property tests of the window over random event sequences: posts on several QPs sharing a
//! device account, completions in random order (singly or merged), random RTTs and clocks.

use byteexpress_flow::window::{AdaptiveConfig, Adjust, DeviceWindow, Window};
use proptest::prelude::*;

/// How one QP's window is built.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Static(u64),
    Adaptive {
        min: u64,
        max: u64,
        target_us: u64,
        ai: u64,
        beta: u32,
        max_dec: u32,
    },
}

impl Kind {
    fn build(self) -> Window {
        match self {
            Kind::Static(cap) => Window::fixed(cap).unwrap(),
            Kind::Adaptive {
                min,
                max,
                target_us,
                ai,
                beta,
                max_dec,
            } => Window::adaptive(adaptive(min, max, target_us, ai, beta, max_dec)),
        }
    }
}

fn adaptive(
    min: u64,
    max: u64,
    target_us: u64,
    ai: u64,
    beta: u32,
    max_dec: u32,
) -> AdaptiveConfig {
    AdaptiveConfig::new(min, max, target_us)
        .and_then(|c| c.with_additive_increase(ai))
        .and_then(|c| c.with_beta_permille(beta))
        .and_then(|c| c.with_max_decrease_permille(max_dec))
        .unwrap()
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        (1u64..300_000).prop_map(Kind::Static),
        (
            1u64..100_000,
            0u64..400_000,
            1u64..200,
            1u64..70_000,
            1u32..=1000,
            1u32..=1000
        )
            .prop_map(
                |(min, extra, target_us, ai, beta, max_dec)| Kind::Adaptive {
                    min,
                    max: min + extra,
                    target_us,
                    ai,
                    beta,
                    max_dec,
                }
            ),
    ]
}

#[derive(Debug, Clone, Copy)]
enum Event {
    /// Post `bytes` on QP `q`.
    Post(usize, u64),
    /// Complete the outstanding post picked by `idx` on QP `q`, with RTT (µs), after the
    /// clock advanced by `dt` (µs).
    Complete(usize, usize, u64, u64),
    /// Complete the `n` oldest outstanding posts of QP `q` in one report (merged CQE).
    CompleteMerged(usize, usize, u64, u64),
}

fn event() -> impl Strategy<Value = Event> {
    let q = 0usize..3;
    prop_oneof![
        4 => (q.clone(), 1u64..200_000).prop_map(|(q, b)| Event::Post(q, b)),
        3 => (q.clone(), any::<usize>(), 1u64..600, 0u64..400)
            .prop_map(|(q, i, r, d)| Event::Complete(q, i, r, d)),
        1 => (q, 1usize..5, 1u64..600, 0u64..400)
            .prop_map(|(q, n, r, d)| Event::CompleteMerged(q, n, r, d)),
    ]
}

/// Checks the cap direction of one completion against the RTT and the reported adjustment.
fn check_adjust(w: &Window, before: u64, rtt: u64, adjust: Adjust) -> Result<(), TestCaseError> {
    let after = w.cap();
    match adjust {
        Adjust::Increased => prop_assert!(after > before),
        Adjust::Decreased => prop_assert!(after < before),
        Adjust::Hold => prop_assert_eq!(after, before),
    }
    if let Some(cfg) = w.adaptive_config() {
        prop_assert!(
            (cfg.min()..=cfg.max()).contains(&after),
            "cap {after} escaped clamp"
        );
        let target = cfg.target_delay_us();
        if rtt < target {
            prop_assert!(after >= before, "shrank below target: {before} -> {after}");
        } else if rtt > target {
            prop_assert!(after <= before, "grew above target: {before} -> {after}");
        } else {
            prop_assert_eq!(after, before);
        }
    } else {
        prop_assert_eq!(adjust, Adjust::Hold);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Admission is exactly the rule (never over a cap except the single-chunk escape, never
    /// refused when it fits), accounts match the outstanding posts, the adaptive cap moves
    /// the right way, and once all completes any post passes again.
    #[test]
    fn in_flight_never_exceeds_caps_except_single_chunk_escape(
        kinds in proptest::collection::vec(kind(), 1..=3),
        dev_cap in prop_oneof![Just(None), (1u64..600_000).prop_map(Some)],
        events in proptest::collection::vec(event(), 1..300),
    ) {
        let mut dev = dev_cap.map_or_else(DeviceWindow::unlimited, |c| DeviceWindow::new(c).unwrap());
        let mut qps: Vec<Window> = kinds.iter().map(|k| k.build()).collect();
        let mut outstanding: Vec<Vec<u64>> = vec![Vec::new(); qps.len()];
        let mut now = 0u64;
        for ev in events {
            match ev {
                Event::Post(q, bytes) => {
                    let q = q % qps.len();
                    let w = &mut qps[q];
                    let (qf, qc, df, dc) = (w.in_flight(), w.cap(), dev.in_flight(), dev.cap());
                    let fits_qp = qf == 0 || qf + bytes <= qc;
                    let fits_dev = df == 0 || df + bytes <= dc;
                    prop_assert_eq!(w.can_post(&dev, bytes), fits_qp && fits_dev);
                    match w.try_post(&mut dev, bytes) {
                        Ok(t) => {
                            prop_assert!(fits_qp && fits_dev);
                            prop_assert_eq!(t.bytes, bytes);
                            prop_assert!(w.in_flight() <= qc || qf == 0);
                            prop_assert!(dev.in_flight() <= dc || df == 0);
                            prop_assert_eq!(t.over_cap, qf + bytes > qc || df + bytes > dc);
                            outstanding[q].push(bytes);
                        }
                        Err(b) => {
                            prop_assert!(!(fits_qp && fits_dev), "refused a post that fits");
                            prop_assert_eq!((w.in_flight(), dev.in_flight()), (qf, df));
                            prop_assert_eq!(b.in_flight, if fits_qp { df } else { qf });
                        }
                    }
                }
                Event::Complete(q, idx, rtt, dt) | Event::CompleteMerged(q, idx, rtt, dt) => {
                    let q = q % qps.len();
                    if outstanding[q].is_empty() {
                        continue;
                    }
                    let bytes = if let Event::Complete(..) = ev {
                        let i = idx % outstanding[q].len();
                        outstanding[q].swap_remove(i)
                    } else {
                        let n = idx.min(outstanding[q].len());
                        outstanding[q].drain(..n).sum()
                    };
                    now += dt;
                    let w = &mut qps[q];
                    let before = w.cap();
                    let adjust = w.on_complete(&mut dev, bytes, rtt, now).unwrap();
                    check_adjust(w, before, rtt, adjust)?;
                }
            }
            for (w, out) in qps.iter().zip(&outstanding) {
                prop_assert_eq!(w.in_flight(), out.iter().sum::<u64>());
            }
            prop_assert_eq!(dev.in_flight(), outstanding.iter().flatten().sum::<u64>());
        }
        // Liveness: drain everything, then any single post passes on every QP.
        for (w, out) in qps.iter_mut().zip(&mut outstanding) {
            for b in out.drain(..) {
                now += 1;
                w.on_complete(&mut dev, b, 1, now).unwrap();
            }
        }
        for w in &mut qps {
            let t = w.try_post(&mut dev, 1 << 30).unwrap();
            w.on_complete(&mut dev, t.bytes, 1, now).unwrap();
        }
    }

    /// Completions above target, one RTT apart, shrink the window at every step until `min`.
    #[test]
    fn adaptive_window_shrinks_under_delay_above_target(
        min in 1u64..50_000,
        extra in 1u64..4_000_000,
        target_us in 1u64..100,
        beta in 100u32..=1000,
        max_dec in 100u32..=1000,
        excess in proptest::collection::vec(1u64..10, 1..40),
    ) {
        let mut dev = DeviceWindow::unlimited();
        let mut w = Window::adaptive(adaptive(min, min + extra, target_us, 1, beta, max_dec));
        let mut now = 0;
        let mut steps = 0;
        while w.cap() > min {
            // RTT between 2× and 11× the target; rising along the sequence.
            let rtt = target_us * (1 + excess[steps % excess.len()]) + steps as u64;
            now += rtt;
            let before = w.cap();
            let t = w.try_post(&mut dev, 1).unwrap();
            prop_assert_eq!(w.on_complete(&mut dev, t.bytes, rtt, now).unwrap(), Adjust::Decreased);
            prop_assert!(w.cap() < before && w.cap() >= min);
            steps += 1;
            prop_assert!(steps < 5_000, "did not reach min");
        }
    }

    /// Full windows completing below target grow the window by the additive increase per
    /// window's worth of completed bytes, in any completion order, until `max`.
    #[test]
    fn adaptive_window_grows_when_delay_below_target(
        min in 1u64..20_000,
        extra in 1u64..300_000,
        ai in 1u64..70_000,
        target_us in 2u64..200,
        chunk in 1u64..70_000,
        order in proptest::collection::vec(any::<usize>(), 1..20),
    ) {
        let cfg = adaptive(min, min + extra, target_us, ai, 500, 500).with_initial(min).unwrap();
        let mut dev = DeviceWindow::unlimited();
        let mut w = Window::adaptive(cfg);
        let mut now = 0;
        let mut rounds = 0;
        while w.cap() < min + extra {
            let before = w.cap();
            // Fill the window exactly.
            let mut posted = Vec::new();
            let mut left = before;
            while left > 0 {
                let b = chunk.min(left);
                let _ = w.try_post(&mut dev, b).unwrap();
                posted.push(b);
                left -= b;
            }
            let mut i = 0;
            while !posted.is_empty() {
                let b = posted.swap_remove(order[i % order.len()] % posted.len());
                i += 1;
                now += 1;
                w.on_complete(&mut dev, b, target_us - 1, now).unwrap();
            }
            prop_assert_eq!(w.cap(), (before + ai).min(min + extra));
            rounds += 1;
            prop_assert!(rounds <= extra.div_ceil(ai));
        }
    }

    /// From the same state, a larger delay never cuts less.
    #[test]
    fn adaptive_cut_grows_with_delay_excess(
        min in 1u64..1000,
        extra in 0u64..1_000_000,
        target_us in 1u64..1000,
        beta in 1u32..=1000,
        max_dec in 1u32..=1000,
        r1 in 1u64..10_000,
        r2 in 1u64..10_000,
    ) {
        let cfg = adaptive(min, min + extra, target_us, 1, beta, max_dec);
        let (lo, hi) = (target_us + r1.min(r2), target_us + r1.max(r2));
        let cap_after = |rtt| {
            let mut dev = DeviceWindow::unlimited();
            let mut w = Window::adaptive(cfg);
            let _ = w.try_post(&mut dev, 1).unwrap();
            w.on_complete(&mut dev, 1, rtt, 0).unwrap();
            w.cap()
        };
        prop_assert!(cap_after(hi) <= cap_after(lo));
        prop_assert!(cap_after(lo) <= (min + extra).max(min));
    }
}
