//! RC QPs of the soft device: state machine, connection set-up, receive side and flushes.
//! The send side (copy engine, RNR and retry) is in `send.rs`.

use std::collections::{HashSet, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;
use rand::Rng;

use super::bell::{Bell, BellIn};
use super::cq::{CqState, Inbound, Outbound, SoftCq};
use super::deliver::{RecvSges, RecvSide};
use super::device::{CONTROL_TIMEOUT, SoftDevice, Watch};
use super::limits;
use super::pd::{Conn, SoftMr, SoftPd};
use super::peer::Peer;
use super::ring::{ERR_BIT, Layout, Ring};
use super::send::{Blame, Keep, SendSide};
use super::shm::Mapping;
use super::sock::{MAX_MSG, MAX_NAME, Recv, Sock};
use super::srq::SoftSrq;
use super::wire::{
    CONNECT_BELL_BACK, CONNECT_REFILL, CONNECT_SEND_BELL, CONNECT_STAGING, ConnectMsg, Msg,
};
use crate::provider::{CqImpl, PROVIDER_IBVERBS, PROVIDER_SOFT, QpImpl};
use crate::{
    AsyncEvent, ConnectAttr, Endpoint, Error, QpCap, QpState, RecvWr, Result, SendWr, Wc, WcOpcode,
    WcStatus,
};

fn state_code(s: QpState) -> u8 {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Sqd => 4,
        QpState::Err => 5,
    }
}

fn code_state(c: u8) -> QpState {
    match c {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        _ => QpState::Err,
    }
}

/// A posted receive, as only this process knows it (never read back from shared memory).
#[derive(Debug)]
pub(crate) struct Posted {
    pub(crate) wr_id: u64,
    /// Bytes the SGEs hold.
    pub(crate) total: u64,
    /// The SGEs: where delivery copies to (and what an SRQ lends to a ring again).
    pub(crate) sges: RecvSges,
}

/// An RC QP.
#[derive(Debug)]
pub(crate) struct SoftQp {
    pub(crate) me: Weak<SoftQp>,
    pub(crate) dev: Arc<SoftDevice>,
    pub(crate) pd: Arc<SoftPd>,
    pub(crate) qpn: u32,
    psn: u32,
    pub(crate) cap: QpCap,
    pub(crate) send_cq: Arc<SoftCq>,
    recv_cq: Arc<SoftCq>,
    state: AtomicU8,
    /// Own ring region (receive WQEs out, completions in).
    pub(crate) ring: Ring,
    /// The inbound completion ring as the recv CQ watches it.
    pub(crate) inbound: Arc<Inbound>,
    pub(crate) recv: Mutex<RecvSide>,
    /// We acknowledged SENDs (advanced `comp_cons`) without ringing the sender's doorbell,
    /// which is also the one our next SEND rings ([`super::deliver`]).
    pub(crate) ack_owed: AtomicBool,
    /// What our send CQ reads without a lock: the ACK our oldest executed WR waits for.
    pub(crate) outbound: Arc<Outbound>,
    pub(crate) send: Mutex<SendSide>,
    pub(crate) peer_dead: AtomicBool,
    out: Mutex<Option<Arc<Conn>>>,
    connecting: Mutex<()>,
    /// The receiving ends of the doorbells this QP gave its peer (recv CQ, send CQ, refill),
    /// in their sets while the QP lives ([`super::bell`]).
    bells: Mutex<Vec<BellIn>>,
    /// Our recv CQ's doorbell pair as offered to the peer on the channel we dialed: a peer
    /// connecting back over that channel may ring us on it and take our end as its own
    /// doorbell (`CONNECT_BELL_BACK`, [`super::bell`]).
    ring_back: Mutex<Option<(Arc<Sock>, Bell)>>,
    /// Woken when the peer answers a Connect sent over its own channel (see `connect`).
    connect_answered: parking_lot::Condvar,
    /// The SRQ receives come from, if any.
    pub(crate) srq: Option<Arc<SoftSrq>>,
    /// SQ_DRAINED was raised for the current stay in SQD.
    sqd_notified: AtomicBool,
    /// Set by a fatal error no completion reports ([`super::fatal`]).
    pub(crate) frozen: Mutex<Option<super::fatal::Frozen>>,
}

fn check_cap(what: &str, v: u32, max: u32) -> Result<()> {
    if v > max {
        return Err(Error::InvalidArgument(format!(
            "{what} {v} exceeds the device limit {max}"
        )));
    }
    Ok(())
}

impl SoftQp {
    pub(crate) fn create(
        pd: Arc<SoftPd>,
        send_cq: &Arc<dyn CqImpl>,
        recv_cq: &Arc<dyn CqImpl>,
        srq: Option<Arc<SoftSrq>>,
        cap: QpCap,
    ) -> Result<Arc<SoftQp>> {
        let (Some(send_cq), Some(recv_cq)) = (SoftCq::from_dyn(send_cq), SoftCq::from_dyn(recv_cq))
        else {
            return Err(Error::InvalidArgument("CQ of another device".into()));
        };
        check_cap("max_send_wr", cap.max_send_wr, limits::MAX_QP_WR)?;
        check_cap("max_send_sge", cap.max_send_sge, limits::MAX_SGE)?;
        check_cap("max_inline_data", cap.max_inline_data, limits::MAX_INLINE)?;
        if srq.is_none() {
            check_cap("max_recv_wr", cap.max_recv_wr, limits::MAX_QP_WR)?;
            check_cap("max_recv_sge", cap.max_recv_sge, limits::MAX_SGE)?;
        }
        // With an SRQ the receive queue is the SRQ's (`ibv_create_qp(3)`: max_recv_* ignored);
        // the ring only holds the WQEs the SRQ lends.
        let (cap, layout) = match &srq {
            None => {
                let cap = QpCap {
                    max_send_wr: cap.max_send_wr.max(1),
                    max_recv_wr: cap.max_recv_wr.max(1),
                    max_send_sge: cap.max_send_sge.max(1),
                    max_recv_sge: cap.max_recv_sge.max(1),
                    max_inline_data: cap.max_inline_data,
                };
                let layout = Layout {
                    cap: cap.max_recv_wr,
                    max_sge: cap.max_recv_sge,
                };
                (cap, layout)
            }
            Some(srq) => {
                if !Arc::ptr_eq(&srq.pd, &pd) {
                    return Err(Error::InvalidArgument(
                        "the soft device needs the SRQ and the QP in one PD".into(),
                    ));
                }
                let cap = QpCap {
                    max_send_wr: cap.max_send_wr.max(1),
                    max_recv_wr: 0,
                    max_send_sge: cap.max_send_sge.max(1),
                    max_recv_sge: 0,
                    max_inline_data: cap.max_inline_data,
                };
                let layout = Layout {
                    cap: srq.ring_cap,
                    max_sge: srq.max_sge,
                };
                (cap, layout)
            }
        };
        let map = Mapping::create(layout.bytes(), c"bx-soft-ring")?;
        let ring = Ring::new(Arc::new(map), layout)
            .ok_or_else(|| Error::InvalidArgument("ring layout".into()))?;
        if srq.is_some() {
            ring.low_water()
                .store(super::srq::low_water(layout.cap), Ordering::Release);
        }
        let dev = pd.dev.clone();
        let qpn = dev.alloc_qpn();
        let psn = rand::rng().random::<u32>() & 0xff_ffff;
        let send = SendSide::new()?;
        let qp = Arc::new_cyclic(|me| SoftQp {
            me: me.clone(),
            dev: dev.clone(),
            pd,
            qpn,
            psn,
            cap,
            send_cq,
            recv_cq: recv_cq.clone(),
            state: AtomicU8::new(state_code(QpState::Reset)),
            inbound: Arc::new(Inbound::new(me.clone(), ring.clone(), srq.is_some())),
            ring,
            recv: Mutex::new(RecvSide::default()),
            ack_owed: AtomicBool::new(false),
            outbound: Arc::new(Outbound::new(me.clone())),
            send: Mutex::new(send),
            peer_dead: AtomicBool::new(false),
            out: Mutex::new(None),
            connecting: Mutex::new(()),
            bells: Mutex::new(Vec::new()),
            ring_back: Mutex::new(None),
            connect_answered: parking_lot::Condvar::new(),
            srq: srq.clone(),
            sqd_notified: AtomicBool::new(false),
            frozen: Mutex::new(None),
        });
        dev.qps.lock().insert(qpn, Arc::downgrade(&qp));
        recv_cq.attach(qp.inbound.clone());
        qp.send_cq.attach_sender(qp.outbound.clone());
        if let Some(srq) = &srq {
            srq.attach(Arc::downgrade(&qp));
        }
        Ok(qp)
    }

    /// Sets the state; returns the previous one.
    pub(crate) fn set_state(&self, s: QpState) -> QpState {
        if s == QpState::Err {
            self.inbound.live.store(false, Ordering::Release);
        }
        code_state(self.state.swap(state_code(s), Ordering::SeqCst))
    }

    /// SRQ: takes WQEs from the front of `queue` into this QP's ring, up to its capacity, if
    /// the ring is at or below its low-water mark and the QP can receive. Returns how many.
    /// Called with the SRQ's lock held (lock order: SRQ, then the QP's receive side).
    pub(crate) fn lend(&self, queue: &mut VecDeque<Posted>) -> usize {
        if queue.is_empty() || !self.lendable() {
            return 0;
        }
        let mut recv = self.recv.lock();
        let cap = self.ring.layout().cap as usize;
        if recv.closed
            || recv.poisoned
            || recv.shadow.len() as u64 > super::srq::low_water(self.ring.layout().cap)
            || !self.lendable()
        {
            return 0;
        }
        let mut n = 0;
        while recv.shadow.len() < cap {
            let Some(p) = queue.pop_front() else { break };
            self.ring.write_wqe(recv.prod, p.sges.as_slice());
            recv.prod += 1;
            recv.shadow.push_back(p);
            n += 1;
        }
        if n > 0 {
            self.ring.recv_prod().store(recv.prod, Ordering::Release);
        }
        n
    }

    /// SRQ: asks the SRQ to top up this QP's ring (after completions freed slots).
    pub(crate) fn refill_from_srq(&self) {
        if let Some(srq) = &self.srq {
            srq.refill_one(self);
        }
    }

    /// In SQD with no send WR left: raises SQ_DRAINED once per stay in SQD.
    pub(crate) fn note_drained(&self, send: &SendSide) {
        if self.state() == QpState::Sqd
            && send.pending.is_empty()
            && !self.sqd_notified.swap(true, Ordering::SeqCst)
        {
            self.dev
                .events
                .raise(AsyncEvent::SqDrained { qp_num: self.qpn });
        }
    }

    pub(crate) fn wc(&self, wr_id: u64, status: WcStatus, opcode: WcOpcode) -> Wc {
        Wc {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm: None,
            qp_num: self.qpn,
            invalidated_rkey: None,
        }
    }

    /// The connection this QP announces on (its memory windows: [`super::mw`]), once
    /// connected.
    pub(crate) fn conn(&self) -> Option<Arc<Conn>> {
        self.out.lock().clone()
    }

    // ---- called by the device ----

    /// Listener: the peer's `connect` arrived with its ring and doorbell.
    ///
    /// Before our own `connect` names the remote QP (`send.remote`), a peer that attaches is
    /// only pending: any process that passed a probe could have guessed our QP number. Its
    /// ring carries none of our ACK reads or deliveries until `connect` adopts it (it names
    /// that peer); a pending peer of another name is evicted there, and one whose channel
    /// ends is forgotten ([`SoftQp::on_chan_ended`]), costing our QP nothing.
    pub(crate) fn attach_peer(&self, peer: Peer) -> std::result::Result<(), String> {
        if self.state() == QpState::Err {
            return Err("QP is in ERR".into());
        }
        let mut send = self.send.lock();
        if let Some((qpn, name)) = &send.remote
            && (*qpn != peer.qpn || *name != peer.name)
        {
            return Err("QP is connected to another peer".into());
        }
        if send.peer.is_some() {
            return Err("QP already has a peer".into());
        }
        send.peer = Some(peer);
        if send.remote.is_some() {
            self.adopt_peer(&send);
        }
        drop(send);
        // Sends waiting for the peer may go now.
        self.dev.schedule(Instant::now(), self.me.clone());
        Ok(())
    }

    /// The attached peer is the one our `connect` named: its ring is where our send CQ reads
    /// ACKs and its shared parts are what our deliveries copy from. Called with the send lock.
    fn adopt_peer(&self, send: &SendSide) {
        if let Some(p) = &send.peer {
            let _ = self.outbound.ring.set(p.ring.clone());
            self.recv.lock().src = Some(p.shared.clone());
        }
    }

    /// Progress thread: the control channel `sock` ended (EOF) or is no peer's of ours
    /// (`inbound`: one a peer dialed to us). A channel of a peer that is not ours any more
    /// (evicted by `connect`) costs nothing; a pending peer's (attached before our `connect`)
    /// is forgotten; our peer's is its death ([`SoftQp::on_peer_gone`]).
    pub(crate) fn on_chan_ended(&self, sock: &Arc<Sock>, inbound: bool) {
        let mut send = self.send.lock();
        let on_it = send
            .peer
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(p.chan(), sock));
        if inbound && !on_it {
            return;
        }
        if on_it && send.remote.is_none() {
            send.peer = None;
            return;
        }
        drop(send);
        self.on_peer_gone();
    }

    /// Device: the doorbell a peer connecting back over `sock` rings us on when its `Connect`
    /// says `CONNECT_BELL_BACK`: our end of the pair our own `Connect` gave it on that same
    /// channel (none on any other channel).
    pub(crate) fn ring_back(&self, sock: &Arc<Sock>) -> Option<Bell> {
        self.ring_back
            .lock()
            .as_ref()
            .filter(|(s, _)| Arc::ptr_eq(s, sock))
            .map(|(_, b)| b.clone())
    }

    /// Whether the peer's announcements arrive on `sock` (its Connect came over it).
    pub(crate) fn has_peer_on(&self, sock: &Arc<Sock>) -> bool {
        self.send
            .lock()
            .peer
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(p.chan(), sock))
    }

    /// Device: sends the peer its ConnectReply on `sock` and marks the channel ready to
    /// carry our own Connect back, in one critical section of the send lock: `connect` reads
    /// the mark under that lock, so it never sees the channel ready before the reply is in it,
    /// and never misses the mark once the peer could have read the reply.
    pub(crate) fn reply_and_mark_chan_ready(&self, sock: &Sock, reply: &[u8]) -> bool {
        let mut send = self.send.lock();
        if sock.send(reply, &[]).is_err() {
            return false;
        }
        if let Some(p) = send.peer.as_mut() {
            p.chan_ready = true;
        }
        true
    }

    /// Progress thread: the inbound control channel is readable. False when it hit EOF.
    pub(crate) fn pump_inbound(&self) -> bool {
        let shared = self.send.lock().peer.as_ref().map(|p| p.shared.clone());
        let Some(shared) = shared else {
            self.connect_answered.notify_all();
            return false;
        };
        let alive = shared.pump();
        // `connect` holds the send lock from reading the answer until it waits: taking that
        // lock once after the pump means a `connect` that read no answer is waiting by now, so
        // the notification below reaches it (none is lost between its check and its wait).
        drop(self.send.lock());
        self.connect_answered.notify_all();
        if shared.take_nudge() {
            // The peer's SEND waits for our ACK and nobody polls: deliver now.
            self.recv_cq.progress();
        }
        alive
    }

    // ---- receive side ----

    /// Moves inbound messages into `cq` (the recv CQ's locked state): see
    /// [`SoftQp::drain_locked`].
    pub(crate) fn drain_into(&self, cq: &mut CqState, keep: &mut Keep, ring_now: bool) -> bool {
        let mut recv = self.recv.lock();
        self.drain_locked(&mut recv, cq, keep, ring_now)
    }

    /// The peer's shared parts, once attached.
    pub(crate) fn recv_src(&self) -> Option<Arc<super::peer::PeerShared>> {
        self.recv.lock().src.clone()
    }

    /// Stops the peer from claiming more receive WQEs, drains the completions it published,
    /// and flushes every other posted receive, in order, at once: it waits for nothing the
    /// peer writes. A WQE the peer claimed (`recv_cons`) without publishing its completion
    /// yet is flushed too; the peer's SEND for it is never acknowledged (its requester times
    /// out, as an IB requester whose responder went to ERR). Since this process copies SENDs
    /// itself ([`super::deliver`]), nothing the peer writes later reaches the flushed buffers.
    /// (Before, this spun up to 100 ms on the peer's `comp_prod` with the QP's send lock held,
    /// on the progress thread too: a peer that claimed and never published stalled it.)
    fn flush_recv(&self) {
        let old = self.ring.recv_cons().fetch_or(ERR_BIT, Ordering::AcqRel);
        let claimed = old & !ERR_BIT;
        let mut keep = Keep::default();
        let back = self.recv_cq.with(|cq| {
            let mut recv = self.recv.lock();
            self.drain_locked(&mut recv, cq, &mut keep, true);
            recv.closed = true;
            let mut back = Vec::new();
            match &self.srq {
                None => {
                    for p in recv.shadow.drain(..) {
                        cq.push(self.wc(p.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv));
                    }
                }
                Some(srq) => {
                    // WQEs the peer claimed belong to this QP and complete on it, flushed;
                    // the others were only lent: they go back to the SRQ (not flushed).
                    let taken = claimed
                        .saturating_sub(recv.comp_cons)
                        .min(recv.shadow.len() as u64) as usize;
                    for p in recv.shadow.drain(..taken) {
                        cq.push(self.wc(p.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv));
                        srq.consumed(1);
                    }
                    back.extend(recv.shadow.drain(..));
                }
            }
            recv.comp_cons = self.ring.comp_prod().load(Ordering::Acquire);
            back
        });
        drop(keep);
        if let Some(srq) = &self.srq {
            srq.give_back(back);
            srq.refill_all();
        }
    }

    /// Moves the QP to ERR: `first` (if any) completes the WR `blame` names with that status,
    /// every other outstanding WR is flushed, in order (executed ones awaiting their ACK,
    /// then queued ones), sends first, then receives.
    pub(crate) fn fail_locked(&self, send: &mut SendSide, first: Option<WcStatus>, blame: Blame) {
        let was = self.set_state(QpState::Err);
        let flights = std::mem::take(&mut send.inflight);
        let jobs = std::mem::take(&mut send.pending);
        send.stage.release_all();
        send.deferred = None;
        self.outbound.wait.store(u64::MAX, Ordering::Release);
        let mut first = first;
        let mut oldest = if blame == Blame::Oldest {
            first.take()
        } else {
            None
        };
        self.send_cq.with(|cq| {
            for (wr_id, opcode) in flights.iter().map(|f| f.id()) {
                let st = oldest.take().unwrap_or(WcStatus::WrFlushErr);
                cq.push(self.wc(wr_id, st, opcode));
            }
            for j in jobs {
                let st = oldest
                    .take()
                    .or_else(|| first.take())
                    .unwrap_or(WcStatus::WrFlushErr);
                cq.push(self.wc(j.wr_id, st, j.opcode()));
            }
        });
        self.flush_recv();
        if was != QpState::Err && self.srq.is_some() {
            self.dev
                .events
                .raise(AsyncEvent::QpLastWqeReached { qp_num: self.qpn });
        }
    }

    /// The recv CQ found an error completion or garbage from the peer. Garbage (the peer broke
    /// the ring protocol) is an error no completion reports: QP_FATAL.
    pub(crate) fn fail_from_cq(&self) {
        let mut send = self.send.lock();
        let fatal = self.recv.lock().poisoned && self.state() != QpState::Err;
        self.fail_locked(&mut send, None, Blame::Oldest);
        if fatal {
            self.dev
                .events
                .raise(AsyncEvent::QpFatal { qp_num: self.qpn });
        }
    }

    /// The peer's process or QP is gone (EOF on a control channel): sends fail with
    /// RETRY_EXC_ERR after timeout × (retry_cnt + 1), then the QP goes to ERR.
    pub(crate) fn on_peer_gone(&self) {
        if self.peer_dead.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut send = self.send.lock();
        let now = Instant::now();
        if let Some(t) = super::timing::give_up_after(send.attr.timeout, send.attr.retry_cnt) {
            send.dead_deadline = Some(now + t);
            self.dev.schedule(now + t, self.me.clone());
        }
        self.dev.schedule(now, self.me.clone());
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        // The peer may claim no more receive WQEs; its sends time out once our channels close.
        let old = self.ring.recv_cons().fetch_or(ERR_BIT, Ordering::AcqRel);
        // Our send CQ waits for nothing of ours any more.
        self.outbound.wait.store(u64::MAX, Ordering::Release);
        if let Some(srq) = &self.srq {
            // Claimed WQEs were consumed (their completions die with the QP); the others go
            // back to the SRQ.
            let recv = self.recv.get_mut();
            let taken = (old & !ERR_BIT)
                .saturating_sub(recv.comp_cons)
                .min(recv.shadow.len() as u64) as usize;
            recv.shadow.drain(..taken);
            srq.consumed(taken as u64);
            srq.give_back(recv.shadow.drain(..).collect());
            self.dev.wake(); // the progress thread lends them to the other QPs
        }
        let mut qps = self.dev.qps.lock();
        if qps.get(&self.qpn).is_some_and(|w| w.strong_count() == 0) {
            qps.remove(&self.qpn);
        }
        drop(qps);
        self.recv_cq.qp_dropped();
        let connected = self.out.get_mut().take().is_some();
        self.pd.qp_dropped(connected);
        self.dev.wake();
    }
}

impl QpImpl for SoftQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn state(&self) -> QpState {
        code_state(self.state.load(Ordering::SeqCst))
    }

    fn cap(&self) -> QpCap {
        self.cap
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint {
            provider: PROVIDER_SOFT,
            qpn: self.qpn,
            psn: self.psn,
            lid: 0,
            gid: [0; 16],
            mtu: limits::MTU,
            addr: self.dev.sock_name.clone(),
        }
    }

    fn connect(&self, remote: &Endpoint, attr: &ConnectAttr) -> Result<()> {
        if remote.provider == PROVIDER_IBVERBS {
            return Err(Error::InvalidArgument(
                "endpoint of an rdma-core device".into(),
            ));
        }
        if remote.provider != PROVIDER_SOFT {
            return Err(Error::InvalidArgument(
                "endpoint of an unknown provider".into(),
            ));
        }
        if remote.addr.is_empty() || remote.addr.len() > MAX_NAME {
            return Err(Error::InvalidArgument("endpoint address length".into()));
        }
        if attr.min_rnr_timer > 31
            || attr.timeout > 31
            || attr.retry_cnt > 7
            || attr.rnr_retry > 7
            || !(256..=4096).contains(&attr.mtu)
        {
            return Err(Error::InvalidArgument(format!(
                "connect attributes out of range: {attr:?}"
            )));
        }
        let _one = self.connecting.lock();
        if self.state() != QpState::Reset {
            return Err(Error::InvalidState(format!(
                "connect in {:?}, needs RESET",
                self.state()
            )));
        }
        let peer_err = |what: &str, e: &dyn std::fmt::Display| {
            Error::Peer(format!(
                "{what} {} (QP {:#x}): {e}",
                String::from_utf8_lossy(&remote.addr),
                remote.qpn
            ))
        };
        // From here on only `remote` may attach (`attach_peer` checks it). A peer of another
        // name that attached while we were in RESET (it guessed our QP number) is evicted: its
        // channel is shut down, which costs that peer only (`on_chan_ended`).
        let evicted = {
            let mut send = self.send.lock();
            send.remote = Some((remote.qpn, remote.addr.clone()));
            send.peer
                .take_if(|p| p.qpn != remote.qpn || p.name != remote.addr)
        };
        if let Some(p) = evicted {
            tracing::debug!(
                "soft: QP {:#x} evicts peer QP {:#x} that attached before connect named another",
                self.qpn,
                p.qpn
            );
            p.chan().shutdown();
        }
        // When the peer's QP connected to us first, its control channel (a seqpacket socket,
        // both ways) carries our Connect and our announcements too: one socket per QP pair
        // instead of two (an fd saved on each side). Its device takes the Connect from the
        // socket it watches (`Watch::Outbound`); no reply comes back, and a refusal closes
        // the channel, which fails this QP as a dead peer would.
        let shared = {
            let send = self.send.lock();
            send.peer
                .as_ref()
                .filter(|p| p.chan_ready && p.qpn == remote.qpn && p.name == remote.addr)
                .map(|p| p.chan().clone())
        };
        let reused = shared.is_some();
        let sock = match shared {
            Some(s) => s,
            None => {
                let s = Sock::connect(&remote.addr, CONTROL_TIMEOUT)
                    .map_err(|e| peer_err("cannot reach soft device", &e))?;
                // The address came from the remote side: its listener must be a process we
                // trust with memfds (same uid or allowed, and probed), checked before the
                // Connect carries our ring's memfd ([`super::trust`]).
                self.dev
                    .trust
                    .check(&s, true)
                    .map_err(|e| peer_err("refusing to connect to", &e))?;
                Arc::new(s)
            }
        };
        // The send CQ's doorbell goes too when it is another CQ (the peer rings it with its
        // ACKs); a QP on one CQ (a link) sends none, so its peer keeps no fd for it. The
        // refill doorbell only serves a ring fed by an SRQ (its low water set). Each is a new
        // doorbell for this peer alone ([`super::bell`]).
        // Over a channel the peer's QP connected to us on, its doorbell (the pair it made for
        // its recv CQ) serves both ways: our recv CQ watches our end of it, the peer rings us
        // from its end, and no new pair is made (one fd per side and link, as an eventfd was).
        let send_bell = !Arc::ptr_eq(&self.send_cq, &self.recv_cq);
        let back = if reused {
            let bell = self.send.lock().peer.as_ref().map(|p| p.doorbell.clone());
            match bell {
                Some(b) => Some(self.recv_cq.adopt_bell(&b)?),
                None => None,
            }
        } else {
            None
        };
        let bell_back = back.is_some();
        let mut bells: Vec<BellIn> = back.into_iter().collect();
        let mut bell_fds = Vec::with_capacity(3);
        let mut offer = |o: Result<(BellIn, std::os::fd::OwnedFd)>| -> Result<()> {
            let (rx, tx) = o?;
            bells.push(rx);
            bell_fds.push(tx);
            Ok(())
        };
        if !bell_back {
            offer(self.recv_cq.offer_bell())?;
        }
        if send_bell {
            offer(self.send_cq.offer_bell())?;
        }
        if self.srq.is_some() {
            offer(self.dev.offer_refill_bell())?;
        }
        let stage_arena = self.send.lock().stage.arena().cloned();
        let mut flags = 0;
        if send_bell {
            flags |= CONNECT_SEND_BELL;
        }
        if bell_back {
            flags |= CONNECT_BELL_BACK;
        }
        if stage_arena.is_some() {
            flags |= CONNECT_STAGING;
        }
        if self.srq.is_some() {
            flags |= CONNECT_REFILL;
        }
        let hello = Msg::Connect(ConnectMsg {
            src_dev: self.dev.dev_id,
            src_qpn: self.qpn,
            dst_qpn: remote.qpn,
            ring_cap: self.ring.layout().cap,
            ring_sge: self.ring.layout().max_sge,
            access: attr.access.0,
            flags,
            stage_len: super::stage::STAGE_BYTES as u32,
            name: self.dev.sock_name.clone(),
        });
        let ring_fd = self.ring.mapping().fd().ok_or_else(|| {
            Error::InvalidState("the QP's ring was already passed to a peer".into())
        })?;
        let send_with = |stage_fd: Option<std::os::fd::RawFd>| {
            // Ring memfd, the recv CQ's doorbell unless it rings back, then as the flags say:
            // the send CQ's doorbell, the staging region, the refill doorbell.
            let mut fds = Vec::with_capacity(5);
            fds.push(ring_fd);
            let mut bell_fds = bell_fds.iter().map(|f| f.as_raw_fd());
            if !bell_back {
                fds.extend(bell_fds.next());
            }
            if send_bell {
                fds.extend(bell_fds.next());
            }
            fds.extend(stage_fd);
            if self.srq.is_some() {
                fds.extend(bell_fds.next());
            }
            sock.send(&hello.encode(), &fds)
        };
        let sent = match &stage_arena {
            // The staging region goes sealed against writes, as an `O_RDONLY` fd.
            Some(a) => match a.pass(|fd| send_with(Some(fd))) {
                Some(Ok(r)) => r,
                Some(Err(e)) => return Err(e),
                None => {
                    return Err(Error::InvalidState(
                        "the QP's staging region was already passed to a peer".into(),
                    ));
                }
            },
            None => send_with(None),
        };
        sent.map_err(|e| peer_err("connect to", &e))?;
        let mut buf = [0u8; MAX_MSG];
        let reply = if reused {
            // The message holds its own reference to the ring's memfd until the peer takes it.
            self.ring.mapping().close_fd();
            // The answer comes back on the shared channel, which the progress thread pumps.
            let deadline = Instant::now() + CONTROL_TIMEOUT;
            let mut send = self.send.lock();
            loop {
                match send.peer.as_ref().map(|p| p.take_connect_answer()) {
                    Some(Some(Ok(()))) => break,
                    Some(Some(Err(reason))) => return Err(peer_err("refused by", &reason)),
                    None => return Err(peer_err("no reply from", &"peer gone")),
                    Some(None) => {}
                }
                if self
                    .connect_answered
                    .wait_until(&mut send, deadline)
                    .timed_out()
                {
                    return Err(peer_err("no reply from", &"timed out"));
                }
            }
            drop(send);
            Ok(Recv::Msg(0, Vec::new()))
        } else {
            sock.recv(&mut buf, true)
        };
        match reply {
            Ok(Recv::Msg(0, _)) if reused => {}
            Ok(Recv::Msg(n, _)) => match Msg::decode(&buf[..n]) {
                Some(Msg::ConnectReply { ok: true, .. }) => {
                    // The peer has mapped its own copy of the ring (SCM_RIGHTS), and a QP is
                    // connected once.
                    self.ring.mapping().close_fd();
                }
                Some(Msg::ConnectReply { ok: false, reason }) => {
                    return Err(peer_err("refused by", &reason));
                }
                _ => return Err(peer_err("malformed reply from", &"?")),
            },
            Ok(_) => return Err(peer_err("no reply from", &"connection closed")),
            Err(e) => return Err(peer_err("no reply from", &e)),
        }
        let conn = Arc::new(Conn::new(sock.clone(), self.ring.clone()));
        // The PD's MRs as they are now are announced outside the PD's lock, waiting for room
        // in the peer's socket up to CONTROL_TIMEOUT (a slow peer delays this connect only);
        // `keep` holds them, so none is withdrawn meanwhile. MRs registered meanwhile are
        // announced under the lock, without waiting, as `reg_shared` announces.
        let mut keep: Vec<Arc<SoftMr>> = {
            let st = self.pd.state.lock();
            st.mrs.iter().filter_map(Weak::upgrade).collect()
        };
        let deadline = Instant::now() + CONTROL_TIMEOUT;
        for mr in &keep {
            conn.announce_by(mr, Some(deadline))
                .map_err(|e| peer_err("announcing memory to", &e))?;
        }
        {
            let mut st = self.pd.state.lock();
            let seen: HashSet<*const SoftMr> = keep.iter().map(Arc::as_ptr).collect();
            let late: Vec<Arc<SoftMr>> = st
                .mrs
                .iter()
                .filter_map(Weak::upgrade)
                .filter(|mr| !seen.contains(&Arc::as_ptr(mr)))
                .collect();
            keep.extend(late.iter().cloned());
            for mr in &late {
                conn.announce(mr)
                    .map_err(|e| peer_err("announcing memory to", &e))?;
            }
            st.conns.retain(|w| w.strong_count() > 0);
            st.conns.push(Arc::downgrade(&conn));
        }
        drop(keep); // outside the PD lock: dropping the last handle of an MR takes it
        {
            let mut send = self.send.lock();
            send.attr = *attr;
            // `remote` was set before anything was sent, so an attached peer is `remote`.
            if send
                .peer
                .as_ref()
                .is_some_and(|p| p.qpn != remote.qpn || p.name != remote.addr)
            {
                send.peer = None;
                return Err(peer_err("another peer attached before", &"mismatch"));
            }
            self.adopt_peer(&send);
        }
        *self.out.lock() = Some(conn);
        if !bell_back && !reused {
            *self.ring_back.lock() = Some((sock.clone(), bells[0].bell()));
        }
        *self.bells.lock() = bells;
        // The peer mapped the staging region: its memfd costs no fd from here on.
        self.send.lock().stage.passed();
        self.pd.qp_connected();
        if !reused {
            self.dev.watch(Watch::Outbound {
                qp: self.me.clone(),
                sock,
            });
        }
        // RESET→INIT→RTR→RTS, unless to_err() won the race.
        self.state
            .compare_exchange(
                state_code(QpState::Reset),
                state_code(QpState::Rts),
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .map_err(|s| {
                Error::InvalidState(format!("QP moved to {:?} during connect", code_state(s)))
            })?;
        self.refill_from_srq();
        Ok(())
    }

    fn destroy(&self) {
        // A peer claims no more receive WQEs (its sends see no answer and time out): set here
        // and not only in `Drop`, which a CQ poll or the progress thread holding the QP for a
        // moment would delay past the application's next drops (its MRs: a peer sending
        // meanwhile would fail on a deregistered receive buffer, REM_OP_ERR).
        self.ring.recv_cons().fetch_or(ERR_BIT, Ordering::AcqRel);
    }

    fn to_err(&self) -> Result<()> {
        if self.to_err_frozen() {
            return Ok(());
        }
        let mut send = self.send.lock();
        self.fail_locked(&mut send, None, Blame::Oldest);
        Ok(())
    }

    fn to_sqd(&self) -> Result<()> {
        let send = self.send.lock();
        match self.state() {
            QpState::Sqd => return Ok(()),
            QpState::Rts => {}
            s => {
                return Err(Error::InvalidState(format!(
                    "to_sqd in {s:?}, needs RTS or SQD"
                )));
            }
        }
        self.sqd_notified.store(false, Ordering::SeqCst);
        self.state
            .compare_exchange(
                state_code(QpState::Rts),
                state_code(QpState::Sqd),
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .map_err(|s| Error::InvalidState(format!("QP moved to {:?}", code_state(s))))?;
        self.note_drained(&send);
        Ok(())
    }

    fn to_rts(&self) -> Result<()> {
        let mut send = self.send.lock();
        self.state
            .compare_exchange(
                state_code(QpState::Sqd),
                state_code(QpState::Rts),
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .map_err(|s| {
                Error::InvalidState(format!("to_rts in {:?}, needs SQD", code_state(s)))
            })?;
        let mut keep = super::send::Keep::default();
        self.run_pending(&mut send, &mut keep);
        drop(send);
        drop(keep);
        Ok(())
    }

    fn post_send(&self, wr: &SendWr<'_>) -> Result<()> {
        self.post_send_impl(wr)
    }

    fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        if wr.sg_list.len() > self.cap.max_recv_sge as usize {
            return Err(Error::InvalidArgument(format!(
                "{} SGEs exceed max_recv_sge {}",
                wr.sg_list.len(),
                self.cap.max_recv_sge
            )));
        }
        if self.srq.is_some() {
            return Err(Error::InvalidArgument(
                "post_recv on a QP attached to an SRQ: post to the SRQ".into(),
            ));
        }
        if self.state() == QpState::Reset {
            return Err(Error::InvalidState("post_recv in RESET".into()));
        }
        self.pd.check_recv_sges(wr.sg_list)?;
        let mut recv = self.recv.lock();
        if self.state() == QpState::Err {
            drop(recv);
            if self.device_dead() {
                // Taken by a dead device: it never completes (module `fatal`).
                return Ok(());
            }
            self.recv_cq
                .push(self.wc(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv));
            return Ok(());
        }
        if recv.shadow.len() >= self.cap.max_recv_wr as usize {
            return Err(Error::QueueFull("receive queue (max_recv_wr) full"));
        }
        let seq = recv.prod;
        self.ring.write_wqe_sges(seq, wr.sg_list);
        recv.prod += 1;
        self.ring.recv_prod().store(recv.prod, Ordering::Release);
        recv.shadow.push_back(Posted {
            wr_id: wr.wr_id,
            total: wr.sg_list.iter().map(|s| u64::from(s.len)).sum(),
            sges: RecvSges::of(wr.sg_list),
        });
        Ok(())
    }
}
