//! Qp: an RC queue pair.

use super::{Cq, Pd};
use crate::provider::QpImpl;
use crate::{ConnectAttr, Endpoint, QpCap, QpState, RecvWr, Result, SendWr};
use std::sync::Arc;

/// An RC queue pair (`ibv_qp`). Keeps its PD, CQs and SRQ alive.
#[derive(Debug, Clone)]
pub struct Qp {
    pub(crate) inner: Arc<dyn QpImpl>,
    /// Shared by the clones of this handle: when the last goes, the QP is destroyed
    /// ([`QpImpl::destroy`]), before this handle's PD and CQ handles (fields drop in order)
    /// and the MRs the application drops after it.
    pub(crate) _destroy: Arc<DestroyOnDrop>,
    pub(crate) _pd: Pd,
    pub(crate) _cqs: [Cq; 2],
    pub(crate) _srq: Option<crate::Srq>,
}

/// Calls [`QpImpl::destroy`] when the application's last [`Qp`] handle is dropped. Provider
/// threads hold the QP itself (not this), so their short-lived references do not delay it.
#[derive(Debug)]
pub(crate) struct DestroyOnDrop(pub(crate) Arc<dyn QpImpl>);

impl Drop for DestroyOnDrop {
    fn drop(&mut self) {
        self.0.destroy();
    }
}

impl Qp {
    /// QP number.
    pub fn qp_num(&self) -> u32 {
        self.inner.qp_num()
    }
    /// Current state (`ibv_query_qp(3)`).
    pub fn state(&self) -> QpState {
        self.inner.state()
    }
    /// Granted queue sizes (may exceed what was asked).
    pub fn cap(&self) -> QpCap {
        self.inner.cap()
    }
    /// What the peer needs to connect to this QP; send it over the control channel.
    pub fn endpoint(&self) -> Endpoint {
        self.inner.endpoint()
    }
    /// RESET→INIT→RTR→RTS towards `remote` with `attr` (`ibv_modify_qp(3)` three times).
    /// Errors: `InvalidState` unless in RESET; `InvalidArgument` for an endpoint of another
    /// provider; `Peer` when the peer cannot be reached.
    pub fn connect(&self, remote: &Endpoint, attr: &ConnectAttr) -> Result<()> {
        self.inner.connect(remote, attr)
    }
    /// Moves the QP to ERR: every outstanding WR completes with `WR_FLUSH_ERR`, in order.
    pub fn to_err(&self) -> Result<()> {
        self.inner.to_err()
    }
    /// Posts one send-queue WR (`ibv_post_send(3)`). Errors: `QueueFull` (ENOMEM) beyond
    /// max_send_wr, `InvalidState` before RTS and in SQD, `InvalidArgument` beyond max_send_sge /
    /// max_inline_data. On error nothing was posted.
    ///
    /// The memory named by the SGEs must stay untouched until the WR's completion (or the
    /// completion of a later signaled WR); the device only ever touches memory inside
    /// registered MRs, which stay mapped while the MR lives.
    ///
    /// A [`WrOp::BindMw`](crate::WrOp::BindMw) is checked as [`crate::MwBind`] says
    /// (`InvalidArgument`); once posted, the window's [`crate::Mw::rkey`] is the new rkey.
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<()> {
        if let crate::WrOp::BindMw(b) = wr.op {
            crate::wr::check_bind(&b, &self._pd)?;
            self.inner.post_send(wr)?;
            b.mw.set_rkey(crate::wr::next_rkey(b.mw.rkey()));
            return Ok(());
        }
        self.inner.post_send(wr)
    }
    /// Posts one receive WR (`ibv_post_recv(3)`). Errors: `QueueFull` (ENOMEM) beyond
    /// max_recv_wr, `InvalidState` in RESET, `InvalidArgument` beyond max_recv_sge. In ERR the
    /// WR completes with `WR_FLUSH_ERR`, after every earlier WR of the receive queue. (On
    /// rdma-core devices "in ERR" means known to this process: after [`Qp::to_err`] or once an
    /// error completion of the QP was polled; a receive posted in between may never complete
    /// on rxe, which does not flush receives posted in ERR.)
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        self.inner.post_recv(wr)
    }
}
