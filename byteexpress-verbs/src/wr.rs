//! What both providers check of a work request, and the completion opcode of a send WR: one
//! place, so every provider refuses the same WRs with the same errors (`ibv_post_send(3)`,
//! `ibv_post_srq_recv(3)`).

use crate::{Error, QpCap, RecvWr, Result, SendWr, WcOpcode, WrOp};

/// Largest message (`ibv_post_send(3)`: 2^31 bytes).
pub(crate) const MAX_MSG_LEN: u64 = 1 << 31;

/// The `enum ibv_wc_opcode` of a send WR's completion.
#[inline]
pub(crate) fn wc_opcode(op: WrOp) -> WcOpcode {
    match op {
        WrOp::Send | WrOp::SendWithImm(_) => WcOpcode::Send,
        WrOp::Write { .. } | WrOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
        WrOp::Read { .. } => WcOpcode::RdmaRead,
    }
}

/// The limits of a send WR against the QP's `cap`: SGE count (`max_send_sge`), total length
/// (2^31), inline length (`max_inline_data`), no inline READ. Returns the total length in
/// bytes. Errors: `InvalidArgument`. The QP state is each provider's own check.
pub(crate) fn check_send(wr: &SendWr<'_>, cap: &QpCap) -> Result<u64> {
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
