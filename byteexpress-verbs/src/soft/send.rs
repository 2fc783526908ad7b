//! The initiator's side of a soft QP: post_send, the copy engine for RDMA WRITE / READ (one
//! copy, from local registered memory straight into the peer's mapped REMOTE_WRITE memory or
//! back for READ), SEND descriptors (the receiver copies: [`super::deliver`]), in-order
//! execution, RNR and transport-retry timers. Completion on the peer's ACK: [`super::ack`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

use super::ack::Flight;
use super::mw::SoftMw;
use super::pd::{Exposure, MrCache, SoftMr};
use super::peer::Peer;
use super::qp::SoftQp;
use super::ring::{ERR_BIT, RawComp, Src};
use super::stage::{Staged, Staging};
use super::timing::{ack_timeout, give_up_after, rnr_delay};
use crate::provider::QpImpl;
use crate::wr::{MAX_MSG_LEN, check_send, wc_opcode};
use crate::{Access, ConnectAttr, Error, QpState, Result, SendWr, Sge, WcOpcode, WcStatus, WrOp};

/// Retry period when the ACK timeout is infinite (code 0).
const IDLE_RETRY: Duration = Duration::from_millis(10);

/// Which outstanding WR a failure's status goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blame {
    /// The oldest outstanding WR (awaiting its ACK, or queued).
    Oldest,
    /// The first queued WR (it failed executing): the executed ones before it are flushed.
    Queued,
}

/// A posted send WR waiting to execute (RNR, peer not ready) or about to.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) wr_id: u64,
    op: JobOp,
    sges: Vec<Sge>,
    inline: Option<Vec<u8>>,
    signaled: bool,
    /// RNR retries left (`None` = forever).
    rnr_left: Option<u8>,
    /// Not before this instant (`None`: at once).
    next_try: Option<Instant>,
    /// When the peer first did not answer.
    retry_since: Option<Instant>,
}

impl Job {
    pub(crate) fn opcode(&self) -> WcOpcode {
        match &self.op {
            JobOp::Wr(op) => wc_opcode(*op),
            JobOp::Bind(_) => WcOpcode::BindMw,
        }
    }
}

/// A WR's operation as the send queue holds it: plain data, or the objects a memory-window
/// bind names (held until it executed).
#[derive(Debug, Clone)]
pub(crate) enum JobOp {
    /// Any operation but [`WrOp::BindMw`].
    Wr(WrOp<'static>),
    /// [`WrOp::BindMw`].
    Bind(Arc<BindJob>),
}

/// A bind to execute ([`super::mw`]).
#[derive(Debug)]
pub(crate) struct BindJob {
    mw: Arc<SoftMw>,
    mr: Arc<SoftMr>,
    /// The rkey the bind gives the window.
    rkey: u32,
    addr: u64,
    len: u64,
    access: Access,
}

/// Send queue of a QP.
#[derive(Debug)]
pub(crate) struct SendSide {
    /// Outstanding WRs in order; the first is the one executing or waiting.
    pub(crate) pending: VecDeque<Job>,
    pub(crate) attr: ConnectAttr,
    /// The peer `connect` named: (QPN, device socket name).
    pub(crate) remote: Option<(u32, Vec<u8>)>,
    /// The peer died; at this instant outstanding sends fail and the QP goes to ERR.
    pub(crate) dead_deadline: Option<Instant>,
    /// The peer, once its `connect` arrived (under the send lock: every send needs it).
    pub(crate) peer: Option<Peer>,
    /// Local MRs the last sends used.
    mrs: MrCache,
    /// Executed WRs not yet completed, in order (before every WR of `pending`).
    pub(crate) inflight: VecDeque<Flight>,
    /// Where payloads the peer cannot read in place are staged.
    pub(crate) stage: Staging,
    /// The ACK timer runs (while SENDs await ACKs): when it fires next.
    pub(crate) tx_timer: Option<Instant>,
    /// The oldest SEND awaiting its ACK as the timer last saw it: its slot, since when, and
    /// whether the peer was nudged for it.
    pub(crate) tx_since: Option<(u64, Instant, bool)>,
    /// The first queued WR failed with this status while executed WRs before it still wait
    /// for their ACKs: it completes (and the QP fails) once they did.
    pub(crate) deferred: Option<WcStatus>,
}

impl SendSide {
    pub(crate) fn new() -> Result<SendSide> {
        Ok(SendSide {
            pending: VecDeque::new(),
            attr: ConnectAttr::default(),
            remote: None,
            dead_deadline: None,
            peer: None,
            mrs: MrCache::default(),
            inflight: VecDeque::new(),
            stage: Staging::new()?,
            tx_timer: None,
            tx_since: None,
            deferred: None,
        })
    }
}

/// Result of one attempt at the head WR.
pub(crate) enum Outcome {
    /// Done; bytes moved.
    Done(u64),
    /// Executed; complete once the peer acknowledges completion slot `seq`.
    Posted {
        len: u64,
        seq: u64,
        stage_end: Option<u64>,
    },
    /// The completion ring or the staging region is full of unacknowledged messages.
    Busy,
    /// The peer has no receive posted.
    Rnr,
    /// The peer does not answer (not attached, in ERR, or dead): transport retry.
    NoAnswer,
    /// The WR fails with this status and the QP goes to ERR.
    Fail(WcStatus),
}

pub(crate) type Seg = (*mut u8, usize);

/// A short list: the first [`FEW`] items on the stack, more (a WR with several SGEs) on the
/// heap. Callers bound the length by SGE counts checked against the device limits.
pub(crate) struct Few<T> {
    few: [T; FEW],
    n: usize,
    more: Vec<T>,
}

const FEW: usize = 4;

impl<T: Copy> Few<T> {
    #[inline]
    fn new(fill: T) -> Few<T> {
        Few {
            few: [fill; FEW],
            n: 0,
            more: Vec::new(),
        }
    }

    #[inline]
    pub(crate) fn push(&mut self, v: T) {
        if self.more.is_empty()
            && let Some(slot) = self.few.get_mut(self.n)
        {
            *slot = v;
            self.n += 1;
            return;
        }
        if self.more.is_empty() {
            self.more.extend_from_slice(&self.few[..self.n]);
        }
        self.more.push(v);
    }

    #[inline]
    pub(crate) fn as_slice(&self) -> &[T] {
        if self.more.is_empty() {
            &self.few[..self.n]
        } else {
            &self.more
        }
    }
}

/// Segments of a WR.
pub(crate) type Segs = Few<Seg>;

#[inline]
pub(crate) fn segs() -> Segs {
    Few::new((std::ptr::null_mut(), 0))
}

/// The local side of a send WR.
#[derive(Clone, Copy)]
enum Local<'a> {
    /// A queued WR's inline copy.
    Copy(&'a [u8]),
    /// Inline data executed at post time, read where it lies (checked, held in `Keep`).
    Inline(&'a [Seg]),
    /// SGEs, checked against their lkeys when the WR executes.
    Sges(&'a [Sge]),
}

/// MR handles an operation used, dropped by the caller after its locks (dropping the last
/// handle of an MR takes locks). The first few stay on the stack.
#[derive(Debug, Default)]
pub(crate) struct Keep {
    few: [Option<Arc<SoftMr>>; 4],
    n: usize,
    more: Vec<Arc<SoftMr>>,
}

impl Keep {
    #[inline]
    pub(crate) fn push(&mut self, mr: Arc<SoftMr>) {
        match self.few.get_mut(self.n) {
            Some(slot) => {
                *slot = Some(mr);
                self.n += 1;
            }
            None => self.more.push(mr),
        }
    }
}

/// Copies from the gather list `src` into the scatter list `dst` until either ends.
///
/// # Safety
/// Every `(ptr, len)` of `src` must be valid for reads and every one of `dst` for writes of
/// `len` bytes for the whole call. They may overlap (memmove semantics).
pub(crate) unsafe fn scatter_gather(src: &[Seg], dst: &[Seg]) {
    // SAFETY: the caller's contract; `ptr::copy` allows overlap.
    unsafe { copy_segments(src, dst, |d, s, n| std::ptr::copy(s, d, n)) }
}

/// As [`scatter_gather`], for the data of an RDMA READ or WRITE: large pieces are written
/// past the cache, as a NIC's DMA writes them ([`crate::copy::dma_copy`]); a SEND's payload,
/// which its receiver reads at once, is copied through the cache.
///
/// # Safety
/// As [`scatter_gather`].
pub(crate) unsafe fn rdma_scatter_gather(src: &[Seg], dst: &[Seg]) {
    // SAFETY: the caller's contract; `dma_copy` allows overlap.
    unsafe { copy_segments(src, dst, |d, s, n| crate::copy::dma_copy(d, s, n)) }
}

/// # Safety
/// As [`scatter_gather`]; `copy(d, s, n)` must copy `n` bytes with memmove semantics.
unsafe fn copy_segments(src: &[Seg], dst: &[Seg], copy: impl Fn(*mut u8, *const u8, usize)) {
    let (mut si, mut so, mut di, mut doff) = (0, 0, 0, 0);
    while si < src.len() && di < dst.len() {
        let n = (src[si].1 - so).min(dst[di].1 - doff);
        if n > 0 {
            // SAFETY: `so + n <= src[si].1` and `doff + n <= dst[di].1`, inside ranges the
            // caller guarantees valid.
            unsafe { copy(dst[di].0.add(doff), src[si].0.add(so), n) };
        }
        so += n;
        doff += n;
        if so == src[si].1 {
            si += 1;
            so = 0;
        }
        if doff == dst[di].1 {
            di += 1;
            doff = 0;
        }
    }
}

/// The bytes of `segs`, copied (a WR's inline data when it has to wait in the queue).
fn gather(segs: &[Seg]) -> Vec<u8> {
    let mut data = vec![0u8; segs.iter().map(|s| s.1).sum()];
    // SAFETY: every segment is valid for reads (checked inline SGEs whose MRs the caller
    // holds); `data` is exactly as long as all of them.
    unsafe { scatter_gather(segs, &[(data.as_mut_ptr(), data.len())]) };
    data
}

impl SoftQp {
    pub(crate) fn post_send_impl(&self, wr: &SendWr<'_>) -> Result<()> {
        if self.fast_send(wr) {
            return Ok(());
        }
        check_send(wr, &self.cap)?;
        let op = self.job_op(wr.op)?;
        match self.state() {
            QpState::Rts | QpState::Err => {}
            // SQD: the send queue drains; new WRs wait for RTS (refused here).
            s => {
                return Err(Error::InvalidState(format!(
                    "post_send in {s:?}, needs RTS"
                )));
            }
        }
        let mut keep = Keep::default();
        let mut inline = segs();
        {
            let mut guard = self.send.lock();
            let send = &mut *guard;
            if wr.inline {
                self.inline_segments(wr.sg_list, &mut send.mrs, &mut inline, &mut keep)?;
            }
            if self.state() == QpState::Err {
                drop(guard);
                if self.device_dead() {
                    // Taken by a dead device: it never completes (module `fatal`).
                    return Ok(());
                }
                self.send_cq
                    .push(self.wc(wr.wr_id, WcStatus::WrFlushErr, wc_opcode(wr.op)));
                return Ok(());
            }
            if send.pending.len() + send.inflight.len() >= self.cap.max_send_wr as usize {
                // Completed WRs free their slots: reap the ACKs that came.
                self.reap_locked(send);
                if send.pending.len() + send.inflight.len() >= self.cap.max_send_wr as usize {
                    return Err(Error::QueueFull("send queue (max_send_wr) full"));
                }
            }
            // Nothing queued before it (state RTS: post_send refuses SQD and the state does not
            // change under the send lock): execute it now, without building a job. Only a WR
            // that has to wait or fails joins the queue.
            let attempt = (send.pending.is_empty() && self.state() == QpState::Rts).then(|| {
                let local = if wr.inline {
                    Local::Inline(inline.as_slice())
                } else {
                    Local::Sges(wr.sg_list)
                };
                self.execute(&op, local, send, &mut keep)
            });
            self.settle(send, wr, op, inline.as_slice(), attempt, &mut keep);
        }
        drop(keep); // MR handles, dropped outside the locks
        Ok(())
    }

    /// After the attempt at executing `wr` at post time (`None`: not attempted, WRs are queued
    /// before it): its completion when done, else it joins the queue (with `inline`, its
    /// checked inline data, copied) and the queue takes it from there.
    fn settle(
        &self,
        send: &mut SendSide,
        wr: &SendWr<'_>,
        op: JobOp,
        inline: &[Seg],
        attempt: Option<Outcome>,
        keep: &mut Keep,
    ) {
        match attempt {
            Some(done @ (Outcome::Done(_) | Outcome::Posted { .. })) => {
                self.executed(send, wr.wr_id, wc_opcode(wr.op), wr.signaled, done);
            }
            attempt => {
                let rnr_retry = send.attr.rnr_retry;
                send.pending.push_back(Job {
                    wr_id: wr.wr_id,
                    op,
                    sges: if wr.inline {
                        Vec::new()
                    } else {
                        wr.sg_list.to_vec()
                    },
                    inline: wr.inline.then(|| gather(inline)),
                    signaled: wr.signaled,
                    rnr_left: (rnr_retry != 7).then_some(rnr_retry),
                    next_try: None,
                    retry_since: None,
                });
                match attempt {
                    // It failed, side effects done (an error completion for the peer):
                    // as `run_pending` would, without executing it again.
                    Some(Outcome::Fail(st)) => self.fail_queued(send, st),
                    // RNR, busy or no answer, nothing happened: the queue takes it from here.
                    Some(_) => self.run_pending(send, keep),
                    None if send.pending.len() == 1 => self.run_pending(send, keep),
                    None => {}
                }
            }
        }
    }

    /// The common case of `post_send` on a short path: a SEND or SEND_WITH_IMM of one
    /// non-empty SGE (inline or not) whose local MR is in the QP's cache, nothing queued, QP
    /// in RTS, peer attached and alive. False, with no side effect but cache bookkeeping,
    /// when any of that does not hold: the general path then handles the WR (and reports
    /// every error). What it does once it delivers is exactly what the general path does.
    #[inline]
    fn fast_send(&self, wr: &SendWr<'_>) -> bool {
        let imm = match wr.op {
            WrOp::Send => None,
            WrOp::SendWithImm(imm) => Some(imm),
            _ => return false,
        };
        let [s] = wr.sg_list else {
            return false;
        };
        let len = u64::from(s.len);
        if s.len == 0
            || self.cap.max_send_sge == 0
            || len > MAX_MSG_LEN
            || (wr.inline && len > u64::from(self.cap.max_inline_data))
            || self.state() != QpState::Rts
        {
            return false;
        }
        let mut guard = self.send.lock();
        let send = &mut *guard;
        if !send.pending.is_empty()
            || send.inflight.len() >= self.cap.max_send_wr as usize
            || self.state() != QpState::Rts
            || self.peer_dead.load(Ordering::SeqCst)
        {
            return false;
        }
        // Inline data may lie in any MR of the device; SGEs need one of this PD (a SEND's
        // local buffer needs no access flag).
        let Some((p, pd, _, announced)) = send.mrs.hit(s.lkey, s.addr, len) else {
            return false;
        };
        if !wr.inline && pd != self.pd.id {
            return false;
        }
        let SendSide { peer, stage, .. } = send;
        let Some(peer) = peer.as_mut() else {
            return false;
        };
        let seg = [(p, s.len as usize)];
        let from = if announced && !wr.inline {
            From::InPlace(Src::Mr {
                key: s.lkey,
                addr: s.addr,
            })
        } else {
            From::Stage(&seg)
        };
        let outcome = self.deliver(peer, stage, What::Send(from), len, imm, None);
        // Under the send lock, as every completion of the QP's sends: they stay in order.
        let mut keep = Keep::default();
        let op = JobOp::Wr(match imm {
            Some(imm) => WrOp::SendWithImm(imm),
            None => WrOp::Send,
        });
        self.settle(send, wr, op, &seg, Some(outcome), &mut keep);
        drop(guard);
        drop(keep);
        true
    }

    /// Inline data at post time: the bytes must lie in memory registered on this device (any
    /// key): the soft provider reads nothing it cannot vouch for. The memory stays alive
    /// through `mrs` or the MR handles in `keep`, which the caller drops after its locks.
    fn inline_segments(
        &self,
        sges: &[Sge],
        mrs: &mut MrCache,
        out: &mut Segs,
        keep: &mut Keep,
    ) -> Result<()> {
        for s in sges.iter().filter(|s| s.len > 0) {
            let len = u64::from(s.len);
            let p = match mrs.resolve(&self.dev, s.lkey, s.addr, len, keep) {
                Some((p, _, _, _)) => Some(p),
                None => {
                    // Every handle the scan takes goes to `keep`, dropped after all locks: if
                    // its owner deregisters meanwhile, ours is the last handle, and the MR's
                    // drop takes the table lock for writing (a self-deadlock under `read`).
                    let mrs = self.dev.mrs.read();
                    let mut found = None;
                    for mr in mrs.values().filter_map(std::sync::Weak::upgrade) {
                        found = mr.range(s.addr, len);
                        keep.push(mr);
                        if found.is_some() {
                            break;
                        }
                    }
                    found
                }
            };
            let Some(p) = p else {
                return Err(Error::InvalidArgument(format!(
                    "inline SGE {:#x}+{} is not in memory registered on this device",
                    s.addr, s.len
                )));
            };
            out.push((p, s.len as usize));
        }
        Ok(())
    }

    /// Progress thread: an RNR, retry or ACK timer expired, a peer attached or died.
    pub(crate) fn on_timer(&self) {
        let mut keep = Keep::default();
        {
            let mut send = self.send.lock();
            if !matches!(self.state(), QpState::Rts | QpState::Sqd) {
                send.tx_timer = None;
                return;
            }
            if send.dead_deadline.is_some_and(|d| Instant::now() >= d) {
                let first = (!send.pending.is_empty() || !send.inflight.is_empty())
                    .then_some(WcStatus::RetryExcErr);
                self.fail_locked(&mut send, first, Blame::Oldest);
                return;
            }
            self.reap_locked(&mut send);
            // Only the ACK timer's own expiry checks ACKs (other timers run this too): one
            // ACK timer per QP.
            if send.tx_timer.is_some_and(|at| Instant::now() >= at) && !self.check_acks(&mut send) {
                return;
            }
            self.run_pending(&mut send, &mut keep);
        }
        drop(keep);
    }

    /// Executes outstanding WRs in order until one has to wait. In SQD the WRs already posted
    /// still execute (the send queue drains); once none is left, SQ_DRAINED is raised.
    pub(crate) fn run_pending(&self, send: &mut SendSide, keep: &mut Keep) {
        let attr = send.attr;
        if let Some(st) = send.deferred {
            if send.inflight.is_empty() {
                self.fail_locked(send, Some(st), Blame::Queued);
            }
            return;
        }
        loop {
            if !matches!(self.state(), QpState::Rts | QpState::Sqd) {
                return;
            }
            let Some(job) = send.pending.front_mut() else {
                if send.inflight.is_empty() {
                    self.note_drained(send);
                }
                return;
            };
            if let Some(at) = job.next_try.filter(|&at| at > Instant::now()) {
                self.dev.schedule(at, self.me.clone());
                return;
            }
            let (op, inline, sges) = (
                job.op.clone(),
                job.inline.take(),
                std::mem::take(&mut job.sges),
            );
            let outcome = {
                let local = match &inline {
                    Some(d) => Local::Copy(d),
                    None => Local::Sges(&sges),
                };
                self.execute(&op, local, send, keep)
            };
            let job = send.pending.front_mut().expect("front exists");
            job.inline = inline;
            job.sges = sges;
            let fail = match outcome {
                done @ (Outcome::Done(_) | Outcome::Posted { .. }) => {
                    let job = send.pending.pop_front().expect("front exists");
                    let opcode = job.opcode();
                    self.executed(send, job.wr_id, opcode, job.signaled, done);
                    continue;
                }
                Outcome::Busy => {
                    // Room comes with ACKs: reap those that came, else wait for the next
                    // (the send CQ's poll or the ACK timer runs the queue again).
                    if self.reap_locked(send) {
                        continue;
                    }
                    return;
                }
                Outcome::Rnr => match job.rnr_left {
                    Some(0) => WcStatus::RnrRetryExcErr,
                    left => {
                        job.rnr_left = left.map(|n| n - 1);
                        let at = Instant::now() + rnr_delay(attr.min_rnr_timer);
                        job.next_try = Some(at);
                        self.dev.schedule(at, self.me.clone());
                        return;
                    }
                },
                Outcome::NoAnswer => {
                    let now = Instant::now();
                    let since = *job.retry_since.get_or_insert(now);
                    let at = match give_up_after(attr.timeout, attr.retry_cnt) {
                        Some(limit) if now >= since + limit => {
                            self.fail_queued(send, WcStatus::RetryExcErr);
                            return;
                        }
                        Some(limit) => {
                            let step = ack_timeout(attr.timeout).unwrap_or(IDLE_RETRY);
                            (now + step).min(since + limit)
                        }
                        None => now + IDLE_RETRY,
                    };
                    job.next_try = Some(at);
                    self.dev.schedule(at, self.me.clone());
                    return;
                }
                Outcome::Fail(st) => st,
            };
            self.fail_queued(send, fail);
            return;
        }
    }

    /// Local SGEs as pointers into `out`, each checked against its lkey's MR (same PD, `need`
    /// access); true when every MR is announced to peers (the peer can read it in place).
    fn local_segments(
        &self,
        sges: &[Sge],
        need: Access,
        mrs: &mut MrCache,
        out: &mut Segs,
        keep: &mut Keep,
    ) -> Option<bool> {
        let mut all_announced = true;
        for s in sges.iter().filter(|s| s.len > 0) {
            let (p, pd, access, announced) =
                mrs.resolve(&self.dev, s.lkey, s.addr, u64::from(s.len), keep)?;
            if pd != self.pd.id || !access.contains(need) {
                return None;
            }
            all_announced &= announced;
            out.push((p, s.len as usize));
        }
        Some(all_announced)
    }

    /// The operation of `op` as the send queue holds it; for a bind, the soft objects it
    /// names and the rkey it gives the window. Errors: `InvalidArgument` for a window or MR
    /// of another device.
    fn job_op(&self, op: WrOp<'_>) -> Result<JobOp> {
        Ok(JobOp::Wr(match op {
            WrOp::BindMw(b) => {
                let other = || Error::InvalidArgument("window or MR of another device".into());
                let soft =
                    b.mw.inner
                        .as_any()
                        .downcast_ref::<SoftMw>()
                        .ok_or_else(other)?;
                let mw = self
                    .dev
                    .lookup_mw(crate::provider::MwImpl::rkey(soft))
                    .filter(|m| std::ptr::eq(Arc::as_ptr(m), soft))
                    .ok_or_else(other)?;
                let mr = self
                    .dev
                    .lookup_mr(b.mr.lkey())
                    .filter(|m| std::ptr::addr_eq(Arc::as_ptr(m), Arc::as_ptr(&b.mr._reg)))
                    .ok_or_else(other)?;
                return Ok(JobOp::Bind(Arc::new(BindJob {
                    mw,
                    mr,
                    rkey: crate::wr::next_rkey(b.mw.rkey()),
                    addr: b.addr,
                    len: b.len,
                    access: b.access,
                })));
            }
            WrOp::Send => WrOp::Send,
            WrOp::SendWithImm(imm) => WrOp::SendWithImm(imm),
            WrOp::SendWithInv { rkey } => WrOp::SendWithInv { rkey },
            WrOp::Write { remote_addr, rkey } => WrOp::Write { remote_addr, rkey },
            WrOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => WrOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
            WrOp::Read { remote_addr, rkey } => WrOp::Read { remote_addr, rkey },
            WrOp::LocalInv { rkey } => WrOp::LocalInv { rkey },
        }))
    }

    /// Executes a memory-window bind ([`super::mw`]): the window, the MR and this QP in one
    /// PD, the MR's memory exposed to peers as the access needs (the soft device's own limit:
    /// a peer maps only memory allocated for remote access), the window free. Else the WR
    /// fails with `MW_BIND_ERR`.
    fn bind_mw(&self, b: &BindJob) -> Outcome {
        let exposed = !b.mr.is_user() && b.mr.exposure >= Exposure::of(b.access);
        if b.mw.pd.id != self.pd.id || b.mr.pd.id != self.pd.id || !exposed {
            return Outcome::Fail(WcStatus::MwBindErr);
        }
        let conn = self.conn();
        match b.mw.bind(
            b.rkey,
            self.qpn,
            conn.as_ref(),
            &b.mr,
            (b.addr, b.len),
            b.access,
        ) {
            Ok(()) => Outcome::Done(0),
            Err(()) => Outcome::Fail(WcStatus::MwBindErr),
        }
    }

    /// Executes a LOCAL_INV: the window bound under `rkey` is invalidated, and withdrawn from
    /// its peer before this returns. An rkey naming no bound window fails with
    /// `LOC_QP_OP_ERR` (as rxe).
    fn local_inv(&self, rkey: u32) -> Outcome {
        match self.dev.lookup_mw(rkey) {
            Some(mw) if mw.invalidate(rkey, None).is_ok() => Outcome::Done(0),
            _ => Outcome::Fail(WcStatus::LocQpOpErr),
        }
    }

    /// One attempt at a WR.
    fn execute(
        &self,
        op: &JobOp,
        local: Local<'_>,
        send: &mut SendSide,
        keep: &mut Keep,
    ) -> Outcome {
        // Local operations: they need no peer, and take effect here, in QP order.
        let op = match op {
            JobOp::Bind(b) => return self.bind_mw(b),
            JobOp::Wr(WrOp::LocalInv { rkey }) => return self.local_inv(*rkey),
            JobOp::Wr(op) => *op,
        };
        if self.peer_dead.load(Ordering::SeqCst) {
            return Outcome::NoAnswer;
        }
        let consumes_recv = matches!(
            op,
            WrOp::Send
                | WrOp::SendWithImm(_)
                | WrOp::SendWithInv { .. }
                | WrOp::WriteWithImm { .. }
        );
        let SendSide {
            peer, mrs, stage, ..
        } = send;
        let Some(peer) = peer.as_mut() else {
            // The peer's connect has not arrived: as if no receive were posted.
            return if consumes_recv {
                Outcome::Rnr
            } else {
                Outcome::NoAnswer
            };
        };
        if peer.ring.recv_cons().load(Ordering::Acquire) & ERR_BIT != 0 {
            return Outcome::NoAnswer; // peer QP in ERR or destroyed: it drops our packets
        }
        let local_need = if matches!(op, WrOp::Read { .. }) {
            Access::LOCAL_WRITE
        } else {
            Access(0)
        };
        let mut segs = segs();
        // A SEND from one SGE of memory the peer was announced: it reads it in place.
        let mut in_place = None;
        let local: &[Seg] = match local {
            Local::Copy(d) => {
                segs.push((d.as_ptr().cast_mut(), d.len()));
                segs.as_slice()
            }
            Local::Inline(s) => s,
            Local::Sges(sges) => {
                match self.local_segments(sges, local_need, mrs, &mut segs, keep) {
                    Some(announced) => {
                        if let (true, [s]) = (announced, sges) {
                            in_place = Some(Src::Mr {
                                key: s.lkey,
                                addr: s.addr,
                            });
                        }
                        segs.as_slice()
                    }
                    None => return Outcome::Fail(WcStatus::LocProtErr),
                }
            }
        };
        let total: u64 = local.iter().map(|s| s.1 as u64).sum();
        match op {
            WrOp::Send | WrOp::SendWithImm(_) | WrOp::SendWithInv { .. } => {
                let (imm, inv) = match op {
                    WrOp::SendWithImm(imm) => (Some(imm), None),
                    WrOp::SendWithInv { rkey } => (None, Some(rkey)),
                    _ => (None, None),
                };
                let what = match in_place {
                    Some(src) if total > 0 => What::Send(From::InPlace(src)),
                    _ => What::Send(From::Stage(local)),
                };
                self.deliver(peer, stage, what, total, imm, inv)
            }
            WrOp::Write { remote_addr, rkey }
            | WrOp::WriteWithImm {
                remote_addr, rkey, ..
            } => {
                let dst = match remote(peer, rkey, remote_addr, total, Access::REMOTE_WRITE) {
                    Ok(p) => p,
                    Err(st) => return Outcome::Fail(st),
                };
                if let WrOp::WriteWithImm { imm, .. } = op {
                    return self.deliver(
                        peer,
                        stage,
                        What::WriteImm(local, dst),
                        total,
                        Some(imm),
                        None,
                    );
                }
                // SAFETY: `local` lies in live local MRs (held in `keep`; inline data read in
                // place too) or in a queued WR's inline copy;
                // `dst` is `total` bytes inside our mapping of the peer's region (held by
                // `peer`, which stays locked).
                unsafe { rdma_scatter_gather(local, &[(dst, total as usize)]) };
                Outcome::Done(total)
            }
            WrOp::Read { remote_addr, rkey } => {
                let src = match remote(peer, rkey, remote_addr, total, Access::REMOTE_READ) {
                    Ok(p) => p,
                    Err(st) => return Outcome::Fail(st),
                };
                // SAFETY: as for WRITE, in the other direction.
                unsafe { rdma_scatter_gather(&[(src, total as usize)], local) };
                Outcome::Done(total)
            }
            // Executed above, never here.
            WrOp::BindMw(_) | WrOp::LocalInv { .. } => Outcome::Fail(WcStatus::LocQpOpErr),
        }
    }

    /// SEND / SEND_WITH_IMM and WRITE_WITH_IMM: claims the peer's next receive WQE and leaves
    /// the message's descriptor in the completion slot that goes with it (a WRITE_WITH_IMM's
    /// data is written first, into the checked target). The WR completes once the peer
    /// acknowledges the slot (it copied a SEND's payload: [`super::deliver`]). `inv`: a
    /// SEND_WITH_INV's rkey, which the receiver invalidates.
    fn deliver(
        &self,
        peer: &mut Peer,
        stage: &mut Staging,
        what: What<'_>,
        total: u64,
        imm: Option<u32>,
        inv: Option<u32>,
    ) -> Outcome {
        let cap = u64::from(peer.ring.layout().cap);
        let cons = peer.ring.recv_cons().load(Ordering::Acquire);
        if cons & ERR_BIT != 0 {
            return Outcome::NoAnswer;
        }
        let low_water = peer.ring.low_water().load(Ordering::Relaxed);
        // WQEs below a producer index we read (Acquire) were published before it; one read
        // earlier still bounds what we may claim (only we advance `cons`, never past it).
        // SRQ-fed rings (low water set) are always read afresh: the refill signal needs it.
        let mut prod = peer.recv_prod_seen;
        if cons == peer.recv_cons && (prod == cons || low_water > 0) {
            prod = peer.ring.recv_prod().load(Ordering::Acquire);
        }
        if cons != peer.recv_cons || prod < cons || prod - cons > cap {
            tracing::warn!(
                "soft QP {:#x}: peer's receive ring indices are impossible",
                self.qpn
            );
            return Outcome::Fail(WcStatus::RemOpErr);
        }
        peer.recv_prod_seen = prod;
        if prod == cons {
            if low_water > 0
                && let Some(r) = &peer.refill
            {
                r.ring(); // an SRQ may have WQEs for this ring
            }
            return Outcome::Rnr;
        }
        // Slot `comp_prod` is ours again once we reaped the ACK of completion
        // `comp_prod - cap` (its `ack` word is read before the slot is reused).
        if peer.comp_prod - peer.acked >= cap {
            return Outcome::Busy;
        }
        let (src, stage_end) = match what {
            What::WriteImm(..) => (Src::Placed, None),
            What::Send(From::InPlace(src)) => (src, None),
            What::Send(From::Stage(local)) => {
                if total as usize > stage.len() {
                    return Outcome::Fail(WcStatus::LocLenErr);
                }
                if total == 0 {
                    (Src::Placed, None)
                } else {
                    match stage.put(local, total as usize) {
                        Some(st) => (Src::Staged { off: st.off }, Some(st)),
                        None => return Outcome::Busy,
                    }
                }
            }
        };
        // Claim the WQE; only the owner's ERR bit may have changed the index meanwhile.
        if let Err(now) = peer.ring.recv_cons().compare_exchange(
            cons,
            cons + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            if let Some(st) = stage_end {
                stage.unput(st);
            }
            return if now & ERR_BIT != 0 {
                Outcome::NoAnswer
            } else {
                Outcome::Fail(WcStatus::RemOpErr)
            };
        }
        peer.recv_cons = cons + 1;
        if low_water > 0
            && prod - (cons + 1) <= low_water
            && let Some(r) = &peer.refill
        {
            r.ring();
        }
        let opcode = match what {
            What::WriteImm(src, dst) => {
                // SAFETY: `src` lies in live local MRs or the inline copy; `dst` was checked
                // against an MR the peer announced REMOTE_WRITE and lies inside our mapping of
                // its region (held by `peer`, which stays locked).
                unsafe { rdma_scatter_gather(src, &[(dst, total as usize)]) };
                WcOpcode::RecvRdmaWithImm
            }
            What::Send(_) => WcOpcode::Recv,
        };
        let seq = peer.comp_prod;
        peer.ring.write_comp(
            seq,
            RawComp {
                opcode: opcode as u32,
                status: 0,
                byte_len: total as u32,
                imm,
                src,
                inv,
            },
        );
        peer.comp_prod += 1;
        peer.ring
            .comp_prod()
            .store(peer.comp_prod, Ordering::Release);
        // Dekker with the consumer's arm(): it sets `armed`, fences, re-checks the ring.
        fence(Ordering::SeqCst);
        let armed = peer.ring.armed();
        if armed.load(Ordering::Relaxed) != 0 && armed.swap(0, Ordering::SeqCst) != 0 {
            peer.doorbell.ring();
        }
        // Whatever we owed the peer in ACKs, its CQ now polls (it was rung or is awake).
        if self.ack_owed.load(Ordering::Relaxed) {
            self.ack_owed.store(false, Ordering::Relaxed);
        }
        Outcome::Posted {
            len: total,
            seq,
            stage_end: stage_end.map(|st: Staged| st.end),
        }
    }
}

/// What a receive-consuming WR hands the peer.
#[derive(Clone, Copy)]
enum What<'a> {
    /// A SEND's payload.
    Send(From<'a>),
    /// WRITE_WITH_IMM: copy these segments to the checked target, then complete.
    WriteImm(&'a [Seg], *mut u8),
}

/// Where the peer's receiver reads a SEND's payload.
#[derive(Clone, Copy)]
enum From<'a> {
    /// Where it lies: memory announced to the peer.
    InPlace(Src),
    /// Copied into our staging region first.
    Stage(&'a [Seg]),
}

/// A peer address for WRITE/READ: QP access flags, then the MR's key, bounds and access.
fn remote(
    peer: &mut Peer,
    rkey: u32,
    addr: u64,
    len: u64,
    need: Access,
) -> std::result::Result<*mut u8, WcStatus> {
    if !peer.access.contains(need) {
        return Err(WcStatus::RemAccessErr);
    }
    if len == 0 {
        return Ok(std::ptr::null_mut());
    }
    peer.resolve(rkey, addr, len, need)
        .map_err(|_| WcStatus::RemAccessErr)
}
