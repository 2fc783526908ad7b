//! What each message header carries for flow control.

/// Which receive budget a message uses at the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MsgKind {
    /// A message that consumed one of the peer's `grant` data buffers (paid by a credit).
    Data,
    /// An explicit `CREDIT_UPDATE` that consumed the peer's single reserved update slot.
    CreditUpdate,
}

/// Flow-control fields of one message header, data or `CREDIT_UPDATE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Piggyback {
    /// Data buffers the sender re-posted and now returns to the peer (unit: credits).
    pub credits: u32,
    /// The sender re-posted the update slot used by the peer's last `CREDIT_UPDATE`.
    pub slot_return: bool,
}
