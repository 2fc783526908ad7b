//! The interface each provider implements. Upper layers never see it: they hold the wrappers of
//! `objects.rs`, so nothing above this crate can tell which provider runs.

use std::sync::Arc;

use crate::events::EventHub;
use crate::{
    Access, ConnectAttr, DeviceAttr, DeviceInfo, Endpoint, GidInfo, QpCap, QpState, RecvWr, Result,
    SendWr, SrqAttr, Wc,
};

/// Provider tag in [`DeviceInfo`] / [`Endpoint`].
pub(crate) const PROVIDER_IBVERBS: u8 = 1;
/// Provider tag in [`DeviceInfo`] / [`Endpoint`].
pub(crate) const PROVIDER_SOFT: u8 = 2;

/// An opened device (`ibv_context`).
pub(crate) trait ContextImpl: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &str;
    fn query(&self) -> DeviceAttr;
    fn device_info(&self) -> DeviceInfo;
    /// Client side of "can I reach this peer device?" (`nonce` was sent to the peer over the
    /// upper layer's control channel).
    fn probe(&self, peer: &DeviceInfo, nonce: u64) -> Result<bool>;
    /// Server side: accept probes carrying `nonce` (received over the control channel).
    fn expect_probe(&self, nonce: u64);
    fn alloc_pd(&self) -> Result<Arc<dyn PdImpl>>;
    fn create_cq(&self, cqe: u32) -> Result<Arc<dyn CqImpl>>;
    /// The subscribers of this device's asynchronous events.
    fn events(&self) -> &EventHub;
    /// Reads (without waiting) every event the device has queued and raises it in
    /// [`ContextImpl::events`]; a no-op where events are raised directly.
    fn pump_events(&self) -> Result<()>;
    /// A non-blocking fd that becomes readable when [`ContextImpl::pump_events`] has something
    /// to read (`ibv_context::async_fd`); `None` where events are raised directly.
    fn async_fd(&self) -> Option<std::os::fd::RawFd>;
    /// Valid GIDs of the port QPs use; none on devices without GIDs (the soft provider).
    fn gids(&self) -> Vec<GidInfo> {
        Vec::new()
    }
    /// Index of the source GID of this device's QPs; `None` on devices without GIDs.
    fn gid_index(&self) -> Option<u32> {
        None
    }
}

/// A protection domain (`ibv_pd`).
pub(crate) trait PdImpl: Send + Sync + std::fmt::Debug {
    /// `access`: the widest access its MRs will have (the soft provider's exposure class).
    fn alloc_shared(&self, len: usize, access: Access) -> Result<Arc<dyn SharedMemImpl>>;
    /// Registers `[offset, offset + len)` of `mem`; the caller checked that the range is not
    /// empty and lies inside `mem`.
    fn reg_shared(
        &self,
        mem: &Arc<dyn SharedMemImpl>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Arc<dyn MrImpl>>;
    /// Registers all of `region` (`ibv_reg_mr(3)`); the MR holds the region. The caller checked
    /// that the region is not empty and that write access is asked only of a writable region.
    fn reg_user(
        &self,
        region: &Arc<crate::objects::UserMem>,
        access: Access,
    ) -> Result<Arc<dyn MrImpl>>;
    /// An RC QP; with `srq`, its receives come from that SRQ and `cap.max_recv_*` are ignored.
    fn create_qp(
        &self,
        send_cq: &Arc<dyn CqImpl>,
        recv_cq: &Arc<dyn CqImpl>,
        srq: Option<&Arc<dyn SrqImpl>>,
        cap: QpCap,
    ) -> Result<Arc<dyn QpImpl>>;
    fn create_srq(&self, attr: SrqAttr) -> Result<Arc<dyn SrqImpl>>;
    /// A type 2 memory window, unbound (`ibv_alloc_mw(3)`).
    fn alloc_mw(&self) -> Result<Arc<dyn MwImpl>>;
    /// No QP will be created in this PD any more ([`crate::Pd::finish_qps`]).
    fn finish_qps(&self);
    /// Whether [`PdImpl::finish_qps`] was called.
    fn qps_finished(&self) -> bool;
}

/// A shared receive queue (`ibv_srq`).
pub(crate) trait SrqImpl: Send + Sync + std::fmt::Debug {
    /// The id [`crate::AsyncEvent`]s name it by.
    fn id(&self) -> u64;
    /// Granted attributes (`srq_limit`: the limit as armed at creation).
    fn attr(&self) -> SrqAttr;
    fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()>;
    /// `ibv_modify_srq(3)` with `IBV_SRQ_LIMIT`; 0 disarms.
    fn arm_limit(&self, limit: u32) -> Result<()>;
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Memory that a peer may access (a memfd mapping on the soft provider).
pub(crate) trait SharedMemImpl: Send + Sync + std::fmt::Debug {
    fn as_ptr(&self) -> *mut u8;
    fn len(&self) -> usize;
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A memory region (`ibv_mr`).
pub(crate) trait MrImpl: Send + Sync + std::fmt::Debug {
    fn lkey(&self) -> u32;
    fn rkey(&self) -> u32;
    fn addr(&self) -> u64;
    fn len(&self) -> usize;
}

/// A type 2 memory window (`ibv_mw`); deallocated on drop.
pub(crate) trait MwImpl: Send + Sync + std::fmt::Debug {
    /// The rkey at allocation.
    fn rkey(&self) -> u32;
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A completion queue (`ibv_cq` with its completion channel).
pub(crate) trait CqImpl: Send + Sync + std::fmt::Debug {
    fn poll(&self, out: &mut [Wc]) -> Result<usize>;
    /// Cheap check for the hybrid-polling spin: may [`CqImpl::poll`] return something now?
    fn pending(&self) -> bool;
    /// Spins on [`CqImpl::pending`] for up to `budget` (one check when zero); true once it
    /// holds. This default reads the clock on every turn (for a provider whose check is as dear
    /// as a clock read); the soft provider reads it every [`SPIN_CLOCK_EVERY`] turns.
    fn spin(&self, budget: std::time::Duration) -> bool {
        let t0 = std::time::Instant::now();
        loop {
            if self.pending() {
                return true;
            }
            if t0.elapsed() >= budget {
                return false;
            }
            std::hint::spin_loop();
        }
    }
    /// A file descriptor that becomes readable after [`CqImpl::arm`] once a completion is queued
    /// (the completion channel's fd, an eventfd, or an epoll set of such fds).
    fn event_fd(&self) -> std::os::fd::RawFd;
    /// `ibv_req_notify_cq(cq, 0)`. Returns true when completions may already be queued, in which
    /// case the caller polls again instead of waiting.
    fn arm(&self) -> Result<bool>;
    /// Consume the event that made [`CqImpl::event_fd`] readable (`ibv_get_cq_event` + ack;
    /// nothing on the soft provider, whose edge-triggered eventfd needs no reading back).
    fn ack_event(&self) -> Result<()>;
    /// The id [`crate::AsyncEvent`]s name it by.
    fn id(&self) -> u64;
    fn as_any(&self) -> &dyn std::any::Any;
}

/// An RC queue pair (`ibv_qp`).
pub(crate) trait QpImpl: Send + Sync + std::fmt::Debug {
    fn qp_num(&self) -> u32;
    fn state(&self) -> QpState;
    fn cap(&self) -> QpCap;
    fn endpoint(&self) -> Endpoint;
    fn connect(&self, remote: &Endpoint, attr: &ConnectAttr) -> Result<()>;
    fn to_err(&self) -> Result<()>;
    /// RTS→SQD (`ibv_modify_qp(3)`): the send queue drains, new sends are refused.
    fn to_sqd(&self) -> Result<()>;
    /// SQD→RTS.
    fn to_rts(&self) -> Result<()>;
    fn post_send(&self, wr: &SendWr<'_>) -> Result<()>;
    fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()>;
    /// The application's last [`crate::Qp`] handle is gone (`ibv_destroy_qp(3)`): from now on
    /// the QP answers no peer, even while the provider's own threads still hold it for a
    /// moment. As the IB responder of a destroyed QP, it drops inbound requests silently, so
    /// the peer's requester times out with `RETRY_EXC_ERR` (IBTA 9.7.5: no response, no NAK).
    /// Nothing to do for rdma-core, whose QP is destroyed when its last reference goes.
    fn destroy(&self) {}
}
