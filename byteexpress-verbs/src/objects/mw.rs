//! Mw: a type 2 memory window (`ibv_alloc_mw(3)`, IB spec 10.6.7).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::Pd;
use crate::provider::MwImpl;

/// A type 2 memory window (`ibv_mw`, `IBV_MW_TYPE_2`): a remote key over part of an MR, bound
/// and invalidated by work requests in the order of a QP's send queue ([`crate::WrOp::BindMw`],
/// [`crate::WrOp::LocalInv`], [`crate::WrOp::SendWithInv`]). Bound, it lets the peer of the QP
/// it was bound on, and no other QP, READ / WRITE its range with its rkey; unbound, that rkey
/// fails with `REM_ACCESS_ERR` at the peer. Dropping it deallocates it (`ibv_dealloc_mw(3)`),
/// which invalidates it if still bound. Keeps its PD alive.
#[derive(Debug)]
pub struct Mw {
    pub(crate) inner: Arc<dyn MwImpl>,
    /// The rkey as of the last successful post of a bind (`ibv_mw.rkey`).
    rkey: AtomicU32,
    pub(crate) pd: Pd,
}

impl PartialEq for Mw {
    /// The same window.
    fn eq(&self, o: &Mw) -> bool {
        std::ptr::eq(self, o)
    }
}

impl Eq for Mw {}

impl Mw {
    pub(crate) fn new(inner: Arc<dyn MwImpl>, pd: Pd) -> Mw {
        Mw {
            rkey: AtomicU32::new(inner.rkey()),
            inner,
            pd,
        }
    }

    /// The window's remote key: as allocated, then after each successfully posted
    /// [`crate::WrOp::BindMw`] the rkey that bind gives it (the same key index, the next key
    /// byte: `ibv_inc_rkey`). Hand it to the peer only after the bind (a later WR of the same
    /// QP, or its completion): before the bind executes it grants nothing. As with
    /// `ibv_bind_mw(3)`, the rkey moves on at the post: a bind that then does not execute
    /// (flushed, or failed with `MW_BIND_ERR`) leaves the device's key behind this one on
    /// rdma-core devices, so later binds of that window fail; deallocate it then.
    pub fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Acquire)
    }

    /// Records the rkey a bind just posted gives the window.
    pub(crate) fn set_rkey(&self, rkey: u32) {
        self.rkey.store(rkey, Ordering::Release);
    }
}
