//! Refusals counted per gate.

use super::Gate;

/// How many times each [`Gate`] refused (unit: refusals), for a caller that counts in place
/// (simulators, benches); a transport with counters readable from other threads keeps its
/// own, indexed by [`Gate::index`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refusals {
    counts: [u64; 7],
}

impl Refusals {
    /// Counts one refusal by `gate`.
    #[inline]
    pub fn record(&mut self, gate: Gate) {
        self.counts[gate.index()] += 1;
    }

    /// Refusals by `gate` so far.
    #[inline]
    pub fn get(&self, gate: Gate) -> u64 {
        self.counts[gate.index()]
    }

    /// Refusals by every gate.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Each gate with its count, in the gates' order.
    pub fn iter(&self) -> impl Iterator<Item = (Gate, u64)> + '_ {
        Gate::ALL.iter().map(|&g| (g, self.get(g)))
    }
}
