//! Plain data of the verbs API: access flags, SGEs, work requests, completions, QP attributes.

use crate::WcStatus;

/// Access flags of an MR or a QP (`enum ibv_access_flags`, same bit values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u32);

impl Access {
    /// `IBV_ACCESS_LOCAL_WRITE`: the device may write (receive, READ response) into it.
    pub const LOCAL_WRITE: Access = Access(1);
    /// `IBV_ACCESS_REMOTE_WRITE`
    pub const REMOTE_WRITE: Access = Access(2);
    /// `IBV_ACCESS_REMOTE_READ`
    pub const REMOTE_READ: Access = Access(4);
    /// `IBV_ACCESS_MW_BIND`: memory windows may be bound over this MR ([`WrOp::BindMw`];
    /// `ibv_bind_mw(3)`, IB spec C10-73). Not part of [`Access::ALL`]; never a flag of a QP.
    pub const MW_BIND: Access = Access(16);
    /// Everything an RPC transport needs on its pool memory.
    pub const ALL: Access = Access(1 | 2 | 4);
    /// Every flag this crate knows for an MR ([`Access::ALL`] and [`Access::MW_BIND`]).
    pub(crate) const MR_FLAGS: Access = Access(1 | 2 | 4 | 16);

    /// True when every flag of `other` is set in `self`.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// One scatter/gather element (`struct ibv_sge`): `len` bytes at virtual address `addr` of this
/// process, inside the MR whose lkey is `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address in this process.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the MR that contains `[addr, addr + len)`.
    pub lkey: u32,
}

/// The operation of a send-queue WR (`enum ibv_wr_opcode`). `'a`: the verbs objects a
/// [`WrOp::BindMw`] names, borrowed for the post only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrOp<'a> {
    /// `IBV_WR_SEND`: consumes the peer's next posted receive.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`: as `Send`, the 32-bit immediate reaches the peer's receive CQE.
    SendWithImm(u32),
    /// `IBV_WR_RDMA_WRITE` to `remote_addr` in the peer's MR `rkey`.
    Write {
        /// Peer virtual address.
        remote_addr: u64,
        /// Peer MR key with REMOTE_WRITE.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: also consumes a peer receive and gives it `imm`.
    WriteWithImm {
        /// Peer virtual address.
        remote_addr: u64,
        /// Peer MR key with REMOTE_WRITE.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// `IBV_WR_RDMA_READ` from `remote_addr` in the peer's MR `rkey` into the local SGEs.
    Read {
        /// Peer virtual address.
        remote_addr: u64,
        /// Peer MR key with REMOTE_READ.
        rkey: u32,
    },
    /// `IBV_WR_BIND_MW` of a type 2 memory window (`ibv_post_send(3)`, IB spec 10.6.7): in QP
    /// order, once every earlier WR of the send queue executed, the window grants the peer of
    /// this QP (and no other QP) `access` to its range; completes with [`WcOpcode::BindMw`].
    /// The WR carries no SGE. On a successful post the window's rkey is its old rkey with the
    /// low 8 bits (the key byte) incremented ([`crate::Mw::rkey`], `ibv_inc_rkey`): the peer
    /// uses that rkey.
    BindMw(MwBind<'a>),
    /// `IBV_WR_LOCAL_INV`: in QP order, invalidates the memory window whose current rkey is
    /// `rkey` (`ibv_post_send(3)`); afterwards a peer's READ/WRITE with it fails with
    /// `REM_ACCESS_ERR`. Completes with [`WcOpcode::LocalInv`]; an rkey that names no bound
    /// window of this device fails the WR with `LOC_QP_OP_ERR` (as rxe). No SGE.
    LocalInv {
        /// Current rkey of a bound type 2 memory window of this device.
        rkey: u32,
    },
    /// `IBV_WR_SEND_WITH_INV`: a SEND that, at the receiver, invalidates the receiver's memory
    /// window `rkey` before its receive completes; the receive completion reports it
    /// ([`Wc::invalidated_rkey`]). An rkey that names no window bound for this connection at
    /// the receiver fails the message (receiver and sender: `REM_INV_REQ_ERR`, as rxe).
    SendWithInv {
        /// Current rkey of one of the peer's bound type 2 memory windows.
        rkey: u32,
    },
}

/// What [`WrOp::BindMw`] binds (`struct ibv_mw_bind_info`, `ibv_bind_mw(3)`): `len` bytes at
/// virtual address `addr` of `mr`, with `access`.
///
/// Checked at post time for every provider ([`crate::Qp::post_send`], `InvalidArgument`):
/// `len > 0`, the range inside `mr`, `access` only `REMOTE_READ` / `REMOTE_WRITE`, `mr`
/// registered with [`Access::MW_BIND`] (C10-73), `REMOTE_WRITE` only over an MR with
/// `LOCAL_WRITE` (C10-74), `mw` allocated in the QP's PD (C10-72).
#[derive(Debug, Clone, Copy)]
pub struct MwBind<'a> {
    /// The window ([`crate::Pd::alloc_mw`]); it must be unbound (type 2: free, or invalidated)
    /// when the WR executes, else the WR completes with `MW_BIND_ERR`.
    pub mw: &'a crate::Mw,
    /// The MR the window lies in (same PD).
    pub mr: &'a crate::Mr,
    /// Start (virtual address in this process, inside `mr`).
    pub addr: u64,
    /// Length in bytes (> 0).
    pub len: u64,
    /// `REMOTE_READ` and/or `REMOTE_WRITE`.
    pub access: Access,
}

impl PartialEq for MwBind<'_> {
    /// Same window, same MR (the same objects), same range and access.
    fn eq(&self, o: &Self) -> bool {
        std::ptr::eq(self.mw, o.mw)
            && self.mr.lkey() == o.mr.lkey()
            && (self.addr, self.len, self.access) == (o.addr, o.len, o.access)
    }
}

impl Eq for MwBind<'_> {}

/// A send-queue work request (`struct ibv_send_wr`, one per post).
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: WrOp<'a>,
    /// Local memory; total length ≤ 2^31 bytes; count ≤ the QP's max_send_sge.
    pub sg_list: &'a [Sge],
    /// `IBV_SEND_SIGNALED`: produce a CQE on success (errors always produce one).
    pub signaled: bool,
    /// `IBV_SEND_INLINE`: the payload is copied at post time (≤ max_inline_data bytes) and the
    /// SGEs' lkeys are not checked.
    pub inline: bool,
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Buffers filled in order by the incoming message; count ≤ max_recv_sge.
    pub sg_list: &'a [Sge],
}

/// Opcode of a completion (`enum ibv_wc_opcode`, same values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`
    Send = 0,
    /// `IBV_WC_RDMA_WRITE`
    RdmaWrite = 1,
    /// `IBV_WC_RDMA_READ`
    RdmaRead = 2,
    /// `IBV_WC_BIND_MW`: a [`WrOp::BindMw`] completed.
    BindMw = 5,
    /// `IBV_WC_LOCAL_INV`: a [`WrOp::LocalInv`] completed.
    LocalInv = 6,
    /// `IBV_WC_RECV`
    Recv = 128,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`
    RecvRdmaWithImm = 129,
}

/// A work completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    /// The WR's `wr_id`.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed. For error completions it is the WR's kind as far as known.
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred (READ).
    pub byte_len: u32,
    /// Immediate data of SEND_WITH_IMM / WRITE_WITH_IMM.
    pub imm: Option<u32>,
    /// QP number the WR was posted on.
    pub qp_num: u32,
    /// Receive completion of a [`WrOp::SendWithInv`]: the rkey of our memory window it
    /// invalidated (`IBV_WC_WITH_INV`, `ibv_wc.invalidated_rkey`).
    pub invalidated_rkey: Option<u32>,
}

impl Default for Wc {
    fn default() -> Self {
        Wc {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm: None,
            qp_num: 0,
            invalidated_rkey: None,
        }
    }
}

/// Queue sizes of a QP (`struct ibv_qp_cap`). The device may round them up; the QP reports the
/// granted values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Outstanding send WRs.
    pub max_send_wr: u32,
    /// Outstanding receive WRs.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Bytes a WR may carry inline.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        QpCap {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        }
    }
}

/// QP states (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// `IBV_QPS_RESET`
    Reset,
    /// `IBV_QPS_INIT`
    Init,
    /// `IBV_QPS_RTR`: may receive.
    Rtr,
    /// `IBV_QPS_RTS`: may send.
    Rts,
    /// `IBV_QPS_SQD`
    Sqd,
    /// `IBV_QPS_ERR`: every outstanding WR completes with WR_FLUSH_ERR.
    Err,
}

/// Attributes for RESET→INIT→RTR→RTS that are not part of the peer's [`crate::Endpoint`]
/// (`ibv_modify_qp(3)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectAttr {
    /// Access flags granted to the peer on this QP (`qp_access_flags`).
    pub access: crate::Access,
    /// Minimum RNR NAK timer code (`min_rnr_timer`, 0..=31; 12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// Local ACK timeout code: 4.096 µs · 2^timeout (`timeout`, 0..=31; 14 ≈ 67 ms).
    pub timeout: u8,
    /// Transport retries (`retry_cnt`, 0..=7).
    pub retry_cnt: u8,
    /// RNR retries (`rnr_retry`, 0..=7; 7 = forever).
    pub rnr_retry: u8,
    /// Path MTU in bytes (256..=4096); the smaller of both sides' active MTU is used.
    pub mtu: u32,
}

impl Default for ConnectAttr {
    fn default() -> Self {
        ConnectAttr {
            access: Access::ALL,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            mtu: 4096,
        }
    }
}

/// Limits of a device (`struct ibv_device_attr` and port attributes), as enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Max WRs per queue.
    pub max_qp_wr: u32,
    /// Max SGEs per WR.
    pub max_sge: u32,
    /// Max inline bytes per WR.
    pub max_inline_data: u32,
    /// Max CQEs per CQ.
    pub max_cqe: u32,
    /// Largest MR in bytes.
    pub max_mr_size: u64,
    /// Active MTU of port 1 in bytes.
    pub active_mtu: u32,
    /// True when remote access (and use as a receive buffer by a peer process) is possible only
    /// on memory from [`crate::Pd::alloc_shared`] (the soft provider); false on NICs, where any
    /// registered memory will do.
    pub remote_access_needs_shared: bool,
    /// True when a peer's READ/WRITE with a memory window's rkey is checked against the
    /// window's bound range ([`crate::MwBind`]), as the IB spec has it (the soft provider,
    /// NICs). False on rxe (kernel Soft-RoCE, Linux 6.1): its responder checks the range of the
    /// window's MR only (`rxe_resp.c` `check_rkey`), so a bound window grants its whole MR
    /// (the window's access and the QP it was bound on are still checked). Seen in the VM: a
    /// READ one byte before the window, or past its end, inside the MR, succeeded. Where a
    /// window must grant no more than its range, bind it over an MR of that range there.
    pub mw_range_checked: bool,
    /// Largest message of one WR in bytes (`max_msg_sz` of port 1, `ibv_query_port(3)`): a
    /// READ of more must be split into several WRs. 2^31 on the soft provider and rxe.
    pub max_msg_sz: u64,
    /// RDMA READs this side may have outstanding on one QP as the requester
    /// (`max_qp_init_rd_atom`, `ibv_query_device(3)`; what link set-up gives `max_rd_atomic`),
    /// at least 1. More posted READs wait in the send queue behind them.
    pub max_reads_outstanding: u32,
}

/// Attributes of a shared receive queue (`struct ibv_srq_attr`, `ibv_create_srq(3)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Outstanding receive WRs the SRQ holds. The device may round it up; [`crate::Srq::attr`]
    /// reports the granted value, at which posting becomes `QueueFull`.
    pub max_wr: u32,
    /// SGEs per receive WR.
    pub max_sge: u32,
    /// Limit (`ibv_modify_srq(3)`, `IBV_SRQ_LIMIT`): when nonzero, the SRQ is armed at creation
    /// and raises [`AsyncEvent::SrqLimitReached`] once fewer WRs than this remain in it.
    /// 0 = not armed (`ibv_create_srq(3)` itself ignores the field; this crate arms it).
    pub srq_limit: u32,
}

impl Default for SrqAttr {
    fn default() -> Self {
        SrqAttr {
            max_wr: 256,
            max_sge: 1,
            srq_limit: 0,
        }
    }
}

/// An asynchronous event of a device (`struct ibv_async_event`, `ibv_get_async_event(3)`),
/// naming the object it is about. The numbers of [`AsyncEvent::code`] are those of rdma-core's
/// `enum ibv_event_type`. Non-exhaustive: rdma-core adds event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// `IBV_EVENT_CQ_ERR`: the CQ overran (more completions than its size); it is unusable.
    CqErr {
        /// [`crate::Cq::id`] of the CQ.
        cq: u64,
    },
    /// `IBV_EVENT_QP_FATAL`: an error no completion can report (e.g. a peer wrote garbage into
    /// shared queue state); the QP is in ERR.
    QpFatal {
        /// QP number.
        qp_num: u32,
    },
    /// `IBV_EVENT_QP_REQ_ERR`: the responder saw an invalid request; the QP is in ERR.
    QpReqErr {
        /// QP number.
        qp_num: u32,
    },
    /// `IBV_EVENT_QP_ACCESS_ERR`: a remote access violation at the responder; the QP is in ERR.
    QpAccessErr {
        /// QP number.
        qp_num: u32,
    },
    /// `IBV_EVENT_COMM_EST`: the first packet arrived on a QP in RTR.
    CommEst {
        /// QP number.
        qp_num: u32,
    },
    /// `IBV_EVENT_SQ_DRAINED`: a QP moved to SQD has no send WR in progress any more.
    SqDrained {
        /// QP number.
        qp_num: u32,
    },
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP attached to an SRQ went to ERR and will take no
    /// more WRs from the SRQ.
    QpLastWqeReached {
        /// QP number.
        qp_num: u32,
    },
    /// `IBV_EVENT_SRQ_ERR`: the SRQ failed.
    SrqErr {
        /// [`crate::Srq::id`] of the SRQ.
        srq: u64,
    },
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: fewer WRs than the armed limit remain in the SRQ; the
    /// limit is disarmed (`ibv_modify_srq(3)`).
    SrqLimitReached {
        /// [`crate::Srq::id`] of the SRQ.
        srq: u64,
    },
    /// `IBV_EVENT_PORT_ACTIVE`
    PortActive {
        /// Port number.
        port: u8,
    },
    /// `IBV_EVENT_PORT_ERR`
    PortErr {
        /// Port number.
        port: u8,
    },
    /// `IBV_EVENT_DEVICE_FATAL`: the device is unusable.
    DeviceFatal,
    /// Any other `enum ibv_event_type` value.
    Other {
        /// The `ibv_event_type` number.
        code: u32,
    },
}

impl AsyncEvent {
    /// The `enum ibv_event_type` number.
    pub fn code(&self) -> u32 {
        match self {
            AsyncEvent::CqErr { .. } => 0,
            AsyncEvent::QpFatal { .. } => 1,
            AsyncEvent::QpReqErr { .. } => 2,
            AsyncEvent::QpAccessErr { .. } => 3,
            AsyncEvent::CommEst { .. } => 4,
            AsyncEvent::SqDrained { .. } => 5,
            AsyncEvent::DeviceFatal => 8,
            AsyncEvent::PortActive { .. } => 9,
            AsyncEvent::PortErr { .. } => 10,
            AsyncEvent::SrqErr { .. } => 14,
            AsyncEvent::SrqLimitReached { .. } => 15,
            AsyncEvent::QpLastWqeReached { .. } => 16,
            AsyncEvent::Other { code } => *code,
        }
    }
}
