//! The verbs objects upper layers hold. Each wraps a provider's implementation.
//!
//! Ownership follows the verbs rules: an MR keeps its PD and memory alive, a QP keeps its PD and
//! CQs alive, so dropping handles in any order never destroys an object still referred to.

//! One verbs object per file, as [`crate::Srq`] (`srq.rs`).

mod context;
mod cq;
mod mr;
mod mw;
mod pd;
mod qp;
mod shared_mem;
mod user_region;

pub use context::Context;
pub use cq::Cq;
pub use mr::Mr;
pub use mw::Mw;
pub use pd::Pd;
pub use qp::Qp;
pub use shared_mem::SharedMem;
pub(crate) use user_region::UserMem;
pub use user_region::UserRegion;
