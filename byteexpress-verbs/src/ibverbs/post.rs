//! Posting work requests: `ibv_post_send(3)` and `ibv_post_recv(3)`, one WR per call.
//!
//! Limits (SGE count, inline size, total length) and the QP state are checked here, before the
//! provider library sees the WR, so every provider refuses the same WRs with the same errors.
//! The library's own refusals map by errno: ENOMEM (queue full) → `QueueFull`, EINVAL →
//! `InvalidArgument`; on any error nothing was posted (the WR is alone in its list).

use std::sync::atomic::Ordering;

use rdma_mummy_sys::{self as sys, ibv_send_flags, ibv_wr_opcode};

use super::ledger::Wq;
use super::mw::IbvMw;
use super::os_err;
use super::qp::{IbvQp, SET_RESET, SET_SQD};
use crate::WcOpcode;
use crate::wr::{check_send, wc_opcode};
use crate::{Error, RecvWr, Result, SendWr, Sge, WrOp};

/// SGE lists up to this length are built on the stack.
const STACK_SGES: usize = 8;

/// Calls `f` with the list as `ibv_sge`s.
pub(crate) fn with_sges<R>(list: &[Sge], f: impl FnOnce(*mut sys::ibv_sge, i32) -> R) -> R {
    let conv = |s: &Sge| sys::ibv_sge {
        addr: s.addr,
        length: s.len,
        lkey: s.lkey,
    };
    let zero = sys::ibv_sge {
        addr: 0,
        length: 0,
        lkey: 0,
    };
    if list.len() <= STACK_SGES {
        let mut a = [zero; STACK_SGES];
        for (d, s) in a.iter_mut().zip(list) {
            *d = conv(s);
        }
        f(a.as_mut_ptr(), list.len() as i32)
    } else {
        let mut v: Vec<sys::ibv_sge> = list.iter().map(conv).collect();
        f(v.as_mut_ptr(), v.len() as i32)
    }
}

fn post_errno(rc: i32, queue: &'static str, call: &'static str) -> Error {
    match rc {
        libc::ENOMEM => Error::QueueFull(queue),
        libc::EINVAL => Error::InvalidArgument(format!("{call} refused the WR (EINVAL)")),
        e => os_err(call, Some(e)),
    }
}

pub(crate) fn post_send(qp: &IbvQp, wr: &SendWr<'_>) -> Result<()> {
    check_send(wr, &qp.cap)?;
    match qp.set_state.load(Ordering::SeqCst) {
        SET_RESET => {
            return Err(Error::InvalidState(
                "post_send before connect (needs RTS)".into(),
            ));
        }
        SET_SQD => return Err(Error::InvalidState("post_send in SQD (needs RTS)".into())),
        _ => {}
    }
    let mut flags = 0u32;
    if wr.signaled {
        flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if wr.inline {
        flags |= ibv_send_flags::IBV_SEND_INLINE.0;
    }
    // The CPU copies inline data during the call: every piece must lie in live registered
    // memory, held until the call returns.
    let mut held = Vec::new();
    if wr.inline {
        for s in wr.sg_list.iter().filter(|s| s.len > 0) {
            let mr = qp
                .pd
                .ctx
                .mr_containing(s.lkey, s.addr, u64::from(s.len))
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "inline SGE {:#x}+{} is not in memory registered on this device",
                        s.addr, s.len
                    ))
                })?;
            held.push(mr);
        }
    }
    // A bind names the window and the MR by their rdma-core objects: the MR is held until
    // the call returns, the window's lock until its new rkey is recorded.
    let bind = match wr.op {
        WrOp::BindMw(b) => {
            let mw =
                b.mw.inner.as_any().downcast_ref::<IbvMw>().ok_or_else(|| {
                    Error::InvalidArgument("memory window of another device".into())
                })?;
            let mr = qp
                .pd
                .ctx
                .mr_containing(b.mr.lkey(), b.addr, b.len)
                .filter(|m| crate::provider::MrImpl::lkey(&**m) == b.mr.lkey())
                .ok_or_else(|| {
                    Error::InvalidArgument("the bind's MR is not registered on this device".into())
                })?;
            Some((mw.mw.lock(), mr, b))
        }
        _ => None,
    };
    let mut q = qp.ledger.queue(Wq::Send);
    if q.full() {
        return Err(Error::QueueFull("send queue (max_send_wr) full"));
    }
    if qp.ledger.in_err() {
        if q.needs_drain() {
            post_drain(qp, &mut q);
        }
        q.push(wr.wr_id, wc_opcode(wr.op), true);
        drop(q);
        qp.send_cq.emit_flushed(&qp.ledger, Wq::Send);
        return Ok(());
    }
    let device_wr_id = q.next_device_wr_id(Wq::Send);
    let r = with_sges(wr.sg_list, |sges, num| {
        // SAFETY: ibv_send_wr is plain C data (unions of integers and pointers); all-zero is a
        // valid value (no next WR, no address handle).
        let mut w: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        w.wr_id = device_wr_id;
        w.sg_list = sges;
        w.num_sge = num;
        w.send_flags = flags;
        let rdma = |remote_addr, rkey| sys::wr_t {
            rdma: sys::rdma_t { remote_addr, rkey },
        };
        match wr.op {
            WrOp::Send => w.opcode = ibv_wr_opcode::IBV_WR_SEND,
            WrOp::SendWithImm(imm) => {
                w.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
                w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            }
            WrOp::Write { remote_addr, rkey } => {
                w.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                w.wr = rdma(remote_addr, rkey);
            }
            WrOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => {
                w.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                w.wr = rdma(remote_addr, rkey);
                w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            }
            WrOp::Read { remote_addr, rkey } => {
                w.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
                w.wr = rdma(remote_addr, rkey);
            }
            WrOp::SendWithInv { rkey } => {
                w.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_INV;
                w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
            }
            WrOp::LocalInv { rkey } => {
                w.opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
                w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
            }
            WrOp::BindMw(_) => {
                let Some((mw, mr, b)) = &bind else {
                    return Err(Error::InvalidArgument("bind without its objects".into()));
                };
                w.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
                // SAFETY: `**mw` is the live window (its lock is held).
                let old = unsafe { (***mw).rkey };
                w.bind_mw_tso_union.bind_mw = sys::bind_mw_t {
                    mw: **mw,
                    rkey: crate::wr::next_rkey(old),
                    bind_info: sys::ibv_mw_bind_info {
                        mr: mr.raw(),
                        addr: b.addr,
                        length: b.len,
                        mw_access_flags: b.access.0,
                    },
                };
            }
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is valid; `w` and the SGE array it points to live across the call
        // (inline data is copied during it; other SGEs name registered memory the caller keeps
        // untouched until completion, as documented on `Qp::post_send`).
        let rc = unsafe { sys::ibv_post_send(qp.qp, &mut w, &mut bad) };
        if rc == 0 {
            if let Some((mw, _, _)) = &bind {
                // `ibv_bind_mw(3)`: once the bind is posted the window's rkey is the new one
                // (the next bind names it as the window's current key).
                let raw: *mut sys::ibv_mw = **mw;
                // SAFETY: `raw` is the live window (`IbvMw` deallocates it only in Drop) and its
                // lock is held, so nothing else touches it; `bind_mw` is the union member
                // written above.
                unsafe { (*raw).rkey = w.bind_mw_tso_union.bind_mw.rkey };
            }
            Ok(())
        } else {
            Err(post_errno(
                rc,
                "send queue (max_send_wr) full",
                "ibv_post_send",
            ))
        }
    });
    if r.is_ok() {
        q.push(wr.wr_id, wc_opcode(wr.op), false);
    }
    drop(q);
    drop(held);
    drop(bind);
    r
}

pub(crate) fn post_recv(qp: &IbvQp, wr: &RecvWr<'_>) -> Result<()> {
    let n = wr.sg_list.len();
    if n > qp.cap.max_recv_sge as usize {
        return Err(Error::InvalidArgument(format!(
            "{n} SGEs exceed max_recv_sge {}",
            qp.cap.max_recv_sge
        )));
    }
    if qp.srq.is_some() {
        return Err(Error::InvalidArgument(
            "post_recv on a QP attached to an SRQ: post to the SRQ".into(),
        ));
    }
    if qp.set_state.load(Ordering::SeqCst) == SET_RESET {
        return Err(Error::InvalidState("post_recv in RESET".into()));
    }
    let mut q = qp.ledger.queue(Wq::Recv);
    if q.full() {
        return Err(Error::QueueFull("receive queue (max_recv_wr) full"));
    }
    if qp.ledger.in_err() {
        q.push(wr.wr_id, WcOpcode::Recv, true);
        drop(q);
        qp.recv_cq.emit_flushed(&qp.ledger, Wq::Recv);
        return Ok(());
    }
    let device_wr_id = q.next_device_wr_id(Wq::Recv);
    let r = with_sges(wr.sg_list, |sges, num| {
        let mut w = sys::ibv_recv_wr {
            wr_id: device_wr_id,
            next: std::ptr::null_mut(),
            sg_list: sges,
            num_sge: num,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is valid; `w` and its SGE array live across the call; the buffers
        // are registered memory the caller leaves to the device until the completion.
        let rc = unsafe { sys::ibv_post_recv(qp.qp, &mut w, &mut bad) };
        if rc == 0 {
            Ok(())
        } else {
            Err(post_errno(
                rc,
                "receive queue (max_recv_wr) full",
                "ibv_post_recv",
            ))
        }
    });
    if r.is_ok() {
        q.push(wr.wr_id, WcOpcode::Recv, false);
    }
    r
}

/// Posts the ledger's drain WR to the device (`ledger.rs`): a signaled SEND with no SGE, on a
/// QP in ERR, so it is flushed, never sent. If the device refuses it, it is not tried again,
/// and the WRs queued behind the device's wait until the device completes them, as they did
/// before drains existed.
fn post_drain(qp: &IbvQp, q: &mut super::ledger::Queue) {
    // SAFETY: ibv_send_wr is plain C data; all-zero is a valid value (no SGE, no next WR).
    let mut w: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
    w.wr_id = q.next_device_wr_id(Wq::Send);
    w.opcode = ibv_wr_opcode::IBV_WR_SEND;
    w.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
    let mut bad = std::ptr::null_mut();
    // SAFETY: the QP is valid; `w` is a complete WR with no SGE and no next WR.
    let rc = unsafe { sys::ibv_post_send(qp.qp, &mut w, &mut bad) };
    q.drain_tried(rc == 0);
    if rc != 0 {
        tracing::warn!(
            "QP {:#x}: drain WR refused: {}",
            qp.qpn,
            std::io::Error::from_raw_os_error(rc)
        );
    }
}
