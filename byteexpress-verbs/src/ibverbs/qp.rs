//! RC queue pairs: creation (`ibv_create_qp(3)`), the RESET→INIT→RTR→RTS walk and ERR
//! (`ibv_modify_qp(3)`, attribute masks as that page requires per transition), and state
//! queries (`ibv_query_qp(3)`). Posting is in `post.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::Mutex;
use rand::Rng;
use rdma_mummy_sys::{self as sys, ibv_qp_attr_mask as M, ibv_qp_state};

use super::context::PORT;
use super::cq::IbvCq;
use super::ledger::Ledger;
use super::pd::IbvPd;
use super::srq::IbvSrq;
use super::{convert, os_err};
use crate::provider::{PROVIDER_IBVERBS, QpImpl};
use crate::{ConnectAttr, Endpoint, Error, QpCap, QpState, RecvWr, Result, SendWr};

/// IP hop limit of RoCE v2 packets (`hop_limit` of `ibv_global_route`): routable.
const HOP_LIMIT: u8 = 64;

/// States this process moved the QP to; the device may since have moved it to ERR on its own.
pub(crate) const SET_RESET: u8 = 0;
/// Connected: RTS.
pub(crate) const SET_RTS: u8 = 1;
/// `to_err` ran.
pub(crate) const SET_ERR: u8 = 2;
/// `to_sqd` ran (and `to_rts` has not).
pub(crate) const SET_SQD: u8 = 3;

/// An RC QP; holds its PD and CQs, so it is destroyed before them.
#[derive(Debug)]
pub(crate) struct IbvQp {
    pub(crate) qp: *mut sys::ibv_qp,
    pub(crate) qpn: u32,
    psn: u32,
    pub(crate) cap: QpCap,
    /// [`SET_RESET`], [`SET_RTS`] or [`SET_ERR`]: checked before posting, so posting before
    /// connect is `InvalidState` whatever the provider library would do.
    pub(crate) set_state: AtomicU8,
    connecting: Mutex<()>,
    /// Outstanding WRs of both queues (see `ledger.rs`).
    pub(crate) ledger: Arc<Ledger>,
    pub(crate) pd: Arc<IbvPd>,
    pub(crate) send_cq: Arc<IbvCq>,
    pub(crate) recv_cq: Arc<IbvCq>,
    /// The SRQ receives come from; destroyed after the QP (a field, dropped after Drop).
    pub(crate) srq: Option<Arc<IbvSrq>>,
}

// SAFETY: `ibv_post_send`, `ibv_post_recv`, `ibv_modify_qp` and `ibv_query_qp` are thread-safe
// (ibv_post_send(3); rdma-core's providers lock each work queue); the QP is destroyed once,
// in Drop, while the PD and CQs it holds are still alive.
unsafe impl Send for IbvQp {}
// SAFETY: as for Send.
unsafe impl Sync for IbvQp {}

impl Drop for IbvQp {
    fn drop(&mut self) {
        // SAFETY: created in `create`, destroyed once; its PD and CQs are fields, dropped after.
        let rc = unsafe { sys::ibv_destroy_qp(self.qp) };
        if rc != 0 {
            tracing::warn!("ibv_destroy_qp: {}", std::io::Error::from_raw_os_error(rc));
        }
        self.send_cq.unregister(self.qpn, &self.ledger);
        self.recv_cq.unregister(self.qpn, &self.ledger);
    }
}

impl IbvQp {
    pub(crate) fn create(
        pd: Arc<IbvPd>,
        send_cq: Arc<IbvCq>,
        recv_cq: Arc<IbvCq>,
        srq: Option<Arc<IbvSrq>>,
        cap: QpCap,
    ) -> Result<Arc<IbvQp>> {
        // SAFETY: ibv_qp_init_attr is plain C data; all-zero is a valid value.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq.raw();
        init.recv_cq = recv_cq.raw();
        init.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        init.srq = srq.as_ref().map_or(std::ptr::null_mut(), |s| s.raw());
        // With an SRQ, max_recv_* are ignored (`ibv_create_qp(3)`).
        let recv = |v: u32| if srq.is_some() { 0 } else { v.max(1) };
        init.cap = sys::ibv_qp_cap {
            max_send_wr: cap.max_send_wr.max(1),
            max_recv_wr: recv(cap.max_recv_wr),
            max_send_sge: cap.max_send_sge.max(1),
            max_recv_sge: recv(cap.max_recv_sge),
            max_inline_data: cap.max_inline_data,
        };
        // SAFETY: PD and CQs are alive (held by the QP below); `init` is valid and receives
        // the granted caps.
        let qp = unsafe { sys::ibv_create_qp(pd.raw(), &mut init) };
        if qp.is_null() {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                return Err(Error::InvalidArgument(format!(
                    "ibv_create_qp refused caps {cap:?}"
                )));
            }
            return Err(Error::Os {
                what: "ibv_create_qp",
                source: e,
            });
        }
        let granted = QpCap {
            max_send_wr: init.cap.max_send_wr,
            max_recv_wr: init.cap.max_recv_wr,
            max_send_sge: init.cap.max_send_sge,
            max_recv_sge: init.cap.max_recv_sge,
            max_inline_data: init.cap.max_inline_data,
        };
        // SAFETY: `qp` was just created and is valid.
        let qpn = unsafe { (*qp).qp_num };
        let ledger = Arc::new(Ledger::new(
            qpn,
            granted.max_send_wr,
            granted.max_recv_wr,
            srq.as_ref().map(|s| s.ledger.clone()),
        ));
        send_cq.register(qpn, ledger.clone());
        recv_cq.register(qpn, ledger.clone());
        Ok(Arc::new(IbvQp {
            qp,
            qpn,
            psn: rand::rng().random::<u32>() & 0xff_ffff,
            cap: granted,
            set_state: AtomicU8::new(SET_RESET),
            connecting: Mutex::new(()),
            ledger,
            pd,
            send_cq,
            recv_cq,
            srq,
        }))
    }

    /// `ibv_modify_qp(3)` with `mask`; `step` names the call and transition in errors
    /// (`ibv_modify_qp(RTR)`), and an `EINVAL` lists the attributes given, since the verbs
    /// do not say which one was refused.
    fn modify(&self, attr: &mut sys::ibv_qp_attr, mask: M, step: &'static str) -> Result<()> {
        // SAFETY: the QP is valid; `attr` is a fully initialised attribute struct.
        let rc = unsafe { sys::ibv_modify_qp(self.qp, attr, mask.0 as libc::c_int) };
        match rc {
            0 => Ok(()),
            libc::EINVAL => Err(refused(step, &attr_summary(attr, mask))),
            e => Err(os_err(step, Some(e))),
        }
    }

    fn to_state(&self, s: ibv_qp_state::Type, step: &'static str) -> Result<()> {
        // SAFETY: ibv_qp_attr is plain C data; all-zero is a valid value.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = s;
        self.modify(&mut a, M::IBV_QP_STATE, step)
    }

    /// RESET→INIT→RTR→RTS; see [`QpImpl::connect`].
    fn walk_to_rts(&self, remote: &Endpoint, attr: &ConnectAttr) -> Result<()> {
        let ctx = &self.pd.ctx;
        // SAFETY: ibv_qp_attr is plain C data; all-zero is a valid value.
        let zero = || -> sys::ibv_qp_attr { unsafe { std::mem::zeroed() } };

        let mut a = zero();
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = PORT;
        a.qp_access_flags = convert::access_bits(attr.access)?;
        self.modify(
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp(INIT)",
        )?;

        let mtu = ctx.active_mtu().min(remote.mtu).min(attr.mtu);
        let mut a = zero();
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = convert::mtu_code(mtu);
        a.dest_qp_num = remote.qpn & 0xff_ffff;
        a.rq_psn = remote.psn & 0xff_ffff;
        a.max_dest_rd_atomic = ctx.max_dest_rd_atomic;
        a.min_rnr_timer = attr.min_rnr_timer;
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.sl = 0;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = PORT;
        if ctx.is_roce() || remote.lid == 0 {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = remote.gid;
            a.ah_attr.grh.sgid_index = u8::try_from(ctx.gid.index).map_err(|_| {
                Error::InvalidArgument(format!("GID index {} above 255", ctx.gid.index))
            })?;
            a.ah_attr.grh.hop_limit = HOP_LIMIT;
            a.ah_attr.grh.traffic_class = 0;
            a.ah_attr.grh.flow_label = 0;
        }
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp(RTR)",
        )?;

        let mut a = zero();
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.timeout = attr.timeout;
        a.retry_cnt = attr.retry_cnt;
        a.rnr_retry = attr.rnr_retry;
        a.sq_psn = self.psn;
        a.max_rd_atomic = ctx.max_rd_atomic;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp(RTS)",
        )
    }
}

/// The `EINVAL` of one `ibv_modify_qp` transition, naming the call once, with the attributes
/// that were given (`summary`).
fn refused(step: &str, summary: &str) -> Error {
    Error::InvalidArgument(format!("{step} refused the attributes {summary}"))
}

/// The attributes a transition sets, as `name value` pairs: what the user can check against
/// `bx devices` (GID index, MTU) and the peer's address.
fn attr_summary(a: &sys::ibv_qp_attr, mask: M) -> String {
    let mut parts = Vec::new();
    if mask.0 & M::IBV_QP_PATH_MTU.0 != 0 {
        parts.push(format!("path_mtu {}", convert::mtu_bytes(a.path_mtu)));
    }
    if mask.0 & M::IBV_QP_DEST_QPN.0 != 0 {
        parts.push(format!("dest_qp_num {:#x}", a.dest_qp_num));
    }
    if mask.0 & M::IBV_QP_AV.0 != 0 {
        parts.push(format!("dlid {}", a.ah_attr.dlid));
        if a.ah_attr.is_global != 0 {
            // SAFETY: `raw` is the byte view of the GID union; every bit pattern is valid.
            let dgid = unsafe { a.ah_attr.grh.dgid.raw };
            parts.push(format!(
                "sgid_index {}, dgid {}",
                a.ah_attr.grh.sgid_index,
                std::net::Ipv6Addr::from(dgid)
            ));
        }
    }
    if mask.0 & M::IBV_QP_ACCESS_FLAGS.0 != 0 {
        parts.push(format!("access {:#x}", a.qp_access_flags));
    }
    if mask.0 & M::IBV_QP_TIMEOUT.0 != 0 {
        parts.push(format!(
            "timeout {}, retry_cnt {}, rnr_retry {}",
            a.timeout, a.retry_cnt, a.rnr_retry
        ));
    }
    if parts.is_empty() {
        "(state only)".into()
    } else {
        format!("({})", parts.join(", "))
    }
}

impl QpImpl for IbvQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// `ibv_query_qp(3)`: the device's view, which includes ERR entered on a failed WR.
    fn state(&self) -> QpState {
        // SAFETY: plain C data; all-zero is valid.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: plain C data; all-zero is valid.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is valid; both out-pointers are valid.
        let rc = unsafe {
            sys::ibv_query_qp(self.qp, &mut a, M::IBV_QP_STATE.0 as libc::c_int, &mut init)
        };
        if rc == 0 {
            return convert::qp_state(a.qp_state);
        }
        match self.set_state.load(Ordering::SeqCst) {
            SET_RESET => QpState::Reset,
            SET_RTS => QpState::Rts,
            SET_SQD => QpState::Sqd,
            _ => QpState::Err,
        }
    }

    fn cap(&self) -> QpCap {
        self.cap
    }

    fn endpoint(&self) -> Endpoint {
        let ctx = &self.pd.ctx;
        Endpoint {
            provider: PROVIDER_IBVERBS,
            qpn: self.qpn,
            psn: self.psn,
            lid: ctx.lid,
            gid: ctx.gid.gid,
            mtu: ctx.active_mtu(),
            addr: Vec::new(),
        }
    }

    /// No handshake happens here: a wrong QPN or GID shows later, as RETRY_EXC_ERR on the
    /// first send. On failure the QP is back in RESET.
    fn connect(&self, remote: &Endpoint, attr: &ConnectAttr) -> Result<()> {
        if remote.provider != PROVIDER_IBVERBS {
            return Err(Error::InvalidArgument(
                "endpoint of another provider".into(),
            ));
        }
        if attr.min_rnr_timer > 31
            || attr.timeout > 31
            || attr.retry_cnt > 7
            || attr.rnr_retry > 7
            || !(256..=4096).contains(&attr.mtu)
            || !(256..=4096).contains(&remote.mtu)
        {
            return Err(Error::InvalidArgument(format!(
                "connect attributes out of range: {attr:?}, peer MTU {}",
                remote.mtu
            )));
        }
        let _one = self.connecting.lock();
        let s = self.set_state.load(Ordering::SeqCst);
        if s != SET_RESET {
            return Err(Error::InvalidState(format!(
                "connect in {:?}, needs RESET",
                self.state()
            )));
        }
        if let Err(e) = self.walk_to_rts(remote, attr) {
            if let Err(e2) = self.to_state(ibv_qp_state::IBV_QPS_RESET, "ibv_modify_qp(RESET)") {
                tracing::warn!(
                    "QP {:#x} back to RESET after a failed connect: {e2}",
                    self.qpn
                );
            }
            return Err(e);
        }
        self.set_state
            .compare_exchange(SET_RESET, SET_RTS, Ordering::SeqCst, Ordering::SeqCst)
            .map_err(|_| Error::InvalidState("QP moved to ERR during connect".into()))?;
        Ok(())
    }

    fn to_err(&self) -> Result<()> {
        self.set_state.store(SET_ERR, Ordering::SeqCst);
        self.ledger
            .enter_err(|| self.to_state(ibv_qp_state::IBV_QPS_ERR, "ibv_modify_qp(ERR)"))
    }

    /// RTS→SQD with `en_sqd_async_notify`, so the device raises SQ_DRAINED.
    fn to_sqd(&self) -> Result<()> {
        let _one = self.connecting.lock();
        match self.set_state.load(Ordering::SeqCst) {
            SET_SQD => return Ok(()),
            SET_RTS => {}
            _ => {
                return Err(Error::InvalidState(format!(
                    "to_sqd in {:?}, needs RTS or SQD",
                    self.state()
                )));
            }
        }
        // SAFETY: ibv_qp_attr is plain C data; all-zero is a valid value.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_SQD;
        a.en_sqd_async_notify = 1;
        // SAFETY: the QP is valid; `a` is a fully initialised attribute struct.
        let rc = unsafe {
            sys::ibv_modify_qp(
                self.qp,
                &mut a,
                (M::IBV_QP_STATE | M::IBV_QP_EN_SQD_ASYNC_NOTIFY).0 as libc::c_int,
            )
        };
        match rc {
            0 => {}
            libc::EINVAL => {
                return Err(Error::InvalidState(format!(
                    "ibv_modify_qp(SQD) refused in {:?}",
                    self.state()
                )));
            }
            libc::EOPNOTSUPP | libc::ENOSYS => {
                return Err(Error::Unsupported("the device has no SQD state".into()));
            }
            e => return Err(os_err("ibv_modify_qp(SQD)", Some(e))),
        }
        let _ =
            self.set_state
                .compare_exchange(SET_RTS, SET_SQD, Ordering::SeqCst, Ordering::SeqCst);
        Ok(())
    }

    fn to_rts(&self) -> Result<()> {
        let _one = self.connecting.lock();
        if self.set_state.load(Ordering::SeqCst) != SET_SQD {
            return Err(Error::InvalidState(format!(
                "to_rts in {:?}, needs SQD",
                self.state()
            )));
        }
        // SAFETY: ibv_qp_attr is plain C data; all-zero is a valid value.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        // SAFETY: the QP is valid; `a` is a fully initialised attribute struct.
        let rc = unsafe { sys::ibv_modify_qp(self.qp, &mut a, M::IBV_QP_STATE.0 as libc::c_int) };
        match rc {
            0 => {}
            // rxe refuses to leave SQD while the send queue still drains.
            libc::EINVAL => {
                return Err(Error::InvalidState(
                    "ibv_modify_qp(SQD→RTS) refused (still draining?)".into(),
                ));
            }
            e => return Err(os_err("ibv_modify_qp(RTS)", Some(e))),
        }
        let _ =
            self.set_state
                .compare_exchange(SET_SQD, SET_RTS, Ordering::SeqCst, Ordering::SeqCst);
        Ok(())
    }

    fn post_send(&self, wr: &SendWr<'_>) -> Result<()> {
        super::post::post_send(self, wr)
    }

    fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        super::post::post_recv(self, wr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_transition_names_the_call_once_with_its_attributes() {
        // SAFETY: ibv_qp_attr is plain C data; all-zero is a valid value.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.path_mtu = convert::mtu_code(1024);
        a.dest_qp_num = 0x11;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.sgid_index = 7;
        let mask = M::IBV_QP_STATE | M::IBV_QP_AV | M::IBV_QP_PATH_MTU | M::IBV_QP_DEST_QPN;
        let msg = refused("ibv_modify_qp(RTR)", &attr_summary(&a, mask)).to_string();
        assert_eq!(msg.matches("ibv_modify_qp").count(), 1, "{msg}");
        for part in [
            "ibv_modify_qp(RTR) refused",
            "path_mtu 1024",
            "dest_qp_num 0x11",
            "sgid_index 7",
        ] {
            assert!(msg.contains(part), "{part:?} missing from {msg:?}");
        }
    }
}
