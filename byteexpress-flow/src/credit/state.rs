//! The per-link credit state machine.

use super::{CreditConfig, CreditError, CreditStats, MsgKind, Piggyback};

/// State of our receive-side update slot (the one buffer reserved for the peer's updates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RxSlot {
    /// Posted: the peer may send one `CREDIT_UPDATE`.
    Posted,
    /// Holds a received `CREDIT_UPDATE`, not yet re-posted.
    Consumed,
    /// Re-posted; the peer has not been told yet (we owe a `slot_return`).
    ReturnOwed,
}

/// Credit state of one RC link, as seen from one side. Both sides run the same machine.
///
/// Sender half: `send_credits` (data buffers we may fill at the peer) and whether our update slot
/// at the peer is free. Receiver half: `pending` returns, the receive-side update slot, and a
/// bound on what the peer may still send. Protocol rules: see the [module docs](super).
///
/// Invariants (checked by the proptests):
/// - `send_credits + escrow <= grant`;
/// - what the peer may still send us (its credits, as far as we know), what we hold and what we
///   owe back make the grant: `peer_credits + unreposted_data + pending == grant`, so
///   `peer_credits` is not stored but derived ([`Credits::peer_credits`]);
/// - a `slot_return` is owed only while `send_credits >= 1` (the liveness invariant).
#[derive(Clone)]
pub struct Credits {
    cfg: CreditConfig,
    /// Data messages we may still send (unit: credits).
    send_credits: u32,
    /// Credits from a received `CREDIT_UPDATE`, usable once its slot is re-posted (rule 6).
    escrow: u32,
    /// Our `CREDIT_UPDATE` is outstanding at the peer (its slot not yet returned).
    tx_slot_busy: bool,
    /// Re-posted data buffers not yet announced to the peer (unit: credits).
    pending: u32,
    /// Received data buffers not yet re-posted (unit: buffers).
    unreposted_data: u32,
    rx_slot: RxSlot,
    stats: CreditStats,
}

impl Credits {
    /// A fresh link: `grant` send credits, both update slots posted, nothing pending.
    pub fn new(cfg: CreditConfig) -> Self {
        Self {
            cfg,
            send_credits: cfg.grant(),
            escrow: 0,
            tx_slot_busy: false,
            pending: 0,
            unreposted_data: 0,
            rx_slot: RxSlot::Posted,
            stats: CreditStats::default(),
        }
    }

    /// The configuration this link was created with.
    pub fn config(&self) -> CreditConfig {
        self.cfg
    }

    /// Whether a data message may be sent now (at least one send credit).
    #[inline]
    pub fn can_send(&self) -> bool {
        self.send_credits > 0
    }

    /// Whether a bulk chunk may take a credit now: more than
    /// [`CreditConfig::latency_reserve`] credits are left, so bulk never holds more than the
    /// update threshold unreturned and small messages always find a credit.
    #[inline]
    pub fn can_send_bulk(&self) -> bool {
        self.send_credits > self.cfg.latency_reserve()
    }

    /// Whether one more data message may take a credit after `taken` were granted and not
    /// yet taken (a batch being gathered for [`Credits::try_send_data_batch`]): more than
    /// `taken` credits are left. `can_send_more(0) == can_send()`.
    #[inline]
    pub fn can_send_more(&self, taken: u32) -> bool {
        self.send_credits > taken
    }

    /// As [`Credits::can_send_more`] for a bulk chunk: more than `taken` plus
    /// [`CreditConfig::latency_reserve`] credits are left. `can_send_bulk_more(0) ==
    /// can_send_bulk()`.
    #[inline]
    pub fn can_send_bulk_more(&self, taken: u32) -> bool {
        u64::from(self.send_credits) > u64::from(taken) + u64::from(self.cfg.latency_reserve())
    }

    /// Send credits available now (unit: credits); never above `grant`.
    #[inline]
    pub fn send_credits(&self) -> u32 {
        self.send_credits
    }

    /// Credits received in a `CREDIT_UPDATE` whose slot is not re-posted yet (unit: credits).
    #[inline]
    pub fn escrowed_credits(&self) -> u32 {
        self.escrow
    }

    /// Re-posted data buffers not yet returned to the peer (unit: credits).
    #[inline]
    pub fn pending_returns(&self) -> u32 {
        self.pending
    }

    /// Upper bound on the data messages the peer may still send us (unit: credits): the grant
    /// less the buffers we received and have not returned yet (unreposted or pending).
    #[inline]
    pub fn peer_credits(&self) -> u32 {
        self.cfg.grant() - self.unreposted_data - self.pending
    }

    /// Whether our own `CREDIT_UPDATE` is outstanding (no further update may be sent).
    pub fn update_outstanding(&self) -> bool {
        self.tx_slot_busy
    }

    /// Whether we owe the peer a `slot_return` flag (its update slot is re-posted, not announced).
    pub fn slot_return_owed(&self) -> bool {
        self.rx_slot == RxSlot::ReturnOwed
    }

    /// Counters since creation.
    pub fn stats(&self) -> CreditStats {
        // Two counters follow from the state instead of being counted per message: every
        // data buffer received is unreposted, pending or returned (returns are counted once
        // per header that carries them); and the credits we hold (usable or in escrow) are
        // the grant, less the data sent, plus the credits received.
        let s = self.stats;
        let unreturned = u64::from(self.unreposted_data) + u64::from(self.pending);
        let held = u64::from(self.send_credits) + u64::from(self.escrow);
        CreditStats {
            data_received: s.credits_returned + unreturned,
            credits_received: held + s.data_sent - u64::from(self.cfg.grant()),
            ..s
        }
    }

    /// Sends a data message if a credit is available: consumes one credit and returns the
    /// piggyback to put in its header (all pending returns and an owed `slot_return`, rule 2).
    /// Returns `None` (and counts a block) when no credit is left: queue the message and retry
    /// after the next [`Credits::on_receive`].
    #[inline]
    pub fn try_send_data(&mut self) -> Option<Piggyback> {
        self.try_send_data_batch(1)
    }

    /// Sends `n` data messages back to back, as `n` calls of [`Credits::try_send_data`] with
    /// no other event between them would: takes `n` credits and returns the piggyback of the
    /// first message's header; the other `n - 1` headers carry [`Piggyback::default`] (no
    /// credits, no `slot_return`: the first took everything owed, rule 2). For a transport
    /// that gathers a batch with [`Credits::can_send_more`] and then posts it.
    ///
    /// Returns `None` (and counts a block) when fewer than `n` credits are left, taking
    /// nothing; `n == 0` returns `None` and counts nothing.
    #[inline]
    pub fn try_send_data_batch(&mut self, n: u32) -> Option<Piggyback> {
        if n == 0 {
            return None;
        }
        if self.send_credits < n {
            self.stats.blocked += 1;
            return None;
        }
        self.send_credits -= n;
        self.stats.data_sent += u64::from(n);
        Some(self.take_piggyback())
    }

    /// Whether [`Credits::poll_update`] would return an update now (rule 4), without taking
    /// it: for a transport that checks the update's SEND gates
    /// ([`crate::gate::admit_update`]) between the two, and counts their refusals only when
    /// an update was due.
    #[inline]
    pub fn update_due(&self) -> bool {
        !self.tx_slot_busy && self.pending >= self.cfg.update_threshold()
    }

    /// Asks whether an explicit `CREDIT_UPDATE` must be sent now (rule 4): when at least
    /// `threshold` returns are pending and our update slot at the peer is free. Call it after
    /// each re-post or receive once nothing more can be sent as data (queue empty or no
    /// credit); liveness relies on it being asked then. On `Some`, send a
    /// `CREDIT_UPDATE` with that piggyback; the slot is then busy until the peer returns it.
    #[inline]
    pub fn poll_update(&mut self) -> Option<Piggyback> {
        if !self.update_due() {
            return None;
        }
        self.tx_slot_busy = true;
        self.stats.updates_sent += 1;
        Some(self.take_piggyback())
    }

    /// Applies a received message header. `kind` is the message's kind (which of our buffers it
    /// consumed), `pb` its piggyback.
    ///
    /// # Errors
    /// A [`CreditError`] when the peer broke a rule (module docs, rule 3); the state is then
    /// unchanged and the link should be failed.
    #[inline]
    pub fn on_receive(&mut self, kind: MsgKind, pb: Piggyback) -> Result<(), CreditError> {
        match kind {
            MsgKind::Data if self.peer_credits() == 0 => return Err(CreditError::DataOverrun),
            MsgKind::CreditUpdate if self.rx_slot != RxSlot::Posted => {
                return Err(CreditError::UpdateSlotBusy);
            }
            MsgKind::CreditUpdate if pb.credits == 0 => return Err(CreditError::EmptyUpdate),
            _ => {}
        }
        if pb.slot_return && !self.tx_slot_busy {
            return Err(CreditError::UnexpectedSlotReturn);
        }
        // Cannot overflow: both are at most grant and their sum is at most grant.
        let held = self.send_credits + self.escrow;
        let outstanding = self.cfg.grant() - held;
        if pb.credits > outstanding {
            return Err(CreditError::TooManyCredits {
                returned: pb.credits,
                outstanding,
            });
        }

        if pb.slot_return {
            self.tx_slot_busy = false;
        }
        match kind {
            MsgKind::Data => {
                self.send_credits += pb.credits;
                self.unreposted_data += 1;
            }
            MsgKind::CreditUpdate => {
                self.escrow = pb.credits;
                self.rx_slot = RxSlot::Consumed;
                self.stats.updates_received += 1;
            }
        }
        Ok(())
    }

    /// Records that a received buffer of `kind` was consumed by the application and re-posted.
    /// A data buffer becomes a pending return; the update slot makes a `slot_return` owed and
    /// releases the escrowed credits of the update it held (rule 6).
    ///
    /// # Errors
    /// [`CreditError::NothingToRepost`] when no buffer of that kind is awaiting re-post (caller
    /// bug); the state is then unchanged.
    #[inline]
    pub fn on_reposted(&mut self, kind: MsgKind) -> Result<(), CreditError> {
        match kind {
            MsgKind::Data => {
                if self.unreposted_data == 0 {
                    return Err(CreditError::NothingToRepost(kind));
                }
                self.unreposted_data -= 1;
                self.pending += 1;
            }
            MsgKind::CreditUpdate => {
                if self.rx_slot != RxSlot::Consumed {
                    return Err(CreditError::NothingToRepost(kind));
                }
                self.rx_slot = RxSlot::ReturnOwed;
                self.send_credits += self.escrow;
                self.escrow = 0;
            }
        }
        Ok(())
    }

    /// Takes everything owed to the peer for an outgoing header (rule 2).
    #[inline]
    fn take_piggyback(&mut self) -> Piggyback {
        let credits = std::mem::take(&mut self.pending);
        self.stats.credits_returned += u64::from(credits);
        let slot_return = self.rx_slot == RxSlot::ReturnOwed;
        if slot_return {
            self.rx_slot = RxSlot::Posted;
        }
        Piggyback {
            credits,
            slot_return,
        }
    }
}

impl std::fmt::Debug for Credits {
    /// The fields, with the counters as [`Credits::stats`] gives them (two are derived).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credits")
            .field("cfg", &self.cfg)
            .field("send_credits", &self.send_credits)
            .field("escrow", &self.escrow)
            .field("tx_slot_busy", &self.tx_slot_busy)
            .field("pending", &self.pending)
            .field("unreposted_data", &self.unreposted_data)
            .field("peer_credits", &self.peer_credits())
            .field("rx_slot", &self.rx_slot)
            .field("stats", &self.stats())
            .finish()
    }
}
