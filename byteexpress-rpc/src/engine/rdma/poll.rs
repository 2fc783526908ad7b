//! How long an RDMA engine keeps polling after its last work before it sleeps on its CQ's
//! completion channel (issue 25, item 4: polling that pays for itself).
//!
//! A sleeping engine pays one wake-up for each message that wakes it (about 7.5 µs on the
//! development VM, `FIELD-NOTES.md`); a polling engine pays CPU for as long as it polls. Polling
//! pays only while work comes back sooner than a wake-up costs, so the adaptive policy watches
//! the idle gaps between the engine's rounds of work and polls only while their running mean is
//! shorter than `wake_cost`, for at most twice `wake_cost`. A link with no traffic has no gaps
//! that short and sleeps at once: an idle link costs no CPU. A fixed `Config::busy_poll` budget,
//! when set, replaces the policy (the behaviour before it).

use std::time::Duration;

/// Weight of a new gap in the running mean, as a right shift (1/4).
const GAP_WEIGHT_SHIFT: u32 = 2;

/// The engine's polling policy; times are the engine's `Instant`s, gaps in nanoseconds.
#[derive(Debug)]
pub(crate) struct PollPolicy {
    mode: Mode,
    /// Running mean of the recent idle gaps (ns), `None` before the first gap.
    mean_gap_ns: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    /// Poll this long after the last work, whatever the traffic (`Config::busy_poll` > 0).
    Fixed(Duration),
    /// Poll for `2 × wake_cost` while the mean idle gap is below `wake_cost`.
    Adaptive { wake_cost: Duration },
    /// Sleep at once (`busy_poll` 0 and `poll_wake_cost` 0).
    Off,
}

impl PollPolicy {
    /// The policy of `Config::busy_poll` and `Config::poll_wake_cost`: a fixed budget when
    /// `busy_poll` is non-zero, else adaptive with `wake_cost` (off when that is zero too).
    pub(crate) fn new(busy_poll: Duration, wake_cost: Duration) -> PollPolicy {
        let mode = if !busy_poll.is_zero() {
            Mode::Fixed(busy_poll)
        } else if !wake_cost.is_zero() {
            Mode::Adaptive { wake_cost }
        } else {
            Mode::Off
        };
        PollPolicy {
            mode,
            mean_gap_ns: None,
        }
    }

    /// Work came after an idle gap of `gap`; `slept` says whether the engine slept on its CQ
    /// during it. A slept gap includes the wake-up itself, which polling would have saved, so
    /// one wake-up is taken off it before it enters the mean (otherwise a sleeping engine
    /// would never see gaps short enough to start polling again).
    pub(crate) fn on_gap(&mut self, gap: Duration, slept: bool) {
        let Mode::Adaptive { wake_cost } = self.mode else {
            return;
        };
        let gap = if slept {
            gap.saturating_sub(wake_cost)
        } else {
            gap
        };
        let g = u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX);
        self.mean_gap_ns = Some(match self.mean_gap_ns {
            None => g,
            Some(m) => {
                // m + (g - m) / 4, in signed arithmetic without overflow
                if g >= m {
                    m.saturating_add((g - m) >> GAP_WEIGHT_SHIFT)
                } else {
                    m - ((m - g) >> GAP_WEIGHT_SHIFT)
                }
            }
        });
    }

    /// How long, after its last work, the engine keeps polling before it sleeps.
    pub(crate) fn budget(&self) -> Duration {
        match self.mode {
            Mode::Fixed(d) => d,
            Mode::Off => Duration::ZERO,
            Mode::Adaptive { wake_cost } => match self.mean_gap_ns {
                Some(m) if u128::from(m) < wake_cost.as_nanos() => wake_cost * 2,
                _ => Duration::ZERO,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAKE: Duration = Duration::from_micros(8);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_link_that_never_had_work_does_not_poll() {
        assert_eq!(
            PollPolicy::new(Duration::ZERO, WAKE).budget(),
            Duration::ZERO
        );
    }

    #[test]
    fn work_closer_together_than_a_wake_up_makes_the_engine_poll_twice_a_wake_up() {
        let mut p = PollPolicy::new(Duration::ZERO, WAKE);
        for _ in 0..4 {
            p.on_gap(us(2), false);
        }
        assert_eq!(p.budget(), WAKE * 2);
    }

    #[test]
    fn work_further_apart_than_a_wake_up_makes_the_engine_sleep_at_once() {
        let mut p = PollPolicy::new(Duration::ZERO, WAKE);
        for _ in 0..4 {
            p.on_gap(us(40), false);
        }
        assert_eq!(p.budget(), Duration::ZERO);
    }

    #[test]
    fn polling_stops_once_traffic_thins_and_resumes_when_it_comes_back() {
        let mut p = PollPolicy::new(Duration::ZERO, WAKE);
        for _ in 0..8 {
            p.on_gap(us(1), false);
        }
        assert!(!p.budget().is_zero());
        // the burst ends: a long idle gap (slept through) ends polling at once
        p.on_gap(Duration::from_millis(5), true);
        assert_eq!(p.budget(), Duration::ZERO);
        // back-to-back work again: the mean comes down within a few gaps
        let mut rounds = 0;
        while p.budget().is_zero() {
            p.on_gap(us(1), true);
            rounds += 1;
            assert!(rounds < 64, "polling never resumed");
        }
    }

    #[test]
    fn a_gap_slept_through_counts_without_the_wake_up_it_paid() {
        // 10 µs slept = 2 µs of gap + 8 µs of wake-up: the engine should have polled
        let mut slept = PollPolicy::new(Duration::ZERO, WAKE);
        slept.on_gap(us(10), true);
        assert_eq!(slept.budget(), WAKE * 2);
        // the same 10 µs seen while polling is a real gap, longer than a wake-up
        let mut polled = PollPolicy::new(Duration::ZERO, WAKE);
        polled.on_gap(us(10), false);
        assert_eq!(polled.budget(), Duration::ZERO);
    }

    #[test]
    fn a_fixed_budget_ignores_the_traffic_and_zero_wake_cost_turns_polling_off() {
        let mut fixed = PollPolicy::new(us(500), WAKE);
        fixed.on_gap(Duration::from_secs(1), true);
        assert_eq!(fixed.budget(), us(500));
        let mut off = PollPolicy::new(Duration::ZERO, Duration::ZERO);
        off.on_gap(Duration::ZERO, false);
        assert_eq!(off.budget(), Duration::ZERO);
    }

    #[test]
    fn enormous_gaps_do_not_overflow_the_mean() {
        let mut p = PollPolicy::new(Duration::ZERO, WAKE);
        p.on_gap(Duration::MAX, false);
        p.on_gap(Duration::MAX, false);
        p.on_gap(Duration::ZERO, false);
        assert_eq!(p.budget(), Duration::ZERO);
    }
}
