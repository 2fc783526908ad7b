//! A6's retry throttling and retry backoff: pure arithmetic, proptested.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::service_config::{RetryPolicy, RetryThrottling};

/// A6's token bucket, in thousandths of a token (A6 keeps three decimal places of
/// `tokenRatio`): starts full at `maxTokens`; each failed attempt takes one token, each
/// successful call gives `tokenRatio` back (never above `maxTokens`); retries and hedges are
/// allowed only while the count is above `maxTokens / 2`.
#[derive(Debug)]
pub(crate) struct Throttle {
    max: u64,
    ratio: u64,
    tokens: AtomicU64,
}

impl Throttle {
    pub(crate) fn new(t: &RetryThrottling) -> Throttle {
        let max = u64::from(t.max_tokens) * 1000;
        Throttle {
            max,
            ratio: (t.token_ratio * 1000.0).round().max(0.0) as u64,
            tokens: AtomicU64::new(max),
        }
    }

    /// A failed attempt: one token less. Returns whether retries are still allowed
    /// (the count after the decrement is above half the maximum).
    pub(crate) fn failure(&self) -> bool {
        let prev = self
            .tokens
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_sub(1000))
            })
            .unwrap_or(0);
        prev.saturating_sub(1000) > self.max / 2
    }

    /// A successful call: `tokenRatio` tokens more, capped at the maximum.
    pub(crate) fn success(&self) {
        let _ = self
            .tokens
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some((t + self.ratio).min(self.max))
            });
    }

    /// Whether a retry or hedge may start now.
    pub(crate) fn allows(&self) -> bool {
        self.tokens.load(Ordering::SeqCst) > self.max / 2
    }

    /// Tokens now, in thousandths.
    #[cfg(test)]
    pub(crate) fn milli_tokens(&self) -> u64 {
        self.tokens.load(Ordering::SeqCst)
    }
}

/// The upper bound of A6's backoff before retry number `n` (1 = the first retry):
/// `min(initialBackoff · backoffMultiplier^(n−1), maxBackoff)`.
pub(crate) fn backoff_cap(p: &RetryPolicy, n: u32) -> Duration {
    let exp = p
        .backoff_multiplier
        .powi(n.saturating_sub(1).min(1000) as i32);
    let secs = p.initial_backoff.as_secs_f64() * exp;
    let max = p.max_backoff.as_secs_f64();
    if secs.is_finite() && secs < max {
        Duration::from_secs_f64(secs.max(0.0))
    } else {
        p.max_backoff
    }
}

/// A6's backoff before retry number `n`: `random(0, backoff_cap(n))`, `u` uniform in [0, 1).
pub(crate) fn backoff(p: &RetryPolicy, n: u32, u: f64) -> Duration {
    backoff_cap(p, n).mul_f64(u.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;
    use proptest::prelude::*;

    fn policy(initial_ms: u64, max_ms: u64, mult: f64) -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(initial_ms),
            max_backoff: Duration::from_millis(max_ms),
            backoff_multiplier: mult,
            retryable_status_codes: vec![Code::Unavailable],
        }
    }

    #[test]
    fn first_document_backoff_caps() {
        let p = policy(100, 1000, 2.0);
        let caps: Vec<u128> = (1..=6).map(|n| backoff_cap(&p, n).as_millis()).collect();
        assert_eq!(caps, [100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn throttle_of_ten_tokens_stops_retries_at_five() {
        let t = Throttle::new(&RetryThrottling {
            max_tokens: 10,
            token_ratio: 0.1,
        });
        // 9, 8, 7, 6 leave retries on; 5 is not above 10/2
        for _ in 0..4 {
            assert!(t.failure());
        }
        assert!(!t.failure());
        assert!(!t.allows());
        // ten successes of 0.1 bring one token back: 6 > 5
        for _ in 0..10 {
            t.success();
        }
        assert_eq!(t.milli_tokens(), 6000);
        assert!(t.allows());
    }

    proptest! {
        #[test]
        fn backoff_stays_within_a6_bounds(
            initial in 1u64..5_000, max in 1u64..20_000, mult in 0.1f64..10.0,
            n in 1u32..40, u in 0.0f64..1.0,
        ) {
            let p = policy(initial, max, mult);
            let cap = backoff_cap(&p, n);
            prop_assert!(cap <= p.max_backoff);
            let exact = (initial as f64 / 1000.0) * mult.powi(n as i32 - 1);
            let want = exact.min(max as f64 / 1000.0);
            prop_assert!((cap.as_secs_f64() - want).abs() <= 1e-6 * want.max(1.0));
            let b = backoff(&p, n, u);
            prop_assert!(b <= cap);
        }

        #[test]
        fn throttle_tokens_follow_a6_arithmetic(
            max in 1u32..1000, ratio_milli in 1u64..5000,
            ops in proptest::collection::vec(any::<bool>(), 0..300),
        ) {
            let t = Throttle::new(&RetryThrottling {
                max_tokens: max,
                token_ratio: ratio_milli as f64 / 1000.0,
            });
            let mut model: i64 = i64::from(max) * 1000;
            for ok in ops {
                if ok {
                    t.success();
                    model = (model + ratio_milli as i64).min(i64::from(max) * 1000);
                } else {
                    let allowed = t.failure();
                    model = (model - 1000).max(0);
                    prop_assert_eq!(allowed, model > i64::from(max) * 500);
                }
                prop_assert_eq!(t.milli_tokens() as i64, model);
                prop_assert_eq!(t.allows(), model > i64::from(max) * 500);
            }
        }
    }
}
