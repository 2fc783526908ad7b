//! The sender's wait for ACKs (issue 22, item 2): a SEND (and a WRITE_WITH_IMM) completes only
//! once the peer's receiver copied it and advanced `comp_cons` ([`super::deliver`]); executed
//! WRs complete in order; the ACK timer nudges a peer whose application does not poll and gives
//! up on one that makes no progress (RETRY_EXC_ERR at the retry timeout).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::qp::SoftQp;
use super::send::{Blame, Keep, Outcome, SendSide};
use super::timing::give_up_after;
use crate::{Wc, WcOpcode, WcStatus};

/// How long a SEND waits for its ACK before the peer's device is asked to deliver it even if
/// nobody polls there (`Nudge`), and the period of that check.
const NUDGE: Duration = Duration::from_millis(1);

/// A WR executed and not yet completed: it waits for the peer's ACK (`seq`), or for the WRs
/// before it.
#[derive(Debug)]
pub(crate) struct Flight {
    wr_id: u64,
    opcode: WcOpcode,
    signaled: bool,
    len: u32,
    /// The completion slot in the peer's ring whose ACK completes it (`None`: nothing to wait
    /// for but the WRs before it).
    seq: Option<u64>,
    /// Staging space it holds until then.
    stage_end: Option<u64>,
}

impl Flight {
    /// Its wr_id and completion opcode.
    pub(crate) fn id(&self) -> (u64, WcOpcode) {
        (self.wr_id, self.opcode)
    }
}

impl SoftQp {
    /// A WR executed (`Done` or `Posted`): it completes now if nothing before it waits and it
    /// needs no ACK; else it waits in order.
    pub(crate) fn executed(
        &self,
        send: &mut SendSide,
        wr_id: u64,
        opcode: WcOpcode,
        signaled: bool,
        outcome: Outcome,
    ) {
        let (len, seq, stage_end) = match outcome {
            Outcome::Done(len) => (len, None, None),
            Outcome::Posted {
                len,
                seq,
                stage_end,
            } => (len, Some(seq), stage_end),
            _ => unreachable!("only executed WRs"),
        };
        if seq.is_none() && send.inflight.is_empty() {
            if signaled {
                self.send_cq.push(Wc {
                    byte_len: len as u32,
                    ..self.wc(wr_id, WcStatus::Success, opcode)
                });
            }
            return;
        }
        send.inflight.push_back(Flight {
            wr_id,
            opcode,
            signaled,
            len: len as u32,
            seq,
            stage_end,
        });
        if send.inflight.len() == 1 {
            self.set_tx_wait(send);
        }
        if send.tx_timer.is_none() {
            let at = Instant::now() + NUDGE;
            send.tx_timer = Some(at);
            self.dev.schedule(at, self.me.clone());
        }
    }

    /// Publishes the ACK our oldest executed WR waits for (for the send CQ's lock-free check).
    pub(crate) fn set_tx_wait(&self, send: &SendSide) {
        let w = send
            .inflight
            .front()
            .map_or(u64::MAX, |f| f.seq.map_or(0, |s| s + 1));
        self.outbound.wait.store(w, Ordering::Release);
    }

    /// The send CQ's poll: completes the WRs the peer acknowledged, then lets queued WRs
    /// that waited for room go.
    pub(crate) fn reap(&self) {
        let mut keep = Keep::default();
        {
            let mut send = self.send.lock();
            if self.reap_locked(&mut send) && (!send.pending.is_empty() || send.deferred.is_some())
            {
                self.run_pending(&mut send, &mut keep);
            }
        }
        drop(keep);
    }

    /// Completes executed WRs, in order, up to the first whose ACK has not come. True when
    /// any completed (or the QP failed).
    pub(crate) fn reap_locked(&self, send: &mut SendSide) -> bool {
        if send.inflight.is_empty() {
            return false;
        }
        let SendSide {
            inflight,
            stage,
            peer,
            ..
        } = send;
        let Some(peer) = peer.as_mut() else {
            return false;
        };
        let cons = peer.ring.comp_cons().load(Ordering::Acquire);
        if cons > peer.comp_prod || cons < peer.acked {
            tracing::warn!(
                "soft QP {:#x}: peer's completion consumer index is impossible",
                self.qpn
            );
            self.fail_locked(send, Some(WcStatus::RemOpErr), Blame::Oldest);
            return true;
        }
        let mut failed = false;
        let mut n = 0;
        self.send_cq.with(|cq| {
            while let Some(f) = inflight.front() {
                let st = match f.seq {
                    Some(s) if s < cons => {
                        peer.acked = s + 1;
                        ack_status(peer.ring.comp_ack(s).load(Ordering::Relaxed))
                    }
                    Some(_) => break,
                    None => WcStatus::Success,
                };
                let f = inflight.pop_front().expect("front exists");
                n += 1;
                if let Some(end) = f.stage_end {
                    stage.release(end);
                }
                if st != WcStatus::Success {
                    cq.push(self.wc(f.wr_id, st, f.opcode));
                    failed = true;
                    break;
                }
                if f.signaled {
                    cq.push(Wc {
                        byte_len: f.len,
                        ..self.wc(f.wr_id, WcStatus::Success, f.opcode)
                    });
                }
            }
        });
        if failed {
            self.fail_locked(send, None, Blame::Oldest);
        } else {
            self.set_tx_wait(send);
        }
        n > 0
    }

    /// The ACK timer: while a SEND waits for its ACK, nudges the peer's device every
    /// [`NUDGE`] (its receiver may not be polling) and fails the QP with RETRY_EXC_ERR once
    /// the peer made no progress for the retry timeout (`timeout × (retry_cnt + 1)`). False
    /// when the QP failed.
    pub(crate) fn check_acks(&self, send: &mut SendSide) -> bool {
        let Some(head) = send.inflight.front().and_then(|f| f.seq) else {
            send.tx_timer = None;
            send.tx_since = None;
            return true;
        };
        let now = Instant::now();
        // The oldest SEND waited a whole period: nudge once (the peer's progress then ACKs
        // every message it holds).
        let (since, nudge) = match &mut send.tx_since {
            Some((s, t, nudged)) if *s == head => (*t, !std::mem::replace(nudged, true)),
            _ => {
                send.tx_since = Some((head, now, false));
                (now, false)
            }
        };
        let mut next = now + NUDGE;
        if let Some(limit) = give_up_after(send.attr.timeout, send.attr.retry_cnt) {
            if now >= since + limit {
                self.fail_locked(send, Some(WcStatus::RetryExcErr), Blame::Oldest);
                return false;
            }
            next = next.min(since + limit);
        }
        if nudge && let Some(p) = &send.peer {
            p.shared.nudge();
        }
        send.tx_timer = Some(next);
        self.dev.schedule(next, self.me.clone());
        true
    }

    /// The first queued WR fails with `st`: at once if no executed WR before it waits for an
    /// ACK, else once they completed (they were delivered; a NIC completes them first). The
    /// peer is nudged meanwhile, and the ACK timer bounds the wait.
    pub(crate) fn fail_queued(&self, send: &mut SendSide, st: WcStatus) {
        if send.inflight.is_empty() {
            self.fail_locked(send, Some(st), Blame::Queued);
            return;
        }
        send.deferred = Some(st);
        if let Some(p) = &send.peer {
            p.shared.nudge();
        }
    }
}

/// The sender's status from a slot's `ack` word (anything unknown: the peer broke protocol).
fn ack_status(code: u32) -> WcStatus {
    [
        WcStatus::Success,
        WcStatus::RemInvReqErr,
        WcStatus::RemOpErr,
        WcStatus::RemAccessErr,
    ]
    .into_iter()
    .find(|s| s.code() == code)
    .unwrap_or(WcStatus::RemOpErr)
}
