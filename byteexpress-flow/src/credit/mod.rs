//! Receiver-granted credits for one RDMA RC link (one [`Credits`] per peer, both sides alike).
//!
//! Pure state machine: no I/O, no clock, no allocation after construction. The transport feeds
//! it events (message sent, message received, buffer re-posted) and asks it what it may send.
//!
//! # Buffers
//! Each side posts `grant + 1` receive buffers for its peer (`grant` from [`CreditConfig`]):
//! `grant` **data buffers** and one **update slot**, reserved for `CREDIT_UPDATE` messages.
//! The split is an accounting split: a SEND lands in whichever posted receive is next, so the
//! rules below bound the number of SENDs of each kind in flight, and therefore their total.
//!
//! # Wire fields
//! Every message header (data or `CREDIT_UPDATE`) carries a [`Piggyback`]:
//! `credits` (count of data buffers the sender re-posted since its previous message and now
//! returns) and `slot_return` (flag: "I re-posted the update slot your last `CREDIT_UPDATE`
//! used"). The header also says whether the message is data or `CREDIT_UPDATE` ([`MsgKind`]).
//!
//! # Protocol rules
//! Terms, for side X talking to peer Y:
//! `send_credits` = data buffers X may still fill at Y; `pending` = data buffers X re-posted
//! but not yet announced to Y; `threshold = max(1, grant / 2)` (so `1 <= threshold <= grant`).
//!
//! 1. **Data costs one credit.** X sends a data message only if `send_credits >= 1`, and
//!    decrements it ([`Credits::try_send_data`]). With no credit the message waits in X's queue.
//!    A transport that posts n data messages back to back may take their n credits at once
//!    ([`Credits::can_send_more`], [`Credits::try_send_data_batch`]); by rule 2 the first
//!    message then carries everything owed and the others nothing.
//! 2. **Every message carries everything owed.** Each outgoing message, data or update, carries
//!    all of `pending` and the `slot_return` flag if one is owed; both are then cleared.
//! 3. **Returns are bounded.** On receipt, `send_credits + escrow + credits <= grant` must hold
//!    (escrow: rule 6); a peer returning more than it was sent is a protocol error
//!    ([`CreditError::TooManyCredits`]), as is a `slot_return` with no update outstanding, a data
//!    message beyond the credits granted, or a `CREDIT_UPDATE` while the slot is not posted.
//! 4. **Explicit update.** X sends a `CREDIT_UPDATE` ([`Credits::poll_update`]) when
//!    `pending >= threshold` and X's update slot at Y is free. The transport asks after it has
//!    sent the data it can (idle, or blocked on credits), so returns ride on data when there is
//!    data. An update therefore always returns at least one credit; a zero-credit update is a
//!    protocol error ([`CreditError::EmptyUpdate`]).
//! 5. **One update outstanding.** After sending a `CREDIT_UPDATE`, X's slot is busy until a
//!    message from Y arrives with `slot_return = true`. Y sets that flag on its first outgoing
//!    message (data or update) after it has re-posted the slot buffer
//!    ([`Credits::on_reposted`] with [`MsgKind::CreditUpdate`]).
//! 6. **Update credits are escrowed until the slot is re-posted.** The credits a
//!    `CREDIT_UPDATE` carries become usable only when the receiver re-posts the slot buffer, at
//!    the same moment the `slot_return` becomes owed. Data piggybacks count at once.
//!
//! # Why two sides always unblock (liveness)
//! Invariant (from rules 2, 4 and 6): **a side that owes a `slot_return` holds at least one
//! send credit.** The return becomes owed together with the escrowed credits (at least one,
//! rule 4); credits decrease only by sending data, and that data carries the flag (rule 2).
//! So a side never owes a flag it has no way to send once it has something to send.
//!
//! Suppose X has queued data that is never sent, while every in-flight message is delivered and
//! every consumed buffer re-posted eventually. With finitely many messages queued, sending stops,
//! so the link reaches a quiet state: nothing in flight, nothing left to re-post, and
//! `send_credits(X) = 0` (else X would send). All `grant` of X's credits then sit in Y's
//! `pending`, which is `>= threshold`, so Y would send an update (rule 4) unless Y's slot is
//! busy; a busy slot with nothing in flight and nothing left to re-post means X owes the
//! `slot_return`, so by the invariant `send_credits(X) >= 1`: contradiction. The same holds with
//! X and Y swapped, including both at zero credits with returns pending on both sides.
//! Updates cannot repeat forever: each carries at least one credit, and credits come only from
//! re-posting buffers that data messages consumed.
//!
//! # Safety (no RNR)
//! X sends at most `grant` unreturned data messages (rules 1, 3) and at most one unreturned
//! update (rule 5); Y returns a data credit only after re-posting a data buffer and the slot only
//! after re-posting the slot buffer, so a SEND from X always finds a posted receive at Y.
//!
//! # Send-queue slots and CQ entries: the second and third credits
//! A SEND needs a receiver credit **and** a free send-queue slot, whose CQ entry must also be
//! free ([`QueueBudget`]): the gate of a data SEND is `credits.can_send() &&
//! queues.can_post_send()`, and of a `CREDIT_UPDATE` `queues.can_post_send()` before
//! [`Credits::poll_update`] (which commits the update). Slots return when the send's
//! completion is polled, credits when the peer's message returning them is polled; the two
//! arrive in either order, and each count moves only on its own event.
//!
//! These properties are checked by the model-based proptests in `tests/credit_model.rs`,
//! whose two endpoints have bounded send queues and one CQ each, and whose CQEs arrive in
//! random orders.

mod config;
mod error;
mod piggyback;
mod queues;
mod state;
mod stats;

pub use config::CreditConfig;
pub use error::CreditError;
pub use piggyback::{MsgKind, Piggyback};
pub use queues::{QueueBudget, QueueConfig, QueueError};
pub use state::Credits;
pub use stats::CreditStats;
