//! Plain-data conversions between this crate's types and rdma-core's: MTU codes
//! (`enum ibv_mtu`), access flags (`enum ibv_access_flags`), completions (`struct ibv_wc`,
//! `ibv_poll_cq(3)`), QP states (`enum ibv_qp_state`).

use rdma_mummy_sys::{ibv_mtu, ibv_qp_state, ibv_wc, ibv_wc_flags};

use crate::{Access, Error, QpState, Result, Wc, WcOpcode, WcStatus};

/// Bytes of an `enum ibv_mtu` code (1 = 256 … 5 = 4096); 0 for an unknown code.
pub(crate) fn mtu_bytes(code: ibv_mtu::Type) -> u32 {
    match code {
        1..=5 => 256 << (code - 1),
        _ => 0,
    }
}

/// The largest `enum ibv_mtu` code not above `bytes` (at least `IBV_MTU_256`).
pub(crate) fn mtu_code(bytes: u32) -> ibv_mtu::Type {
    (1..=5u32)
        .rev()
        .find(|&c| 256u32 << (c - 1) <= bytes)
        .unwrap_or(1)
}

/// The `ibv_access_flags` bits of `a`: the values are the same; bits this crate does not define
/// (atomics, on-demand paging, …) are refused.
pub(crate) fn access_bits(a: Access) -> Result<u32> {
    if a.0 & !Access::ALL.0 != 0 {
        return Err(Error::InvalidArgument(format!(
            "access flags {:#x} include bits this crate does not support",
            a.0
        )));
    }
    Ok(a.0)
}

/// As [`access_bits`], for an MR: [`Access::MW_BIND`] (`IBV_ACCESS_MW_BIND`) allowed too.
pub(crate) fn mr_access_bits(a: Access) -> Result<u32> {
    access_bits(Access(a.0 & !Access::MW_BIND.0)).map(|b| b | (a.0 & Access::MW_BIND.0))
}

/// The kernel's `IB_WC_WITH_INVALIDATE` (`enum ib_wc_flags`, 1 << 2; libibverbs'
/// `IBV_WC_WITH_INV` is 1 << 3, its 1 << 2 being `IBV_WC_IP_CSUM_OK`). rxe's userspace
/// provider (rdma-core 44, kernel 6.1) copies the kernel's completion flags unconverted: the
/// receive of a SEND_WITH_INV came with flags 0x5 (GRH | this bit) and the rkey in the union,
/// seen in the Soft-RoCE VM.
pub(crate) const KERNEL_WC_WITH_INVALIDATE: u32 = 1 << 2;

/// `enum ibv_wc_status` number → [`WcStatus`]; statuses without a variant of their own
/// (BAD_RESP, LOC_ACCESS, REM_ABORT, FATAL, RESP_TIMEOUT, …) are `GeneralErr`.
pub(crate) fn wc_status(code: u32) -> WcStatus {
    match code {
        0 => WcStatus::Success,
        1 => WcStatus::LocLenErr,
        2 => WcStatus::LocQpOpErr,
        4 => WcStatus::LocProtErr,
        5 => WcStatus::WrFlushErr,
        6 => WcStatus::MwBindErr,
        9 => WcStatus::RemInvReqErr,
        10 => WcStatus::RemAccessErr,
        11 => WcStatus::RemOpErr,
        12 => WcStatus::RetryExcErr,
        13 => WcStatus::RnrRetryExcErr,
        _ => WcStatus::GeneralErr,
    }
}

/// `enum ibv_wc_opcode` → [`WcOpcode`]. `ibv_poll_cq(3)`: the opcode of an error completion is
/// undefined; unknown codes read as `Send`.
fn wc_opcode(code: u32) -> WcOpcode {
    match code {
        1 => WcOpcode::RdmaWrite,
        2 => WcOpcode::RdmaRead,
        5 => WcOpcode::BindMw,
        6 => WcOpcode::LocalInv,
        128 => WcOpcode::Recv,
        129 => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Send,
    }
}

/// One `ibv_wc` as a [`Wc`]. The immediate arrives in network byte order and is returned in
/// host order, present only when `IBV_WC_WITH_IMM` is set on a successful completion; the
/// invalidated rkey (host order) only when `IBV_WC_WITH_INV` is, or, with `kernel_flags` (rxe:
/// [`KERNEL_WC_WITH_INVALIDATE`]), the kernel's bit for it.
pub(crate) fn wc(w: &ibv_wc, kernel_flags: bool) -> Wc {
    let status = wc_status(w.status);
    let with_imm = w.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
    let imm = (status == WcStatus::Success && with_imm).then(|| {
        // SAFETY: with IBV_WC_WITH_IMM set the union holds `imm_data` (ibv_poll_cq(3)); both
        // members are plain u32s, so reading either is defined anyway.
        u32::from_be(unsafe { w.imm_data_invalidated_rkey_union.imm_data })
    });
    let inv_bit = if kernel_flags {
        KERNEL_WC_WITH_INVALIDATE
    } else {
        ibv_wc_flags::IBV_WC_WITH_INV.0
    };
    let with_inv = w.wc_flags & inv_bit != 0;
    // SAFETY: with IBV_WC_WITH_INV set the union holds `invalidated_rkey` (host order,
    // ibv_poll_cq(3)); both members are plain u32s, so reading either is defined anyway.
    let rkey = unsafe { w.imm_data_invalidated_rkey_union.invalidated_rkey };
    let invalidated_rkey = (status == WcStatus::Success && with_inv).then_some(rkey);
    Wc {
        wr_id: w.wr_id,
        status,
        opcode: wc_opcode(w.opcode),
        byte_len: w.byte_len,
        imm,
        qp_num: w.qp_num,
        invalidated_rkey,
    }
}

/// `enum ibv_qp_state` → [`QpState`]; unknown values (`IBV_QPS_SQE`, `IBV_QPS_UNKNOWN`) read as
/// `Err`: the QP cannot send.
pub(crate) fn qp_state(s: ibv_qp_state::Type) -> QpState {
    match s {
        ibv_qp_state::IBV_QPS_RESET => QpState::Reset,
        ibv_qp_state::IBV_QPS_INIT => QpState::Init,
        ibv_qp_state::IBV_QPS_RTR => QpState::Rtr,
        ibv_qp_state::IBV_QPS_RTS => QpState::Rts,
        ibv_qp_state::IBV_QPS_SQD => QpState::Sqd,
        _ => QpState::Err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_codes_and_bytes_round_trip() {
        for (code, bytes) in [(1, 256), (2, 512), (3, 1024), (4, 2048), (5, 4096)] {
            assert_eq!(mtu_bytes(code), bytes);
            assert_eq!(mtu_code(bytes), code);
        }
        assert_eq!(mtu_code(1500), 3);
        assert_eq!(mtu_code(9000), 5);
        assert_eq!(mtu_code(0), 1);
        assert_eq!(mtu_bytes(0), 0);
        assert_eq!(mtu_bytes(6), 0);
    }

    #[test]
    fn statuses_keep_their_ibv_numbers() {
        for s in [
            WcStatus::Success,
            WcStatus::LocLenErr,
            WcStatus::LocQpOpErr,
            WcStatus::LocProtErr,
            WcStatus::WrFlushErr,
            WcStatus::RemInvReqErr,
            WcStatus::RemAccessErr,
            WcStatus::RemOpErr,
            WcStatus::RetryExcErr,
            WcStatus::RnrRetryExcErr,
            WcStatus::GeneralErr,
        ] {
            assert_eq!(wc_status(s.code()), s);
        }
        assert_eq!(wc_status(18), WcStatus::GeneralErr);
    }

    #[test]
    fn immediate_is_converted_from_network_order_only_on_success() {
        // SAFETY: ibv_wc is plain data; all-zero is a valid value.
        let mut w: ibv_wc = unsafe { std::mem::zeroed() };
        w.opcode = 129;
        w.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM.0;
        w.imm_data_invalidated_rkey_union.imm_data = 0x1234_5678u32.to_be();
        let c = wc(&w, false);
        assert_eq!(
            (c.opcode, c.imm),
            (WcOpcode::RecvRdmaWithImm, Some(0x1234_5678))
        );
        w.status = 5;
        assert_eq!(wc(&w, false).imm, None);
    }

    #[test]
    fn the_invalidated_rkey_is_read_by_libibverbs_flag_or_by_rxes_kernel_flag() {
        // SAFETY: ibv_wc is plain data; all-zero is a valid value.
        let mut w: ibv_wc = unsafe { std::mem::zeroed() };
        w.opcode = 128;
        w.imm_data_invalidated_rkey_union.invalidated_rkey = 0x8000_0102;
        w.wc_flags = ibv_wc_flags::IBV_WC_WITH_INV.0;
        assert_eq!(wc(&w, false).invalidated_rkey, Some(0x8000_0102));
        // rxe's receive of a SEND_WITH_INV, as polled in the VM: GRH | kernel WITH_INVALIDATE.
        w.wc_flags = 0x5;
        assert_eq!(wc(&w, true).invalidated_rkey, Some(0x8000_0102));
        assert_eq!(wc(&w, false).invalidated_rkey, None, "IP_CSUM_OK elsewhere");
        w.status = 10;
        assert_eq!(wc(&w, true).invalidated_rkey, None, "only on success");
    }

    #[test]
    fn unknown_access_bits_are_refused() {
        assert_eq!(access_bits(Access::ALL).unwrap(), 7);
        assert!(access_bits(Access(8)).is_err());
        assert!(access_bits(Access::MW_BIND).is_err(), "not a QP flag");
        assert_eq!(
            mr_access_bits(Access::MW_BIND | Access::LOCAL_WRITE).unwrap(),
            17
        );
        assert!(mr_access_bits(Access(8 | 16)).is_err());
    }
}
