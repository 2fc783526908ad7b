//! Counters of a credit link, for metrics.

/// Monotonic counters of one [`Credits`](super::Credits) link since creation
/// (unit: messages unless stated). Wrapping at `u64::MAX` is not expected in practice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CreditStats {
    /// Data messages sent (each consumed one credit).
    pub data_sent: u64,
    /// `CREDIT_UPDATE` messages sent.
    pub updates_sent: u64,
    /// Data send attempts refused for lack of a credit.
    pub blocked: u64,
    /// Credits returned to the peer, piggybacked or explicit (unit: credits).
    pub credits_returned: u64,
    /// Credits the peer returned to us (unit: credits).
    pub credits_received: u64,
    /// Data messages received.
    pub data_received: u64,
    /// `CREDIT_UPDATE` messages received.
    pub updates_received: u64,
}
