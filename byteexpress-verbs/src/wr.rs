//! What both providers check of a work request, and the completion opcode of a send WR: one
//! place, so every provider refuses the same WRs with the same errors (`ibv_post_send(3)`,
//! `ibv_post_srq_recv(3)`).

use crate::{Access, Error, MwBind, Pd, QpCap, RecvWr, Result, SendWr, WcOpcode, WrOp};

/// Largest message (`ibv_post_send(3)`: 2^31 bytes).
pub(crate) const MAX_MSG_LEN: u64 = 1 << 31;

/// The `enum ibv_wc_opcode` of a send WR's completion.
#[inline]
pub(crate) fn wc_opcode(op: WrOp<'_>) -> WcOpcode {
    match op {
        WrOp::Send | WrOp::SendWithImm(_) | WrOp::SendWithInv { .. } => WcOpcode::Send,
        WrOp::Write { .. } | WrOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
        WrOp::Read { .. } => WcOpcode::RdmaRead,
        WrOp::BindMw(_) => WcOpcode::BindMw,
        WrOp::LocalInv { .. } => WcOpcode::LocalInv,
    }
}

/// The rkey a bind gives a memory window whose rkey is `rkey`: same key index (upper 24
/// bits), next key byte (`ibv_inc_rkey`, `ibv_bind_mw(3)`).
pub(crate) fn next_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// A memory-window bind against the rules of [`MwBind`] (IB spec C10-72..75), for a QP of
/// `qp_pd`. Errors: `InvalidArgument`.
pub(crate) fn check_bind(b: &MwBind<'_>, qp_pd: &Pd) -> Result<()> {
    let bad = |why: String| Err(Error::InvalidArgument(format!("memory window bind: {why}")));
    if !std::sync::Arc::ptr_eq(&b.mw.pd.inner, &qp_pd.inner) {
        return bad("the window is of another PD than the QP (C10-72)".into());
    }
    if b.len == 0 {
        return bad("empty range (a type 2 window is invalidated, not bound empty)".into());
    }
    let (lo, hi) = (b.mr.addr(), b.mr.addr() + b.mr.len() as u64);
    if b.addr < lo || b.addr.checked_add(b.len).is_none_or(|end| end > hi) {
        return bad(format!(
            "[{:#x}, +{}) is not inside the MR [{lo:#x}, {hi:#x})",
            b.addr, b.len
        ));
    }
    let remote = Access(Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);
    if b.access.0 & !remote.0 != 0 {
        return bad(format!(
            "access {:?}: a window grants only REMOTE_READ / REMOTE_WRITE",
            b.access
        ));
    }
    if !b.mr.access().contains(Access::MW_BIND) {
        return bad("the MR was not registered with Access::MW_BIND (C10-73)".into());
    }
    if b.access.contains(Access::REMOTE_WRITE) && !b.mr.access().contains(Access::LOCAL_WRITE) {
        return bad("REMOTE_WRITE over an MR without LOCAL_WRITE (C10-74)".into());
    }
    Ok(())
}

/// The limits of a send WR against the QP's `cap`: SGE count (`max_send_sge`), total length
/// (2^31), inline length (`max_inline_data`), no inline READ. Returns the total length in
/// bytes. Errors: `InvalidArgument`. The QP state is each provider's own check.
pub(crate) fn check_send(wr: &SendWr<'_>, cap: &QpCap) -> Result<u64> {
    if matches!(wr.op, WrOp::BindMw(_) | WrOp::LocalInv { .. })
        && (!wr.sg_list.is_empty() || wr.inline)
    {
        return Err(Error::InvalidArgument(
            "a memory-window bind or LOCAL_INV carries no SGE and is not inline".into(),
        ));
    }
    let n = wr.sg_list.len();
    if n > cap.max_send_sge as usize {
        return Err(Error::InvalidArgument(format!(
            "{n} SGEs exceed max_send_sge {}",
            cap.max_send_sge
        )));
    }
    let total: u64 = wr.sg_list.iter().map(|s| u64::from(s.len)).sum();
    if total > MAX_MSG_LEN {
        return Err(Error::InvalidArgument(format!("{total} bytes exceed 2^31")));
    }
    if wr.inline {
        if total > u64::from(cap.max_inline_data) {
            return Err(Error::InvalidArgument(format!(
                "{total} inline bytes exceed max_inline_data {}",
                cap.max_inline_data
            )));
        }
        if matches!(wr.op, WrOp::Read { .. }) {
            return Err(Error::InvalidArgument("RDMA READ cannot be inline".into()));
        }
    }
    Ok(total)
}

/// A receive WR posted to an SRQ of `max_sge` SGEs per WR. Errors: `InvalidArgument`.
pub(crate) fn check_srq_recv(wr: &RecvWr<'_>, max_sge: u32) -> Result<()> {
    let n = wr.sg_list.len();
    if n > max_sge as usize {
        return Err(Error::InvalidArgument(format!(
            "{n} SGEs exceed the SRQ's max_sge {max_sge}"
        )));
    }
    Ok(())
}
