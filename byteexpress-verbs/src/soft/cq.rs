//! Completion queues. Each process writes only its own CQs: a CQ holds local completions (send
//! completions, flushes), polls the inbound completion rings of the QPs whose recv CQ it is
//! (delivering their messages: [`super::deliver`]), and reaps the ACKs of the SENDs of the QPs
//! whose send CQ it is.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::bell::{Bell, BellIn, BellSet};
use super::qp::SoftQp;
use super::ring::Ring;
use crate::events::EventHub;
use crate::provider::{CqImpl, QpImpl};
use crate::{AsyncEvent, Error, QpState, Result, Wc};

/// Turns of a hybrid-polling spin between two reads of the clock: a turn is a few loads, so a
/// spin ends at most a few hundred nanoseconds after its budget.
const SPIN_CLOCK_EVERY: u32 = 32;
/// The CQ's doorbells are drained once every this many arms ([`super::bell`]): each peer rings
/// at most once per arm, and a doorbell queues a few hundred rings before it is full.
const DRAIN_EVERY: u32 = 16;

/// Queued completions of a CQ.
#[derive(Debug)]
pub(crate) struct CqState {
    local: VecDeque<Wc>,
    overrun: bool,
    size: usize,
    id: u64,
    events: Arc<EventHub>,
}

impl CqState {
    /// Queues one completion; more than the CQ's size outstanding is an overrun: the CQ fails
    /// (every later poll is an error) and CQ_ERR is raised once.
    pub(crate) fn push(&mut self, wc: Wc) {
        if self.local.len() >= self.size {
            if !self.overrun {
                self.overrun = true;
                self.events.raise(AsyncEvent::CqErr { cq: self.id });
            }
            return;
        }
        self.local.push_back(wc);
    }
}

/// What a CQ needs of the inbound completion ring of one QP whose recv CQ it is, readable
/// without a lock: whether the ring holds completions is one load of the peer's producer index
/// against a private copy of our consumer index.
#[derive(Debug)]
pub(crate) struct Inbound {
    qp: Weak<SoftQp>,
    ring: Ring,
    /// Completions consumed from the ring: a copy, in private memory the peer cannot write, of
    /// the QP's receive-side `comp_cons` (updated by the QP after every drain).
    pub(crate) consumed: AtomicU64,
    /// Cleared when the QP goes to ERR: its ring is then no longer read.
    pub(crate) live: AtomicBool,
    /// The QP takes its receives from an SRQ (topped up after every poll).
    srq: bool,
}

impl Inbound {
    pub(crate) fn new(qp: Weak<SoftQp>, ring: Ring, srq: bool) -> Inbound {
        Inbound {
            qp,
            ring,
            consumed: AtomicU64::new(0),
            live: AtomicBool::new(true),
            srq,
        }
    }

    /// The peer published completions we have not consumed (the QP is not in ERR).
    #[inline]
    fn pending(&self) -> bool {
        if !self.live.load(Ordering::Acquire) {
            return false;
        }
        let consumed = self.consumed.load(Ordering::Acquire);
        // Also load the entry the next completion goes to: a spinner then has its line back
        // at about the time it sees the producer index move, instead of fetching it after.
        std::hint::black_box(self.ring.comp_tag(consumed).load(Ordering::Relaxed));
        self.ring.comp_prod().load(Ordering::Acquire) != consumed
    }
}

/// The inbound rings of a CQ: an immutable snapshot, rebuilt when a QP attaches or after one
/// was dropped, so polling and spinning never allocate and a spinner reads it without a lock.
type Snapshot = Arc<[Arc<Inbound>]>;

/// The locked part of a CQ: queued completions and the snapshot of inbound rings.
#[derive(Debug)]
struct Locked {
    cq: CqState,
    inbound: Snapshot,
    /// Some QP of `inbound` takes its receives from an SRQ.
    any_srq: bool,
}

/// What a CQ needs of a QP whose send CQ it is, readable without a lock: whether the peer
/// acknowledged what the QP's oldest executed WR waits for.
#[derive(Debug)]
pub(crate) struct Outbound {
    qp: Weak<SoftQp>,
    /// The peer's `comp_cons` value that completes the oldest executed WR (`u64::MAX`: none
    /// waits).
    pub(crate) wait: AtomicU64,
    /// The peer's ring, once attached (where its `comp_cons` is).
    pub(crate) ring: OnceLock<Ring>,
}

impl Outbound {
    pub(crate) fn new(qp: Weak<SoftQp>) -> Outbound {
        Outbound {
            qp,
            wait: AtomicU64::new(u64::MAX),
            ring: OnceLock::new(),
        }
    }

    /// The ACK the oldest executed WR waits for came.
    #[inline]
    pub(crate) fn ready(&self) -> bool {
        let w = self.wait.load(Ordering::Acquire);
        w != u64::MAX
            && self
                .ring
                .get()
                .is_some_and(|r| r.comp_cons().load(Ordering::Acquire) >= w)
    }

    /// Our send CQ sleeps: asks the peer to ring it when it acknowledges what we wait for.
    /// True if that ACK already came.
    fn arm(&self) -> bool {
        if self.wait.load(Ordering::Acquire) == u64::MAX {
            return false;
        }
        if let Some(r) = self.ring.get() {
            r.tx_armed().store(1, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
        self.ready()
    }
}

/// The QPs whose send CQ a CQ is (their sends complete on the peer's ACK): an immutable
/// snapshot, as for inbound rings.
type Senders = Arc<[Arc<Outbound>]>;

/// A completion queue whose completion channel is a [`BellSet`]: one doorbell per QP
/// connection that delivers into it, plus wake-ups from this process.
#[derive(Debug)]
pub(crate) struct SoftCq {
    /// QPs whose send CQ this is (a leaf lock; read once per poll, arm and spin).
    senders: Mutex<Senders>,
    me: Weak<SoftCq>,
    bells: BellSet,
    /// Arms since the doorbells were last drained ([`DRAIN_EVERY`]).
    arms: AtomicU32,
    armed: AtomicBool,
    queued: AtomicUsize,
    /// Bumped whenever the snapshot of inbound rings changes (a spinner re-reads it).
    generation: AtomicU64,
    /// A QP whose recv CQ this is was dropped: prune the snapshot at the next poll.
    qp_gone: AtomicBool,
    id: u64,
    state: Mutex<Locked>,
}

impl SoftCq {
    pub(crate) fn new(size: u32, events: Arc<EventHub>) -> Result<Arc<SoftCq>> {
        let bells = BellSet::new()?;
        let id = crate::events::next_object_id();
        Ok(Arc::new_cyclic(|me| SoftCq {
            senders: Mutex::new(Arc::new([])),
            me: me.clone(),
            bells,
            arms: AtomicU32::new(0),
            armed: AtomicBool::new(false),
            queued: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            qp_gone: AtomicBool::new(false),
            id,
            state: Mutex::new(Locked {
                cq: CqState {
                    local: VecDeque::new(),
                    overrun: false,
                    size: size as usize,
                    id,
                    events,
                },
                inbound: Arc::new([]),
                any_srq: false,
            }),
        }))
    }

    /// The CQ behind a provider-neutral handle, if it is a soft CQ.
    pub(crate) fn from_dyn(cq: &Arc<dyn CqImpl>) -> Option<Arc<SoftCq>> {
        cq.as_any().downcast_ref::<SoftCq>()?.me.upgrade()
    }

    /// A new doorbell of this CQ for one peer connection: the receiving end, to keep while
    /// the QP lives, and the sending end, for the peer ([`BellSet::offer`]).
    pub(crate) fn offer_bell(&self) -> Result<(BellIn, std::os::fd::OwnedFd)> {
        self.bells.offer()
    }

    /// A peer's doorbell pair that rings this CQ too ([`BellSet::adopt`]).
    pub(crate) fn adopt_bell(&self, bell: &Bell) -> Result<BellIn> {
        self.bells.adopt(bell)
    }

    /// Runs `f` on the locked state, then wakes a sleeping consumer if completions were queued.
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut CqState) -> R) -> R {
        let r = {
            let mut st = self.state.lock();
            let r = f(&mut st.cq);
            self.queued.store(st.cq.local.len(), Ordering::Release);
            r
        };
        self.notify();
        r
    }

    /// Queues one local completion and wakes the consumer if it sleeps.
    #[inline]
    pub(crate) fn push(&self, wc: Wc) {
        self.with(|st| st.push(wc));
    }

    /// Wakes the consumer if it armed the CQ (Dekker pairing with `arm`: each side stores its
    /// flag, fences, then loads the other's).
    #[inline]
    pub(crate) fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.queued.load(Ordering::Relaxed) > 0
            && self.armed.load(Ordering::Relaxed)
            && self.armed.swap(false, Ordering::SeqCst)
        {
            self.bells.signal();
        }
    }

    /// A QP whose recv CQ this is: its inbound ring joins the snapshot.
    pub(crate) fn attach(&self, inbound: Arc<Inbound>) {
        let mut st = self.state.lock();
        if self.armed.load(Ordering::SeqCst) {
            // A consumer sleeps on this CQ: the new ring's peer rings the doorbell too.
            inbound.ring.armed().store(1, Ordering::SeqCst);
        }
        let mut v: Vec<Arc<Inbound>> = st
            .inbound
            .iter()
            .filter(|e| e.qp.strong_count() > 0)
            .cloned()
            .collect();
        v.push(inbound);
        Self::publish(&mut st, v);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// A QP whose send CQ this is.
    pub(crate) fn attach_sender(&self, o: Arc<Outbound>) {
        let mut s = self.senders.lock();
        let mut v: Vec<Arc<Outbound>> = s
            .iter()
            .filter(|o| o.qp.strong_count() > 0)
            .cloned()
            .collect();
        v.push(o);
        *s = v.into();
        self.generation.fetch_add(1, Ordering::Release);
    }

    fn senders(&self) -> Senders {
        self.senders.lock().clone()
    }

    /// Completes the sends whose ACK came (outside this CQ's lock: a QP's send lock is taken
    /// before its send CQ's).
    fn reap_senders(&self, senders: &[Arc<Outbound>]) {
        for o in senders.iter().filter(|o| o.ready()) {
            if let Some(qp) = o.qp.upgrade() {
                qp.reap();
            }
        }
    }

    /// The progress thread, when a peer nudges because nobody polls: delivers the messages
    /// of this CQ's inbound rings into its queue (the application's next poll returns them)
    /// and wakes a sleeping consumer.
    pub(crate) fn progress(&self) {
        let mut failed: Vec<Arc<SoftQp>> = Vec::new();
        let mut keep = super::send::Keep::default();
        {
            let mut guard = self.state.lock();
            self.prune(&mut guard);
            let st = &mut *guard;
            for e in st.inbound.iter().filter(|e| e.pending()) {
                let Some(qp) = e.qp.upgrade() else { continue };
                if qp.state() != QpState::Err && !qp.drain_into(&mut st.cq, &mut keep, true) {
                    failed.push(qp);
                }
            }
            self.queued.store(st.cq.local.len(), Ordering::Release);
        }
        drop(keep);
        for qp in failed {
            qp.fail_from_cq();
        }
        self.notify();
    }

    /// Called from a QP's drop: its ring leaves the snapshot at the next poll (never under
    /// this CQ's lock, which a poll may hold while it drops the last handle of a QP).
    pub(crate) fn qp_dropped(&self) {
        self.qp_gone.store(true, Ordering::Release);
    }

    fn publish(st: &mut Locked, v: Vec<Arc<Inbound>>) {
        st.any_srq = v.iter().any(|e| e.srq);
        st.inbound = v.into();
    }

    /// Drops the rings of dropped QPs from the snapshot.
    fn prune(&self, st: &mut Locked) {
        if self.qp_gone.load(Ordering::Acquire) && self.qp_gone.swap(false, Ordering::AcqRel) {
            let v: Vec<Arc<Inbound>> = st
                .inbound
                .iter()
                .filter(|e| e.qp.strong_count() > 0)
                .cloned()
                .collect();
            Self::publish(st, v);
            self.generation.fetch_add(1, Ordering::Release);
        }
    }

    fn snapshot(&self) -> (Snapshot, u64) {
        let mut st = self.state.lock();
        self.prune(&mut st);
        // Read under the lock, which every change of the snapshot holds.
        (st.inbound.clone(), self.generation.load(Ordering::Acquire))
    }

    fn pending_in(&self, inbound: &[Arc<Inbound>], senders: &[Arc<Outbound>]) -> bool {
        self.queued.load(Ordering::Acquire) > 0
            || inbound.iter().any(|e| e.pending())
            || senders.iter().any(|o| o.ready())
    }
}

fn overrun_error() -> Error {
    Error::Os {
        what: "completion queue overrun (CQ error)",
        source: std::io::Error::from_raw_os_error(libc::EOVERFLOW),
    }
}

impl CqImpl for SoftCq {
    fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        self.reap_senders(&self.senders());
        // Allocates only when a QP fails.
        let mut failed: Vec<Arc<SoftQp>> = Vec::new();
        let mut keep = super::send::Keep::default();
        let mut n = 0;
        for round in 0..2 {
            let srq_fed = {
                let mut guard = self.state.lock();
                self.prune(&mut guard);
                let st = &mut *guard;
                if round == 0 {
                    for e in st.inbound.iter().filter(|e| e.pending()) {
                        // Dropping a QP's last handle here is fine: its drop does not lock
                        // this CQ (`qp_dropped`).
                        let Some(qp) = e.qp.upgrade() else { continue };
                        if qp.state() != QpState::Err
                            && !qp.drain_into(&mut st.cq, &mut keep, false)
                        {
                            failed.push(qp);
                        }
                    }
                }
                if st.cq.overrun {
                    drop(guard);
                    drop(keep);
                    return Err(overrun_error());
                }
                while n < out.len() {
                    let Some(wc) = st.cq.local.pop_front() else {
                        break;
                    };
                    out[n] = wc;
                    n += 1;
                }
                self.queued.store(st.cq.local.len(), Ordering::Release);
                (round == 0 && st.any_srq).then(|| st.inbound.clone())
            };
            // Completions freed ring slots: SRQs top the rings up (outside the CQ lock).
            if let Some(inbound) = srq_fed {
                for e in inbound.iter().filter(|e| e.srq) {
                    if let Some(qp) = e.qp.upgrade() {
                        qp.refill_from_srq();
                    }
                }
            }
            if failed.is_empty() {
                break;
            }
            // A QP whose peer wrote an error or garbage fails: flushes join the queue.
            for qp in failed.drain(..) {
                qp.fail_from_cq();
            }
        }
        Ok(n)
    }

    fn pending(&self) -> bool {
        let (inbound, _) = self.snapshot();
        self.pending_in(&inbound, &self.senders())
    }

    /// Spins without a lock: the snapshot of inbound rings is read once (again only when it
    /// changed), each turn loads the local queue length and the producer index of every ring.
    fn spin(&self, budget: Duration) -> bool {
        let (mut inbound, mut generation) = self.snapshot();
        let mut senders = self.senders();
        if budget.is_zero() {
            return self.pending_in(&inbound, &senders);
        }
        let t0 = Instant::now();
        let mut turns: u32 = 0;
        loop {
            if self.pending_in(&inbound, &senders) {
                return true;
            }
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(SPIN_CLOCK_EVERY) {
                if t0.elapsed() >= budget {
                    return false;
                }
                if self.generation.load(Ordering::Acquire) != generation
                    || self.qp_gone.load(Ordering::Relaxed)
                {
                    (inbound, generation) = self.snapshot();
                    senders = self.senders();
                }
            }
            std::hint::spin_loop();
        }
    }

    fn event_fd(&self) -> std::os::fd::RawFd {
        self.bells.fd()
    }

    fn arm(&self) -> Result<bool> {
        // A peer rings a doorbell at most once per arm (it clears the ring's `armed` flag
        // first), so draining every DRAIN_EVERY arms keeps an honest peer's doorbell queue far
        // below its socket buffer, and a full one can only be a peer's own doing.
        if self
            .arms
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(DRAIN_EVERY)
        {
            self.bells.drain();
        }
        self.armed.store(true, Ordering::SeqCst);
        let (inbound, _) = self.snapshot();
        for e in inbound.iter() {
            e.ring.armed().store(1, Ordering::SeqCst);
            // About to sleep: ACKs we owe a peer whose doorbell our SENDs would have rung.
            if let Some(qp) = e.qp.upgrade() {
                qp.ring_owed_ack();
            }
        }
        let senders = self.senders();
        let mut acked = false;
        for o in senders.iter() {
            acked |= o.arm();
        }
        fence(Ordering::SeqCst);
        Ok(acked || self.pending_in(&inbound, &senders))
    }

    fn ack_event(&self) -> Result<()> {
        self.bells.consume_local();
        // Nothing to consume: tokio registers the doorbells' epoll fd edge-triggered, and each
        // ring of a doorbell wakes the epoll fd's waiters again whatever was queued before, so
        // the next ring wakes the CQ without the queues being read (no syscall per wake-up;
        // `arm` drains them now and then, [`super::bell`]).
        Ok(())
    }

    fn id(&self) -> u64 {
        self.id
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
