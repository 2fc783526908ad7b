//! Reconnection backoff, as gRPC's connection-backoff document (`doc/connection-backoff.md`)
//! specifies it.

use std::time::Duration;

/// Settings of reconnection backoff. Source: gRPC's connection-backoff document; the defaults
/// are its constants (INITIAL_BACKOFF 1 s, MULTIPLIER 1.6, JITTER 0.2, MAX_BACKOFF 120 s,
/// MIN_CONNECT_TIMEOUT 20 s).
///
/// An endpoint's attempts follow its algorithm: the first attempt may take
/// `max(initial, min_connect_timeout)`; when it fails, the next starts `initial` after the
/// failed one started; each later gap is the previous one × `multiplier` (at most `max`),
/// spread by a uniform random ± `jitter` × gap, and each attempt may take
/// `max(gap, min_connect_timeout)`. A successful connection resets the gap to `initial`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// First gap between attempts (INITIAL_BACKOFF, default 1 s).
    pub initial: Duration,
    /// Growth of the gap after each failed attempt (MULTIPLIER, default 1.6; values below 1
    /// are taken as 1).
    pub multiplier: f64,
    /// Random spread of each gap, as a fraction of it (JITTER, default 0.2; clamped to 0..=1).
    pub jitter: f64,
    /// Largest gap (MAX_BACKOFF, default 120 s).
    pub max: Duration,
    /// Least time one attempt (TCP connect and link set-up) is given (MIN_CONNECT_TIMEOUT,
    /// default 20 s).
    pub min_connect_timeout: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            multiplier: 1.6,
            jitter: 0.2,
            max: Duration::from_secs(120),
            min_connect_timeout: Duration::from_secs(20),
        }
    }
}

/// Where one endpoint stands in its backoff.
#[derive(Debug, Clone)]
pub(crate) struct BackoffState {
    cfg: Backoff,
    /// Gap before the next attempt, without jitter (`current_backoff` of the document).
    current: Duration,
}

impl BackoffState {
    pub(crate) fn new(cfg: Backoff) -> Self {
        BackoffState {
            current: cfg.initial,
            cfg,
        }
    }

    /// Time the next attempt may take: `max(current gap, min_connect_timeout)`.
    pub(crate) fn attempt_timeout(&self) -> Duration {
        self.current.max(self.cfg.min_connect_timeout)
    }

    /// After a failed attempt: the gap from its start to the next attempt (jittered), and the
    /// gap grows for the one after. `rand01` is a uniform sample in [0, 1).
    pub(crate) fn failed(&mut self, rand01: f64) -> Duration {
        let gap = self.current;
        let jitter = self.cfg.jitter.clamp(0.0, 1.0);
        let spread = gap.as_secs_f64() * jitter * (2.0 * rand01 - 1.0);
        let wait = Duration::from_secs_f64((gap.as_secs_f64() + spread).max(0.0));
        let grown = gap.as_secs_f64() * self.cfg.multiplier.max(1.0);
        self.current = Duration::from_secs_f64(grown.min(self.cfg.max.as_secs_f64()));
        wait
    }

    /// After a successful connection: back to `initial`.
    pub(crate) fn reset(&mut self) {
        self.current = self.cfg.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_grow_by_the_multiplier_up_to_max_and_reset_after_success() {
        let mut b = BackoffState::new(Backoff::default());
        assert_eq!(b.attempt_timeout(), Duration::from_secs(20));
        let mut gaps = vec![];
        for _ in 0..14 {
            gaps.push(b.failed(0.5).as_secs_f64()); // 0.5 = no jitter
        }
        let want = [1.0, 1.6, 2.56, 4.096, 6.5536];
        for (g, w) in gaps.iter().zip(want) {
            assert!((g - w).abs() < 1e-9, "{gaps:?}");
        }
        assert_eq!(
            *gaps.last().unwrap(),
            120.0,
            "capped at MAX_BACKOFF: {gaps:?}"
        );
        assert_eq!(b.attempt_timeout(), Duration::from_secs(120));
        b.reset();
        assert_eq!(b.failed(0.5), Duration::from_secs(1));
    }

    #[test]
    fn jitter_spreads_a_gap_by_at_most_a_fifth_either_way() {
        let lo = BackoffState::new(Backoff::default()).failed(0.0);
        let hi = BackoffState::new(Backoff::default()).failed(0.999_999);
        assert!((lo.as_secs_f64() - 0.8).abs() < 1e-9, "{lo:?}");
        assert!((hi.as_secs_f64() - 1.2).abs() < 1e-5, "{hi:?}");
    }
}
