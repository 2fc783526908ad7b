//! Completion queues. Each process writes only its own CQs: a CQ holds local completions (send
//! completions, flushes) and polls the inbound completion rings of the QPs whose recv CQ it is,
//! turning their entries into receive completions.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::qp::SoftQp;
use super::shm::EventFd;
use crate::events::EventHub;
use crate::provider::{CqImpl, QpImpl};
use crate::{AsyncEvent, Error, QpState, Result, Wc};

/// Queued completions and the QPs whose inbound rings this CQ drains.
#[derive(Debug)]
pub(crate) struct CqState {
    local: VecDeque<Wc>,
    overrun: bool,
    size: usize,
    pub(crate) qps: Vec<Weak<SoftQp>>,
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

/// A completion queue with an eventfd as its completion channel.
#[derive(Debug)]
pub(crate) struct SoftCq {
    me: Weak<SoftCq>,
    efd: EventFd,
    armed: AtomicBool,
    queued: AtomicUsize,
    id: u64,
    pub(crate) state: Mutex<CqState>,
}

impl SoftCq {
    pub(crate) fn new(size: u32, events: Arc<EventHub>) -> Result<Arc<SoftCq>> {
        let efd = EventFd::new()?;
        let id = crate::events::next_object_id();
        Ok(Arc::new_cyclic(|me| SoftCq {
            me: me.clone(),
            efd,
            armed: AtomicBool::new(false),
            queued: AtomicUsize::new(0),
            id,
            state: Mutex::new(CqState {
                local: VecDeque::new(),
                overrun: false,
                size: size as usize,
                qps: Vec::new(),
                id,
                events,
            }),
        }))
    }

    /// The CQ behind a provider-neutral handle, if it is a soft CQ.
    pub(crate) fn from_dyn(cq: &Arc<dyn CqImpl>) -> Option<Arc<SoftCq>> {
        cq.as_any().downcast_ref::<SoftCq>()?.me.upgrade()
    }

    /// The eventfd peers ring as doorbell.
    pub(crate) fn doorbell_fd(&self) -> std::os::fd::RawFd {
        self.efd.raw()
    }

    /// Runs `f` on the locked state, then wakes a sleeping consumer if completions were queued.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut CqState) -> R) -> R {
        let r = {
            let mut st = self.state.lock();
            let r = f(&mut st);
            self.queued.store(st.local.len(), Ordering::SeqCst);
            r
        };
        self.notify();
        r
    }

    /// Queues one local completion and wakes the consumer if it sleeps.
    pub(crate) fn push(&self, wc: Wc) {
        self.with(|st| st.push(wc));
    }

    /// Wakes the consumer if it armed the CQ (Dekker pairing with `arm`).
    pub(crate) fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.queued.load(Ordering::SeqCst) > 0 && self.armed.swap(false, Ordering::SeqCst) {
            self.efd.signal();
        }
    }

    pub(crate) fn add_qp(&self, qp: Weak<SoftQp>) {
        let mut st = self.state.lock();
        st.qps.retain(|w| w.strong_count() > 0);
        st.qps.push(qp);
    }

    fn live_qps(st: &CqState) -> impl Iterator<Item = Arc<SoftQp>> + '_ {
        st.qps.iter().filter_map(Weak::upgrade)
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
        let mut failed: Vec<Arc<SoftQp>> = Vec::new();
        let mut srq_fed: Vec<Arc<SoftQp>> = Vec::new();
        let mut n = 0;
        for round in 0..2 {
            {
                let mut st = self.state.lock();
                if round == 0 {
                    let qps: Vec<_> = Self::live_qps(&st).collect();
                    for qp in qps {
                        if qp.state() != QpState::Err && !qp.drain_into(&mut st) {
                            failed.push(qp.clone());
                        }
                        if qp.srq.is_some() {
                            srq_fed.push(qp);
                        }
                    }
                }
                if st.overrun {
                    return Err(overrun_error());
                }
                while n < out.len() {
                    let Some(wc) = st.local.pop_front() else {
                        break;
                    };
                    out[n] = wc;
                    n += 1;
                }
                self.queued.store(st.local.len(), Ordering::SeqCst);
            }
            // Completions freed ring slots: SRQs top the rings up (outside the CQ lock).
            for qp in srq_fed.drain(..) {
                qp.refill_from_srq();
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
        if self.queued.load(Ordering::SeqCst) > 0 {
            return true;
        }
        let st = self.state.lock();
        Self::live_qps(&st).any(|qp| qp.state() != QpState::Err && qp.inbound_pending())
    }

    fn event_fd(&self) -> std::os::fd::RawFd {
        self.efd.raw()
    }

    fn arm(&self) -> Result<bool> {
        self.armed.store(true, Ordering::SeqCst);
        {
            let st = self.state.lock();
            for qp in Self::live_qps(&st) {
                qp.arm_inbound();
            }
        }
        fence(Ordering::SeqCst);
        Ok(self.pending())
    }

    fn ack_event(&self) -> Result<()> {
        self.efd.drain();
        Ok(())
    }

    fn id(&self) -> u64 {
        self.id
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
