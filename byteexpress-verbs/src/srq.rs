//! Shared receive queues (`ibv_create_srq(3)`, `ibv_post_srq_recv(3)`, `ibv_modify_srq(3)`),
//! QPs attached to them, the SQD state of a QP, and the CQ / context additions that async
//! events need.

use std::sync::Arc;

use crate::events::AsyncEvents;
use crate::provider::SrqImpl;
use crate::{Context, Cq, Pd, Qp, QpCap, RecvWr, Result, SrqAttr};

/// A shared receive queue (`ibv_srq`): receive WRs posted here are consumed by whichever
/// attached QP receives a message, each WR once; the completion carries the consuming QP's
/// `qp_num` and goes to that QP's recv CQ. Keeps its PD alive; attached QPs keep it alive.
///
/// When an attached QP goes to ERR, WRs of the SRQ are not flushed: they stay in the SRQ for
/// the other QPs (IB spec 10.2.9.5, `ibv_modify_qp(3)`), and the QP raises
/// [`crate::AsyncEvent::QpLastWqeReached`] (rxe, Linux 6.1, never raises it).
///
/// Soft provider: the SRQ lends its WRs in small batches to the receive rings of the attached
/// QPs (each ring has one producer, this process), refilling a ring when it runs low. So WRs
/// are consumed in posting order on each QP, but across QPs a WR lent to one may be consumed
/// after a later one consumed by another; and a QP's peer can meet RNR while every WR of the
/// SRQ is lent to other QPs. Post at least `4 × attached QPs` WRs (or
/// `max_wr / 2` per QP) to keep every ring fed. Lent WRs return to the SRQ when their QP goes
/// to ERR or is destroyed.
#[derive(Debug, Clone)]
pub struct Srq {
    pub(crate) inner: Arc<dyn SrqImpl>,
    _pd: Pd,
}

impl Srq {
    /// The id [`crate::AsyncEvent::SrqLimitReached`] names this SRQ by (unique in the process).
    pub fn id(&self) -> u64 {
        self.inner.id()
    }

    /// Granted attributes (`max_wr` and `max_sge` at least what was asked).
    pub fn attr(&self) -> SrqAttr {
        self.inner.attr()
    }

    /// Posts one receive WR to the SRQ (`ibv_post_srq_recv(3)`). Errors: `QueueFull` (ENOMEM)
    /// with `max_wr` WRs outstanding, `InvalidArgument` beyond `max_sge`. On error nothing was
    /// posted.
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        self.inner.post_recv(wr)
    }

    /// Arms the SRQ limit (`ibv_modify_srq(3)` with `IBV_SRQ_LIMIT`): once fewer than `limit`
    /// WRs remain in the SRQ, [`crate::AsyncEvent::SrqLimitReached`] is raised and the limit
    /// disarmed. 0 disarms. Errors: `InvalidArgument` when `limit` exceeds `max_wr`.
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        self.inner.arm_limit(limit)
    }
}

impl Pd {
    /// Creates a shared receive queue (`ibv_create_srq(3)`); a nonzero `attr.srq_limit` arms
    /// it at once (see [`Srq::arm_limit`]). Errors: `InvalidArgument` beyond the device's
    /// limits.
    pub fn create_srq(&self, attr: SrqAttr) -> Result<Srq> {
        Ok(Srq {
            inner: self.inner.create_srq(attr)?,
            _pd: self.clone(),
        })
    }

    /// Creates an RC QP in RESET whose receives come from `srq` (`srq` of
    /// `ibv_qp_init_attr`, `ibv_create_qp(3)`); `cap.max_recv_wr` and `cap.max_recv_sge` are
    /// ignored, and [`Qp::post_recv`] on it is `InvalidArgument`. The QP keeps `srq` alive.
    /// Errors: `InvalidArgument` for an SRQ of another device (on the soft provider: of another
    /// PD).
    pub fn create_qp_with_srq(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: &Srq,
        cap: QpCap,
    ) -> Result<Qp> {
        self.new_qp(send_cq, recv_cq, Some(srq), cap)
    }
}

impl Qp {
    /// RTS→SQD (`ibv_modify_qp(3)`, `IBV_QPS_SQD`): send WRs already posted complete, later
    /// [`Qp::post_send`] calls are `InvalidState`; receives go on. Once nothing is in
    /// progress on the send queue, [`crate::AsyncEvent::SqDrained`] is raised. Errors:
    /// `InvalidState` unless in RTS or SQD.
    pub fn to_sqd(&self) -> Result<()> {
        self.inner.to_sqd()
    }

    /// SQD→RTS (`ibv_modify_qp(3)`): sending resumes. Errors: `InvalidState` unless in SQD
    /// (on rdma-core devices also while the send queue is still draining).
    pub fn to_rts(&self) -> Result<()> {
        self.inner.to_rts()
    }
}

impl Cq {
    /// The id [`crate::AsyncEvent::CqErr`] names this CQ by (unique in the process).
    pub fn id(&self) -> u64 {
        self.inner.id()
    }
}

impl Context {
    /// Subscribes to the device's asynchronous events (`ibv_get_async_event(3)`): the
    /// subscription yields every event raised from now on; each subscription sees all of them.
    pub fn async_events(&self) -> Result<AsyncEvents> {
        AsyncEvents::new(self.inner.clone())
    }
}
