//! The probe nonces a device expects (`Context::expect_probe`): each valid for [`PROBE_TTL`],
//! used once, and at most [`MAX_PROBE_NONCES`] of them held, the oldest dropped first, so a
//! process that arms nonce after nonce cannot grow the table without bound. Arming and taking
//! cost O(1) amortised: expired nonces are dropped from the front of the arming order, never by
//! a scan of the whole table.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How long a nonce from `expect_probe` stays valid.
pub(crate) const PROBE_TTL: Duration = Duration::from_secs(30);
/// Most nonces held at once; arming one more drops the oldest.
pub(crate) const MAX_PROBE_NONCES: usize = 4096;

/// Armed nonces, by nonce, with their expiry.
#[derive(Debug, Default)]
pub(crate) struct Probes {
    live: HashMap<u64, Instant>,
    /// Every arming, oldest first (its expiry too: expiries are in arming order, as the TTL is
    /// one constant). An entry whose nonce was taken or re-armed since is stale: it is
    /// skipped when it reaches the front. Never longer than [`MAX_PROBE_NONCES`].
    order: VecDeque<(u64, Instant)>,
}

impl Probes {
    /// Arms `nonce` at `now`, until `now + PROBE_TTL`.
    pub(crate) fn arm(&mut self, nonce: u64, now: Instant) {
        self.expire(now);
        while self.order.len() >= MAX_PROBE_NONCES {
            self.pop_front();
        }
        let exp = now + PROBE_TTL;
        self.live.insert(nonce, exp);
        self.order.push_back((nonce, exp));
    }

    /// Takes `nonce` if it is armed and not expired at `now`.
    pub(crate) fn take(&mut self, nonce: u64, now: Instant) -> bool {
        self.expire(now);
        self.live.remove(&nonce).is_some_and(|exp| exp > now)
    }

    /// Nonces held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.live.len()
    }

    fn expire(&mut self, now: Instant) {
        while self.order.front().is_some_and(|&(_, exp)| exp <= now) {
            self.pop_front();
        }
    }

    /// Drops the oldest arming, and its nonce unless that was re-armed since.
    fn pop_front(&mut self) {
        if let Some((nonce, exp)) = self.order.pop_front()
            && self.live.get(&nonce) == Some(&exp)
        {
            self.live.remove(&nonce);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_at_most_the_cap_dropping_the_oldest() {
        let mut p = Probes::default();
        let now = Instant::now();
        for n in 0..(MAX_PROBE_NONCES as u64 * 3) {
            p.arm(n, now);
        }
        assert_eq!(p.len(), MAX_PROBE_NONCES);
        assert!(p.order.len() <= MAX_PROBE_NONCES);
        assert!(!p.take(0, now), "oldest dropped");
        assert!(p.take(MAX_PROBE_NONCES as u64 * 3 - 1, now), "newest kept");
        assert!(
            p.take(MAX_PROBE_NONCES as u64 * 2, now),
            "the oldest one kept"
        );
    }

    #[test]
    fn taken_and_rearmed_nonces_keep_the_bound_and_a_rearmed_nonce_lives_on() {
        let mut p = Probes::default();
        let now = Instant::now();
        for n in 0..(MAX_PROBE_NONCES as u64 * 2) {
            p.arm(n, now);
            assert!(p.take(n, now));
        }
        assert_eq!(p.len(), 0);
        assert!(p.order.len() <= MAX_PROBE_NONCES);
        // Re-armed: the first arming's entry going stale does not drop the second.
        p.arm(7, now);
        let later = now + Duration::from_secs(1);
        p.arm(7, later);
        for n in 100..(100 + MAX_PROBE_NONCES as u64 - 1) {
            p.arm(n, later);
        }
        assert!(
            p.take(7, later),
            "re-armed nonce kept past its first arming"
        );
    }

    #[test]
    fn a_nonce_expires_after_its_ttl_and_is_used_once() {
        let mut p = Probes::default();
        let now = Instant::now();
        p.arm(1, now);
        p.arm(2, now);
        assert!(p.take(1, now + PROBE_TTL / 2));
        assert!(!p.take(1, now + PROBE_TTL / 2), "used up");
        assert!(!p.take(2, now + PROBE_TTL), "expired");
        assert_eq!(p.len(), 0);
    }
}
