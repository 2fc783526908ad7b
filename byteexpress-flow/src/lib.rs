//! Flow control for ByteExpress: receiver credits, software window, QP-sharing scheduler
//! (pure, no I/O).
//!
//! - [`credit`]: receiver-granted credits for an RDMA RC link, so a sender never posts a SEND
//!   the receiver has no buffer for (no RNR); send-queue slots and CQ entries
//!   ([`credit::QueueBudget`]), the second and third credits of a SEND.
//! - [`window`]: bytes posted and not yet completed, capped per QP and per device; static
//!   (bandwidth × RTT) or adaptive (delay-based AIMD in the spirit of Swift/Timely).
//! - [`gate`]: the six admission gates of a SEND (SQ slot, CQ entry, send buffer, credit, QP
//!   window, device window) as pure functions, in one documented order, each refusal named.
//! - [`sched`]: deficit round robin of many logical connections over one QP's credits and
//!   window, with a capped latency class and chunking of bulk messages.
//!
//! Everything is an event → action state machine: the caller feeds events (message queued,
//! sent, received, completed) and asks what to do next; no clock, threads or I/O inside.
#![forbid(unsafe_code)]

pub mod credit;
pub mod gate;
pub mod sched;
pub mod window;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
