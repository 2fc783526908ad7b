//! The receiver's side of a SEND (issue 22, item 2): the receiver copies. The peer's sender
//! only claims a receive WQE and leaves a descriptor in the completion slot that goes with it
//! (where the payload lies in memory the sender announced to us read-only, or in its staging
//! region); our recv CQ's poll (or the progress thread, when the sender nudges because nobody
//! polls) copies the payload into the buffers of our own private record of the posted receive,
//! produces the receive completion, writes the sender's verdict into the slot and advances
//! `comp_cons`: that is the ACK the sender's send completion waits for. So no peer ever holds
//! a mapping of a receive buffer, and the bytes a handler reads cannot change under it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use super::cq::CqState;
use super::pd::MrCache;
use super::peer::PeerShared;
use super::qp::{Posted, SoftQp};
use super::ring::{RawComp, RawSge, Src};
use super::send::Keep;
use crate::{Access, Wc, WcOpcode, WcStatus};

/// A posted receive's SGEs, kept in private memory (one without allocating).
#[derive(Debug, Clone)]
pub(crate) enum RecvSges {
    One(RawSge),
    Many(Box<[RawSge]>),
}

impl RecvSges {
    pub(crate) fn of(sg_list: &[crate::Sge]) -> RecvSges {
        let raw = |s: &crate::Sge| RawSge {
            addr: s.addr,
            len: s.len,
            key: s.lkey,
        };
        match sg_list {
            [s] => RecvSges::One(raw(s)),
            many => RecvSges::Many(many.iter().map(raw).collect()),
        }
    }

    pub(crate) fn as_slice(&self) -> &[RawSge] {
        match self {
            RecvSges::One(s) => std::slice::from_ref(s),
            RecvSges::Many(v) => v,
        }
    }
}

/// The receive side of a QP (under its receive lock).
#[derive(Debug, Default)]
pub(crate) struct RecvSide {
    /// Posted receives not yet completed, in order: the only record delivery trusts.
    pub(crate) shadow: VecDeque<Posted>,
    /// WQEs produced into the ring.
    pub(crate) prod: u64,
    /// Inbound completions consumed.
    pub(crate) comp_cons: u64,
    /// The peer wrote something impossible: its ring is no longer read.
    pub(crate) poisoned: bool,
    /// Flushed (ERR): an SRQ lends nothing more to this ring.
    pub(crate) closed: bool,
    /// The peer's announced memory and staging region (set when it attaches).
    pub(crate) src: Option<Arc<PeerShared>>,
    /// Our receive buffers' MRs, last used.
    pub(crate) mrs: MrCache,
}

/// Why one inbound message could not be delivered: (receiver's status, sender's status).
type Verdict = (WcStatus, WcStatus);

impl SoftQp {
    /// Moves inbound messages into `cq` (the recv CQ's locked state), copying each SEND's
    /// payload into the posted receive, and validating every index, length and descriptor the
    /// peer wrote. `ring_now`: ring the sender's send-CQ doorbell at once if it sleeps (else,
    /// when that doorbell is the one our next SEND rings anyway, the ACK is owed: our next
    /// send or our CQ's arm rings it). False when the QP must fail: the peer wrote something
    /// impossible (the ring is then no longer trusted) or a message failed.
    pub(crate) fn drain_locked(
        &self,
        recv: &mut RecvSide,
        cq: &mut CqState,
        keep: &mut Keep,
        ring_now: bool,
    ) -> bool {
        if recv.poisoned {
            return true;
        }
        let prod = self.ring.comp_prod().load(Ordering::Acquire);
        if prod == recv.comp_cons {
            return true;
        }
        // That the peer claimed each WQE it completes is checked per entry (its tag), not by
        // reading `recv_cons`: that line stays with the peer, whose claims are then cheap.
        let outstanding = recv.shadow.len() as u64;
        let Some(src) = recv.src.clone() else {
            return self.poison(recv, "completions before the peer attached");
        };
        if prod < recv.comp_cons || prod - recv.comp_cons > outstanding {
            return self.poison(recv, "impossible ring indices");
        }
        let mut ok = true;
        while recv.comp_cons < prod {
            let seq = recv.comp_cons;
            let Some(c) = self.ring.read_comp(seq).filter(|c| c.status == 0) else {
                return self.poison(recv, "a malformed completion");
            };
            let posted = recv.shadow.front().expect("checked against outstanding");
            let (opcode, verdict) = match c.opcode {
                x if x == WcOpcode::Recv as u32 && !(c.imm.is_some() && c.inv.is_some()) => {
                    match self.copy_in(&src, &c, posted, &mut recv.mrs, keep) {
                        Some(None) => (WcOpcode::Recv, self.invalidate_for_peer(c.inv)),
                        Some(v) => (WcOpcode::Recv, v),
                        None => return self.poison(recv, "a bad SEND descriptor"),
                    }
                }
                x if x == WcOpcode::RecvRdmaWithImm as u32
                    && c.imm.is_some()
                    && c.inv.is_none()
                    && c.src == Src::Placed =>
                {
                    (WcOpcode::RecvRdmaWithImm, None)
                }
                _ => return self.poison(recv, "an unknown completion opcode"),
            };
            let (status, ack) = verdict.unwrap_or((WcStatus::Success, WcStatus::Success));
            self.ring.comp_ack(seq).store(ack.code(), Ordering::Relaxed);
            let posted = recv.shadow.pop_front().expect("checked above");
            if let Some(srq) = &self.srq {
                srq.consumed(1);
            }
            let success = status == WcStatus::Success;
            cq.push(Wc {
                wr_id: posted.wr_id,
                status,
                opcode,
                byte_len: if success { c.byte_len } else { 0 },
                imm: if success { c.imm } else { None },
                qp_num: self.qpn,
                invalidated_rkey: if success { c.inv } else { None },
            });
            recv.comp_cons += 1;
            if !success {
                ok = false;
                break;
            }
        }
        // The ACK: every verdict above is written before the index that publishes it.
        self.ring
            .comp_cons()
            .store(recv.comp_cons, Ordering::Release);
        self.inbound
            .consumed
            .store(recv.comp_cons, Ordering::Release);
        if ring_now || !src.tx_bell_shared {
            ring_tx_bell(&self.ring, &src);
        } else {
            self.ack_owed.store(true, Ordering::Release);
        }
        ok
    }

    /// A SEND_WITH_INV's invalidation (`inv`: the rkey, `None` for a plain SEND): the memory
    /// window bound on this QP under that rkey is invalidated, and withdrawn from the peer
    /// before the receive completes ([`super::mw`]). `Some(verdict)` when `inv` names no window
    /// bound on this QP (both sides: `REM_INV_REQ_ERR`, as rxe).
    fn invalidate_for_peer(&self, inv: Option<u32>) -> Option<Verdict> {
        let rkey = inv?;
        match self.dev.lookup_mw(rkey) {
            Some(mw) if mw.invalidate(rkey, Some(self.qpn)).is_ok() => None,
            _ => {
                tracing::debug!(
                    "soft QP {:#x}: SEND_WITH_INV names rkey {rkey:#x}, no window bound here",
                    self.qpn
                );
                Some((WcStatus::RemInvReqErr, WcStatus::RemInvReqErr))
            }
        }
    }

    fn poison(&self, recv: &mut RecvSide, what: &str) -> bool {
        tracing::warn!("soft QP {:#x}: peer wrote {what}", self.qpn);
        recv.poisoned = true;
        false
    }

    /// Copies the SEND `c` describes into `posted`'s buffers. `None`: the descriptor names
    /// memory the peer never lent us, or lies outside it (the QP fails); `Some(Some(v))`: the
    /// message fails with verdict `v` (too long, or a receive buffer we cannot write);
    /// `Some(None)`: delivered.
    fn copy_in(
        &self,
        src: &PeerShared,
        c: &RawComp,
        posted: &Posted,
        mrs: &mut MrCache,
        keep: &mut Keep,
    ) -> Option<Option<Verdict>> {
        let len = u64::from(c.byte_len);
        if len > crate::wr::MAX_MSG_LEN {
            return None;
        }
        let from: *const u8 = match c.src {
            Src::Mr { key, addr } => src.resolve(key, addr, len, Access(0)).ok()?.cast_const(),
            Src::Staged { off } => src.staged(off, len)?,
            Src::Placed if len == 0 => std::ptr::null(),
            Src::Placed => return None,
        };
        if len > posted.total {
            return Some(Some((WcStatus::LocLenErr, WcStatus::RemInvReqErr)));
        }
        let mut left = len;
        let mut dst = super::send::segs();
        for s in posted.sges.as_slice() {
            if left == 0 {
                break;
            }
            let take = left.min(u64::from(s.len));
            match mrs.resolve(&self.dev, s.key, s.addr, take, keep) {
                Some((p, pd, access, _))
                    if pd == self.pd.id && access.contains(Access::LOCAL_WRITE) =>
                {
                    dst.push((p, take as usize));
                }
                _ => return Some(Some((WcStatus::LocProtErr, WcStatus::RemOpErr))),
            }
            left -= take;
        }
        if len > 0 {
            // SAFETY: `from` is `len` bytes inside a mapping of the peer's memory held by
            // `src` (an announced MR, or its staging region), checked above; every `dst`
            // segment lies in one of our own live MRs (held by `mrs` or `keep`) and the
            // segments add up to `len`. The peer may change its bytes meanwhile: we copy
            // whatever they are into private memory, which it cannot reach.
            unsafe {
                match dst.as_slice() {
                    &[(d, n)] => std::ptr::copy(from, d, n),
                    dst => super::send::scatter_gather(&[(from.cast_mut(), len as usize)], dst),
                }
            }
        }
        Some(None)
    }

    /// Our CQ is about to sleep: ACKs still owed to the sender are rung now.
    pub(crate) fn ring_owed_ack(&self) {
        if self.ack_owed.load(Ordering::Acquire) && self.ack_owed.swap(false, Ordering::AcqRel) {
            let src = self.recv_src();
            if let Some(src) = src {
                ring_tx_bell(&self.ring, &src);
            }
        }
    }
}

/// Rings the sender's send-CQ doorbell if it sleeps waiting for our ACK (Dekker with its
/// arm: it sets `tx_armed`, fences, re-reads `comp_cons`; we stored `comp_cons`, fence, read
/// `tx_armed`).
fn ring_tx_bell(ring: &super::ring::Ring, src: &PeerShared) {
    fence(Ordering::SeqCst);
    let armed = ring.tx_armed();
    if armed.load(Ordering::Relaxed) != 0 && armed.swap(0, Ordering::SeqCst) != 0 {
        src.tx_bell.ring();
    }
}
