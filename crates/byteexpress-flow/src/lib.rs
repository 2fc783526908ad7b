//! Flow control for ByteExpress: receiver credits, software window, QP-sharing scheduler
//! (pure, no I/O).
//!
//! - [`credit`]: receiver-granted credits for an RDMA RC link, so a sender never posts a SEND
//!   the receiver has no buffer for (no RNR).
#![forbid(unsafe_code)]

pub mod credit;
