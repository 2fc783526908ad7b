//! Peak-EWMA latency estimate of one endpoint, after `tower::load::PeakEwma`: a latency above
//! the estimate replaces it at once (peak), one below it pulls it down by an exponentially
//! weighted moving average whose weight decays with the time since the last update.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone)]
pub(crate) struct PeakEwma {
    /// Estimate in nanoseconds.
    estimate_ns: f64,
    updated: Instant,
    decay_ns: f64,
    /// Whether a latency was observed yet.
    sampled: bool,
}

impl PeakEwma {
    pub(crate) fn new(default_rtt: Duration, decay: Duration) -> Self {
        PeakEwma {
            estimate_ns: default_rtt.as_nanos() as f64,
            updated: Instant::now(),
            decay_ns: (decay.as_nanos() as f64).max(1.0),
            sampled: false,
        }
    }

    /// Folds in one call's latency measured at `now`.
    pub(crate) fn observe(&mut self, rtt: Duration, now: Instant) {
        let rtt = rtt.as_nanos() as f64;
        if !self.sampled || rtt > self.estimate_ns {
            self.sampled = true;
            self.estimate_ns = rtt;
        } else {
            let elapsed = now.saturating_duration_since(self.updated).as_nanos() as f64;
            let w = (-elapsed / self.decay_ns).exp();
            self.estimate_ns = self.estimate_ns * w + rtt * (1.0 - w);
        }
        self.updated = now;
    }

    /// The estimate, in nanoseconds.
    pub(crate) fn estimate_ns(&self) -> f64 {
        self.estimate_ns
    }

    /// The estimate, or `None` before the first observed latency.
    pub(crate) fn sampled_ns(&self) -> Option<f64> {
        self.sampled.then_some(self.estimate_ns)
    }
}

/// Cost of sending one more call to an endpoint: its latency estimate × (outstanding + 1), as
/// `tower::load::PeakEwma` weighs it.
pub(crate) fn cost(estimate_ns: f64, outstanding: usize) -> f64 {
    estimate_ns * (outstanding as f64 + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_at_once_and_decays_slowly_toward_lower_latencies() {
        let t0 = Instant::now();
        let mut e = PeakEwma::new(Duration::from_millis(1), Duration::from_secs(10));
        e.observe(Duration::from_millis(10), t0);
        assert_eq!(e.estimate_ns(), 10e6);
        e.observe(Duration::from_micros(100), t0 + Duration::from_millis(1));
        assert!(e.estimate_ns() > 9.9e6, "{}", e.estimate_ns());
        e.observe(Duration::from_micros(100), t0 + Duration::from_secs(100));
        assert!(e.estimate_ns() < 0.2e6, "{}", e.estimate_ns());
        assert!(
            cost(1.0, 4) > cost(2.0, 1),
            "more calls outweigh a lower estimate"
        );
    }
}
