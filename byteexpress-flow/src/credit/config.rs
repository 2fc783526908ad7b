//! Configuration of a credit link.

use super::CreditError;

/// Configuration of one [`Credits`](super::Credits) link.
///
/// `grant` is the number of receive **data buffers** each side reserves for the peer (unit:
/// buffers, one message each). Each side additionally posts one update-slot buffer, so the
/// receive queue needs `grant + 1` posted receives per peer. Both sides must use the same value
/// (negotiated at link set-up by `byteexpress-rpc`). The wire field that carries returned
/// credits must be able to hold `grant`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreditConfig {
    grant: u32,
    /// `max(1, grant / 2)`, read on every `poll_update`.
    update_threshold: u32,
}

impl CreditConfig {
    /// A configuration granting `grant` data buffers (unit: buffers).
    ///
    /// # Errors
    /// [`CreditError::ZeroGrant`] when `grant` is 0: no data could ever be sent.
    pub fn new(grant: u32) -> Result<Self, CreditError> {
        if grant == 0 {
            return Err(CreditError::ZeroGrant);
        }
        Ok(Self {
            grant,
            update_threshold: (grant / 2).max(1),
        })
    }

    /// Data buffers granted to the peer (unit: buffers); at least 1.
    #[inline]
    pub fn grant(&self) -> u32 {
        self.grant
    }

    /// Pending returns that trigger an explicit `CREDIT_UPDATE` when idle:
    /// `max(1, grant / 2)` (unit: credits); always in `1..=grant`.
    #[inline]
    pub fn update_threshold(&self) -> u32 {
        self.update_threshold
    }

    /// Credits the bulk class leaves to the latency class: `grant - update_threshold()`
    /// (unit: credits). Bulk traffic may hold at most `update_threshold()` credits unreturned,
    /// so a small message finds a credit at once and waits at the receiver behind at most
    /// that many chunks; bulk still uses enough credits for the receiver's explicit update to
    /// fire, so it never stalls (liveness).
    #[inline]
    pub fn latency_reserve(&self) -> u32 {
        self.grant - self.update_threshold()
    }

    /// Receives to post for this peer: `grant + 1` (data buffers plus the update slot),
    /// saturating at `u32::MAX`.
    pub fn posted_receives(&self) -> u32 {
        self.grant.saturating_add(1)
    }
}
