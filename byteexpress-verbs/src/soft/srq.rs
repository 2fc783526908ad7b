//! Shared receive queues of the soft device.
//!
//! Every receive ring in shared memory has one producer (the process owning the QP) and one
//! consumer (the peer's sender), so an SRQ cannot be one ring several peers claim from. Instead
//! (DESIGN.md) the SRQ keeps its WQEs in a local queue and lends them in batches to the receive
//! rings of its attached QPs: a ring at or below its low-water mark gets up to its capacity
//! from the front of the queue. Triggers: a post to the SRQ, a connect, a poll of the QP's recv
//! CQ (which frees ring slots), and the peer's sender ringing this device's refill eventfd when
//! it finds the ring low or empty.
//!
//! Accounting: `outstanding` counts WQEs posted and not yet consumed by a message, whether
//! queued here or lent to a ring; `QueueFull` and the SRQ limit use it. When a QP goes to ERR
//! or is destroyed, the WQEs lent to it that its peer had not claimed go back to the front of
//! the queue, in order (WQEs of an SRQ are not flushed by a QP error, IB spec 10.2.9.5); those
//! the peer had claimed complete on that QP.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, MutexGuard};

use super::deliver::RecvSges;
use super::limits;
use super::pd::SoftPd;
use super::qp::{Posted, SoftQp};
use crate::provider::{QpImpl, SrqImpl};
use crate::{AsyncEvent, Error, QpState, RecvWr, Result, SrqAttr};

/// Largest receive ring an SRQ lends to (per attached QP).
const MAX_LEND_RING: u32 = 64;

/// Capacity of the ring of a QP attached to an SRQ of `max_wr` WQEs: a quarter of the SRQ, so
/// several QPs share it, at most [`MAX_LEND_RING`].
pub(crate) fn lend_ring_cap(max_wr: u32) -> u32 {
    (max_wr / 4).clamp(1, MAX_LEND_RING)
}

/// Unclaimed WQEs at or below which a ring of capacity `cap` is refilled.
pub(crate) fn low_water(cap: u32) -> u64 {
    u64::from(cap / 2)
}

#[derive(Debug, Default)]
pub(crate) struct SrqState {
    /// WQEs not lent to any ring, in posting order.
    queue: VecDeque<Posted>,
    qps: Vec<Weak<SoftQp>>,
}

/// A shared receive queue.
#[derive(Debug)]
pub(crate) struct SoftSrq {
    me: Weak<SoftSrq>,
    pub(crate) id: u64,
    pub(crate) pd: Arc<SoftPd>,
    pub(crate) max_wr: u32,
    pub(crate) max_sge: u32,
    /// Receive-ring capacity of each attached QP.
    pub(crate) ring_cap: u32,
    state: Mutex<SrqState>,
    /// WQEs given back by QPs in ERR or destroyed, oldest batch first (a leaf lock).
    returned: Mutex<Vec<Vec<Posted>>>,
    /// WQEs posted and not yet consumed by a message (queued or lent).
    outstanding: AtomicU64,
    /// Armed limit; 0 = disarmed.
    limit: AtomicU32,
}

impl SoftSrq {
    pub(crate) fn create(pd: Arc<SoftPd>, attr: SrqAttr) -> Result<Arc<SoftSrq>> {
        if attr.max_wr > limits::MAX_QP_WR || attr.max_sge > limits::MAX_SGE {
            return Err(Error::InvalidArgument(format!(
                "SRQ {attr:?} exceeds the device limits (max_srq_wr {}, max_srq_sge {})",
                limits::MAX_QP_WR,
                limits::MAX_SGE
            )));
        }
        let max_wr = attr.max_wr.max(1);
        if attr.srq_limit > max_wr {
            return Err(Error::InvalidArgument(format!(
                "srq_limit {} above max_wr {max_wr}",
                attr.srq_limit
            )));
        }
        let srq = Arc::new_cyclic(|me| SoftSrq {
            me: me.clone(),
            id: crate::events::next_object_id(),
            max_wr,
            max_sge: attr.max_sge.max(1),
            ring_cap: lend_ring_cap(max_wr),
            state: Mutex::new(SrqState::default()),
            returned: Mutex::new(Vec::new()),
            outstanding: AtomicU64::new(0),
            limit: AtomicU32::new(attr.srq_limit),
            pd: pd.clone(),
        });
        let mut srqs = pd.dev.srqs.lock();
        srqs.retain(|w| w.strong_count() > 0);
        srqs.push(Arc::downgrade(&srq));
        Ok(srq)
    }

    /// The SRQ behind a provider-neutral handle, if it is a soft SRQ.
    pub(crate) fn from_dyn(s: &Arc<dyn SrqImpl>) -> Option<Arc<SoftSrq>> {
        s.as_any().downcast_ref::<SoftSrq>()?.me.upgrade()
    }

    /// The locked state, with WQEs returned by QPs merged back at the front first.
    fn lock(&self) -> MutexGuard<'_, SrqState> {
        let mut st = self.state.lock();
        let returned = std::mem::take(&mut *self.returned.lock());
        for wqes in returned.into_iter().rev() {
            for p in wqes.into_iter().rev() {
                st.queue.push_front(p);
            }
        }
        st
    }

    /// A QP now takes its receives from this SRQ.
    pub(crate) fn attach(&self, qp: Weak<SoftQp>) {
        let mut st = self.lock();
        st.qps.retain(|w| w.strong_count() > 0);
        st.qps.push(qp);
    }

    /// Lends WQEs to `qp` if its ring is low.
    pub(crate) fn refill_one(&self, qp: &SoftQp) {
        let mut st = self.lock();
        qp.lend(&mut st.queue);
    }

    /// Lends WQEs to every attached QP whose ring is low, in attachment order.
    pub(crate) fn refill_all(&self) {
        let mut st = self.lock();
        let keep = Self::refill_locked(&mut st);
        drop(st);
        drop(keep);
    }

    /// Lends to every low ring; returns the QP handles it used, to be dropped after the lock.
    #[must_use]
    fn refill_locked(st: &mut SrqState) -> Vec<Arc<SoftQp>> {
        if st.queue.is_empty() {
            return Vec::new();
        }
        let qps: Vec<Arc<SoftQp>> = st.qps.iter().filter_map(Weak::upgrade).collect();
        for qp in &qps {
            if st.queue.is_empty() {
                break;
            }
            qp.lend(&mut st.queue);
        }
        qps
    }

    /// WQEs lent to a QP that can no longer use them go back to the front of the queue, in
    /// order (merged at the next lock; callable under any lock, even from the QP's Drop).
    pub(crate) fn give_back(&self, wqes: Vec<Posted>) {
        if !wqes.is_empty() {
            self.returned.lock().push(wqes);
        }
    }

    /// `n` WQEs were consumed by messages (their completions are queued): count them and raise
    /// SRQ_LIMIT_REACHED if that takes the SRQ below an armed limit.
    pub(crate) fn consumed(&self, n: u64) {
        let left = self
            .outstanding
            .fetch_sub(n, Ordering::AcqRel)
            .saturating_sub(n);
        let lim = self.limit.load(Ordering::Acquire);
        if lim > 0
            && left < u64::from(lim)
            && self
                .limit
                .compare_exchange(lim, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.pd
                .dev
                .events
                .raise(AsyncEvent::SrqLimitReached { srq: self.id });
        }
    }
}

impl SrqImpl for SoftSrq {
    fn id(&self) -> u64 {
        self.id
    }

    fn attr(&self) -> SrqAttr {
        SrqAttr {
            max_wr: self.max_wr,
            max_sge: self.max_sge,
            srq_limit: self.limit.load(Ordering::Acquire),
        }
    }

    fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        crate::wr::check_srq_recv(wr, self.max_sge)?;
        self.pd.check_recv_sges(wr.sg_list)?;
        let sges = RecvSges::of(wr.sg_list);
        let total = wr.sg_list.iter().map(|s| u64::from(s.len)).sum();
        let mut st = self.lock();
        if self.outstanding.load(Ordering::Acquire) >= u64::from(self.max_wr) {
            return Err(Error::QueueFull("shared receive queue (max_wr) full"));
        }
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        st.queue.push_back(Posted {
            wr_id: wr.wr_id,
            total,
            sges,
        });
        let keep = Self::refill_locked(&mut st);
        drop(st);
        drop(keep);
        Ok(())
    }

    fn arm_limit(&self, limit: u32) -> Result<()> {
        if limit > self.max_wr {
            return Err(Error::InvalidArgument(format!(
                "srq_limit {limit} above max_wr {}",
                self.max_wr
            )));
        }
        self.limit.store(limit, Ordering::Release);
        Ok(())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// True when a QP in `s` may take WQEs from its SRQ.
pub(crate) fn lends_to(s: QpState) -> bool {
    matches!(s, QpState::Rts | QpState::Sqd)
}

impl SoftQp {
    /// The state a QP reports, for [`lends_to`].
    pub(crate) fn lendable(&self) -> bool {
        lends_to(self.state())
    }
}
