//! The record of a QP's outstanding WRs, one per work queue.
//!
//! Devices may accept more WRs than `ibv_create_qp(3)` grants (rxe rounds each queue up to a
//! power of two minus one and still reports the requested size), and rxe never completes a
//! receive posted in ERR. So the provider keeps its own books: each WR goes to the device with
//! `wr_id = seq << 1 | queue` and its caller's `wr_id` waits here. A completion for `seq`
//! retires every earlier WR of that queue as well (unsignaled sends complete silently, in order,
//! `ibv_post_send(3)`), and gets the caller's `wr_id` back. That gives:
//! - `QueueFull` at exactly the granted capacity, counted in outstanding WRs;
//! - after the QP is known to be in ERR (`to_err`, or an error completion polled), WRs are not
//!   handed to the device: they are queued here as flushed and complete with WR_FLUSH_ERR right
//!   after every earlier WR of their queue, so order holds;
//! - an unsignaled send WR that succeeded never completes at the device, so a flushed WR
//!   queued behind one would wait for good. The first send WR posted in ERR while the device
//!   still holds WRs of the queue therefore also posts a *drain WR* to the device: signaled,
//!   no SGE (what the kernel's `ib_drain_sq` posts). A QP in ERR flushes it after every
//!   earlier WR, so its completion retires them all; it is the ledger's own and reaches no
//!   caller. It needs no device slot of its own: the caller's WR that asked for it takes a
//!   ledger slot and no device slot, and its completion's CQ entry is the one the drain uses.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crate::{Wc, WcOpcode, WcStatus};

/// Which work queue a device `wr_id` belongs to (its lowest bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wq {
    Send = 0,
    Recv = 1,
}

#[derive(Debug)]
struct Entry {
    wr_id: u64,
    opcode: WcOpcode,
    /// Never given to the device: completes as WR_FLUSH_ERR once it reaches the front.
    flushed: bool,
    /// The ledger's drain WR (see the module): retires what is before it, reaches no caller.
    drain: bool,
}

/// One work queue's outstanding WRs, oldest first; the front has sequence number `base`.
#[derive(Debug)]
pub(crate) struct Queue {
    base: u64,
    entries: VecDeque<Entry>,
    cap: usize,
    /// A drain WR was tried (once per QP, posted or refused: a second one would go behind
    /// flushed entries, and `complete` reports only the entry a completion names).
    drained: bool,
    /// The drain WR is in `entries`: it takes no caller's slot (`full`).
    drain_held: bool,
}

impl Queue {
    fn new(cap: u32) -> Queue {
        Queue {
            base: 0,
            entries: VecDeque::new(),
            cap: cap as usize,
            drained: false,
            drain_held: false,
        }
    }

    /// True when a WR posted now, in ERR, needs a drain WR at the device before it: the device
    /// holds WRs of this queue (possibly unsignaled ones that completed silently) and no drain
    /// was posted yet.
    pub(crate) fn needs_drain(&self) -> bool {
        !self.drained && self.entries.iter().any(|e| !e.flushed)
    }

    /// A drain WR was tried; `posted`: the device accepted it, recorded here.
    pub(crate) fn drain_tried(&mut self, posted: bool) {
        self.drained = true;
        if !posted {
            return;
        }
        self.drain_held = true;
        self.entries.push_back(Entry {
            wr_id: 0,
            opcode: WcOpcode::Send,
            flushed: false,
            drain: true,
        });
    }

    /// True when another WR would exceed the granted capacity.
    pub(crate) fn full(&self) -> bool {
        self.entries.len() - usize::from(self.drain_held) >= self.cap
    }

    /// The device `wr_id` the next WR of queue `wq` gets.
    pub(crate) fn next_device_wr_id(&self, wq: Wq) -> u64 {
        ((self.base + self.entries.len() as u64) << 1) | wq as u64
    }

    /// Records a WR just accepted by the device (or, with `flushed`, kept from it).
    pub(crate) fn push(&mut self, wr_id: u64, opcode: WcOpcode, flushed: bool) {
        self.entries.push_back(Entry {
            wr_id,
            opcode,
            flushed,
            drain: false,
        });
    }

    /// Moves flushed WRs at the front into `out` as WR_FLUSH_ERR completions.
    fn emit_flushed(&mut self, qp_num: u32, out: &mut VecDeque<Wc>) -> usize {
        let mut n = 0;
        while self.entries.front().is_some_and(|e| e.flushed) {
            let e = self.entries.pop_front().expect("front checked");
            self.base += 1;
            out.push_back(Wc {
                wr_id: e.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: e.opcode,
                byte_len: 0,
                imm: None,
                qp_num,
                invalidated_rkey: None,
            });
            n += 1;
        }
        n
    }
}

/// Bit 63 of a device `wr_id`: a WR of an SRQ (the rest is its [`SrqLedger`] number).
pub(crate) const SRQ_TAG: u64 = 1 << 63;

/// The outstanding WRs of an SRQ: any attached QP may consume any of them, in any order
/// across QPs, so they are kept by number, not in a queue.
#[derive(Debug)]
pub(crate) struct SrqLedger {
    inner: Mutex<SrqBook>,
    cap: usize,
}

#[derive(Debug, Default)]
struct SrqBook {
    next: u64,
    /// Device number → the caller's wr_id.
    out: HashMap<u64, u64>,
}

impl SrqLedger {
    pub(crate) fn new(cap: u32) -> SrqLedger {
        SrqLedger {
            inner: Mutex::new(SrqBook::default()),
            cap: cap as usize,
        }
    }

    /// Reserves a device wr_id for `wr_id` and calls `post` with it; the reservation is kept
    /// only if `post` succeeds. `None` when the SRQ holds its granted capacity.
    pub(crate) fn post<E>(
        &self,
        wr_id: u64,
        post: impl FnOnce(u64) -> std::result::Result<(), E>,
    ) -> Option<std::result::Result<(), E>> {
        let mut b = self.inner.lock();
        if b.out.len() >= self.cap {
            return None;
        }
        let n = b.next & !SRQ_TAG;
        let r = post(n | SRQ_TAG);
        if r.is_ok() {
            b.next = b.next.wrapping_add(1);
            b.out.insert(n, wr_id);
        }
        Some(r)
    }

    /// The caller's wr_id of device wr_id `dev` (which is retired); `None` if unknown.
    fn complete(&self, dev: u64) -> Option<u64> {
        self.inner.lock().out.remove(&(dev & !SRQ_TAG))
    }
}

/// Both work queues of one QP.
#[derive(Debug)]
pub(crate) struct Ledger {
    qp_num: u32,
    send: Mutex<Queue>,
    recv: Mutex<Queue>,
    in_err: AtomicBool,
    /// The SRQ the QP's receives come from.
    srq: Option<Arc<SrqLedger>>,
}

impl Ledger {
    pub(crate) fn new(
        qp_num: u32,
        send_cap: u32,
        recv_cap: u32,
        srq: Option<Arc<SrqLedger>>,
    ) -> Ledger {
        Ledger {
            qp_num,
            send: Mutex::new(Queue::new(send_cap)),
            recv: Mutex::new(Queue::new(recv_cap)),
            in_err: AtomicBool::new(false),
            srq,
        }
    }

    pub(crate) fn queue(&self, wq: Wq) -> MutexGuard<'_, Queue> {
        match wq {
            Wq::Send => self.send.lock(),
            Wq::Recv => self.recv.lock(),
        }
    }

    /// The QP is in ERR as far as this process knows.
    pub(crate) fn in_err(&self) -> bool {
        self.in_err.load(Ordering::SeqCst)
    }

    pub(crate) fn set_err(&self) {
        self.in_err.store(true, Ordering::SeqCst);
    }

    /// Runs `to_err` (the device's move to ERR) with both queues locked, and marks the QP in
    /// ERR if it succeeds: no WR is posted between the two, so none reaches the device on the
    /// assumption that the QP is in ERR while it is not (a drain WR would then be sent), and
    /// none the device would take in ERR without flushing it (rxe never flushes a receive
    /// posted in ERR). If the device refuses the move, the ledger is not marked: the QP's
    /// state is then unknown, and a drain WR must never reach a live QP (it would deliver an
    /// empty message); WRs go on to the device as before.
    pub(crate) fn enter_err<E>(
        &self,
        to_err: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let _send = self.send.lock();
        let _recv = self.recv.lock();
        to_err()?;
        self.set_err();
        Ok(())
    }

    /// Turns a device completion into the caller's, retiring every earlier WR of its queue,
    /// and appends it (and flushed WRs now at the front) to `out`. A completion that names no
    /// outstanding WR is dropped (and logged).
    pub(crate) fn complete(&self, mut wc: Wc, out: &mut VecDeque<Wc>) {
        if wc.status != WcStatus::Success {
            self.set_err();
        }
        if wc.wr_id & SRQ_TAG != 0 {
            match self.srq.as_ref().and_then(|s| s.complete(wc.wr_id)) {
                Some(user) => {
                    wc.wr_id = user;
                    out.push_back(wc);
                }
                None => tracing::warn!(
                    "QP {:#x}: completion for unknown SRQ WR {:#x}: dropped",
                    self.qp_num,
                    wc.wr_id
                ),
            }
            return;
        }
        let wq = if wc.wr_id & 1 == 0 {
            Wq::Send
        } else {
            Wq::Recv
        };
        let seq = wc.wr_id >> 1;
        let mut q = self.queue(wq);
        let Some(pos) = seq
            .checked_sub(q.base)
            .filter(|&p| p < q.entries.len() as u64)
        else {
            tracing::warn!(
                "QP {:#x}: completion for {wq:?} WR {seq}, outstanding from {}: dropped",
                self.qp_num,
                q.base
            );
            return;
        };
        let mut done = None;
        for _ in 0..=pos {
            done = q.entries.pop_front();
            q.base += 1;
            if done.as_ref().is_some_and(|e| e.drain) {
                q.drain_held = false;
            }
        }
        let e = done.expect("pos < len");
        if !e.drain {
            wc.wr_id = e.wr_id;
            out.push_back(wc);
        }
        q.emit_flushed(self.qp_num, out);
    }

    /// Moves flushed WRs at the front of `wq` into `out`; returns how many.
    pub(crate) fn emit_flushed(&self, wq: Wq, out: &mut VecDeque<Wc>) -> usize {
        self.queue(wq).emit_flushed(self.qp_num, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev_wc(device_wr_id: u64, status: WcStatus) -> Wc {
        Wc {
            wr_id: device_wr_id,
            status,
            qp_num: 9,
            ..Wc::default()
        }
    }

    #[test]
    fn a_completion_retires_every_earlier_wr_and_returns_the_callers_id() {
        let l = Ledger::new(9, 3, 3, None);
        let mut ids = Vec::new();
        for user in [100, 101, 102] {
            let mut q = l.queue(Wq::Send);
            assert!(!q.full());
            ids.push(q.next_device_wr_id(Wq::Send));
            q.push(user, WcOpcode::Send, false);
        }
        assert!(l.queue(Wq::Send).full());
        let mut out = VecDeque::new();
        l.complete(dev_wc(ids[1], WcStatus::Success), &mut out);
        assert_eq!(out.pop_front().unwrap().wr_id, 101);
        assert!(!l.queue(Wq::Send).full(), "two slots free again");
        l.complete(dev_wc(ids[1], WcStatus::Success), &mut out);
        assert!(out.is_empty(), "a stale completion is dropped");
    }

    #[test]
    fn flushed_wrs_complete_after_the_earlier_ones_in_order() {
        let l = Ledger::new(9, 8, 8, None);
        let first = l.queue(Wq::Recv).next_device_wr_id(Wq::Recv);
        l.queue(Wq::Recv).push(1, WcOpcode::Recv, false);
        l.set_err();
        l.queue(Wq::Recv).push(2, WcOpcode::Recv, true);
        let mut out = VecDeque::new();
        assert_eq!(
            l.emit_flushed(Wq::Recv, &mut out),
            0,
            "WR 1 is still outstanding"
        );
        l.complete(dev_wc(first, WcStatus::WrFlushErr), &mut out);
        let got: Vec<_> = out.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(got, [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]);
    }

    #[test]
    fn a_drain_completion_retires_silent_sends_and_releases_the_flushed_wr_behind_them() {
        let l = Ledger::new(9, 4, 4, None);
        let mut q = l.queue(Wq::Send);
        q.push(1, WcOpcode::Send, false);
        q.push(2, WcOpcode::Send, false);
        drop(q);
        l.set_err();
        let mut q = l.queue(Wq::Send);
        assert!(q.needs_drain(), "the device holds WRs 1 and 2");
        let drain = q.next_device_wr_id(Wq::Send);
        q.drain_tried(true);
        q.push(3, WcOpcode::Send, true);
        assert!(!q.needs_drain(), "one drain per QP");
        q.push(4, WcOpcode::Send, true);
        assert!(
            q.full(),
            "4 WRs of the caller: the drain takes no slot of theirs"
        );
        drop(q);
        let mut out = VecDeque::new();
        assert_eq!(
            l.emit_flushed(Wq::Send, &mut out),
            0,
            "WR 3 waits for the drain"
        );
        l.complete(dev_wc(drain, WcStatus::WrFlushErr), &mut out);
        let got: Vec<_> = out.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(
            got,
            [(3, WcStatus::WrFlushErr), (4, WcStatus::WrFlushErr)],
            "the drain reaches no caller"
        );
        assert!(l.queue(Wq::Send).entries.is_empty());
    }

    #[test]
    fn a_refused_drain_is_not_tried_again_behind_a_flushed_wr() {
        let l = Ledger::new(9, 4, 4, None);
        l.queue(Wq::Send).push(1, WcOpcode::Send, false);
        l.set_err();
        let mut q = l.queue(Wq::Send);
        assert!(q.needs_drain());
        q.drain_tried(false);
        q.push(2, WcOpcode::Send, true);
        assert!(
            !q.needs_drain(),
            "a drain behind flushed WR 2 would retire it unreported"
        );
    }

    #[test]
    fn a_queue_whose_wrs_all_completed_needs_no_drain() {
        let l = Ledger::new(9, 4, 4, None);
        let id = l.queue(Wq::Send).next_device_wr_id(Wq::Send);
        l.queue(Wq::Send).push(1, WcOpcode::Send, false);
        l.complete(dev_wc(id, WcStatus::Success), &mut VecDeque::new());
        l.set_err();
        assert!(!l.queue(Wq::Send).needs_drain());
    }

    #[test]
    fn srq_completions_from_any_qp_return_the_callers_id_in_any_order() {
        let srq = Arc::new(SrqLedger::new(2));
        let a = Ledger::new(1, 1, 0, Some(srq.clone()));
        let b = Ledger::new(2, 1, 0, Some(srq.clone()));
        let mut ids = Vec::new();
        for user in [70, 71] {
            srq.post(user, |d| {
                ids.push(d);
                Ok::<(), ()>(())
            })
            .unwrap()
            .unwrap();
        }
        assert!(srq.post(72, |_| Ok::<(), ()>(())).is_none(), "full at cap");
        assert!(srq.post(73, |_| Err(())).is_none());
        let mut out = VecDeque::new();
        b.complete(dev_wc(ids[1], WcStatus::Success), &mut out);
        a.complete(dev_wc(ids[0], WcStatus::Success), &mut out);
        assert_eq!(out.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [71, 70]);
        let failed = srq.post(74, |_| Err(())).unwrap();
        assert!(failed.is_err());
        assert!(srq.post(75, |_| Ok::<(), ()>(())).unwrap().is_ok());
    }

    #[test]
    fn an_error_completion_marks_the_qp_in_err() {
        let l = Ledger::new(9, 2, 2, None);
        let id = l.queue(Wq::Send).next_device_wr_id(Wq::Send);
        l.queue(Wq::Send).push(5, WcOpcode::Send, false);
        assert!(!l.in_err());
        l.complete(dev_wc(id, WcStatus::RemAccessErr), &mut VecDeque::new());
        assert!(l.in_err());
    }
}
