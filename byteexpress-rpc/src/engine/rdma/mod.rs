//! The RDMA engine: one RC QP per link, receiver credits from `byteexpress-flow` so a SEND never
//! finds the peer without a posted receive (no RNR).
//!
//! A message that fits one chunk (`Config::max_chunk`, at most the peer's receive buffer) is
//! one SEND; a larger one is cut into chunks, one SEND each ([`send`]), and reassembled by the
//! receiver ([`reassembly`]). Every chunk consumes one credit.
//!
//! Outgoing messages wait in an [`Outbox`] (`byteexpress_flow::sched`: fair among logical
//! connections, single-chunk messages first); a single-chunk message that finds the outbox
//! empty is offered to the gate on arrival and, if admitted, posted without being queued
//! (`Scheduler::offer`, the idle bypass). A chunk is posted when the scheduler designates it
//! and the admission gates of `byteexpress_flow::gate` admit it, in that module's order: a
//! free send-queue slot and CQ entry (`byteexpress_flow::credit::QueueBudget`), a send
//! buffer, a send credit, and room in the QP's [`Window`] and in its device's shared window
//! ([`device_window`]); each refusal is counted under its gate. Both windows are charged the
//! chunks' wire bytes as the gate admits them (`Window::charge`), and released when their send
//! completions are polled: once per poll of the CQ with a static window, one by one with the
//! completion's RTT (µs since post) when the window adapts to it. The credits of the chunks
//! one round grants are taken at once (`Credits::try_send_data_batch`), and its first chunk's
//! header returns the credits owed to the peer. A bulk chunk leaves
//! `CreditConfig::latency_reserve` credits untouched, so bulk holds at most the update
//! threshold (half the grant) unreturned: a small message never waits for a credit, and waits
//! at the receiver behind at most that many chunks.
//!
//! Receive buffers come from a pool registered once; a single-chunk message reaches the
//! application as a slice of its receive buffer (zero copy) and the buffer returns to the pool
//! when the application drops it. A fresh buffer is posted in its place at once, so credits flow
//! back however long the application holds on; only when the pool has no free buffer left is the
//! message copied out and its own buffer re-posted. Chunks of a larger message are copied once
//! into a buffer of the announced size, and their receive buffers re-posted at once.
//!
//! One round of the engine polls the CQ (delivering single-chunk messages, deferring chunks),
//! posts what is due, and copies one deferred chunk. A round that delivered a message yields
//! to the runtime before copying, so the handler or caller runs (and its answer is posted)
//! before more chunk copies: with [`SchedMode::Fifo`] the receiver copies chunks in arrival
//! order instead.

mod async_watch;
mod device_window;
pub(crate) mod failover;
pub(crate) mod lend;
mod outbox;
mod poll;
pub(crate) mod read;
pub(crate) mod reassembly;
mod recv;
mod send;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use byteexpress_flow::credit::{CreditConfig, Credits, Piggyback, QueueBudget, QueueConfig};
use byteexpress_flow::gate::{self, Room};
use byteexpress_flow::window::Window;
use byteexpress_mem::{BufPool, LargePool, Pool, PoolBuf, PostedBufs, PostedSends, SendFlags};
use byteexpress_verbs::{Cq, Pd, Qp, Wc, WcOpcode, WcStatus, WrOp};
use tokio::sync::mpsc;

use super::tcp::Closer;
use super::{Dispatch, LinkTx};
use crate::config::SchedMode;
use crate::error::{EngineError, SetupError};
use crate::link_stats::LinkCounters;
use crate::message::Outgoing;
use crate::wire::header::{FLAG_SLOT_RETURN, HEADER_LEN, Header, Kind};
use crate::{Status, Transport};
pub(crate) use device_window::{SharedDeviceWindow, device_window};
use outbox::{Next, Outbox, Source};
use reassembly::Reassembly;

/// What an RDMA engine runs on; built by link set-up.
#[derive(Debug)]
pub(crate) struct RdmaParts {
    pub qp: Qp,
    pub cq: Cq,
    /// Depths of the QP's queues and size of its CQ (as asked for at creation; the device may
    /// round them up), for the [`QueueBudget`].
    pub queues: QueueConfig,
    /// Receive buffers: at least `grant + 1` posted, the rest for the application to hold.
    pub recv_pool: BufPool,
    /// Send buffers, each as large as the peer's receive buffers.
    pub send_pool: BufPool,
    /// Buffers that multi-chunk messages are reassembled into (size classes up to 2 MiB,
    /// registered on first use, at most [`REASSEMBLY_POOL_BYTES`]); a message larger than
    /// the largest class, or arriving while the pool is used up, goes to the heap instead.
    pub reassembly_pool: Pool,
    /// Receive buffers each side posts for the other's data (send credits), the same on both
    /// sides of a link: the smaller of the client's and the server's configured grant.
    pub grant: u32,
    /// Hybrid polling budget: how long idle rounds keep polling after the last round that
    /// did work, before the engine sleeps on the CQ's completion channel (`Config::busy_poll`;
    /// 0 = the adaptive policy of [`poll`]).
    pub busy_poll: Duration,
    /// One wake-up of a sleeping engine, for the adaptive policy (`Config::poll_wake_cost`; 0
    /// with `busy_poll` 0 = sleep at once).
    pub poll_wake_cost: Duration,
    /// Largest SEND in bytes, header included: `Config::max_chunk`, at most the peer's
    /// receive-buffer size, more than the 40-byte header.
    pub chunk: usize,
    /// Largest message in bytes (header + metadata + body), both directions:
    /// `Config::max_message`.
    pub max_message: usize,
    /// The QP's window (`Config::window_bytes`).
    pub window: Window,
    /// The device's window, shared with the device's other links.
    pub device_window: SharedDeviceWindow,
    /// Chunk order (`Config::sched`).
    pub sched: SchedMode,
    /// Name of the local device the QP lives on (reported by [`Transport`]).
    pub device: &'static str,
    /// The link's PD (memory windows of rendezvous loans are allocated in it).
    pub pd: Pd,
    /// Messages above this many wire bytes go by rendezvous (`Config::rendezvous_threshold`);
    /// `None`: never.
    pub rendezvous_threshold: Option<usize>,
    /// Memory lent for the peer's READs (readable-class, `LOCAL_WRITE | MW_BIND` where loans
    /// are windows, else no access: each loan registers its own REMOTE_READ MR).
    pub lend_pool: LargePool,
    /// Loans are memory windows (`DeviceAttr::mw_range_checked`).
    pub lend_windows: bool,
    /// Bytes lent to the peer and not released at most (`Config::memory_budget`).
    pub max_lent: u64,
    /// Memory rendezvous bodies are READ into (LOCAL_WRITE, local only).
    pub read_pool: LargePool,
    /// Largest READ WR (bytes) and READs outstanding at most, from the device.
    pub read_piece: u64,
    pub max_reads: u32,
}

/// Most bytes a link's reassembly pool registers (reassembled messages alive at once, in
/// power-of-two classes: a 1 MiB body with its metadata takes a 2 MiB buffer). Reused buffers
/// spare each large message the heap's fresh pages: glibc gives a freed 1 MiB block back to
/// the kernel, so the next one page-faults on every 4 KiB it receives.
pub(crate) const REASSEMBLY_POOL_BYTES: u64 = 32 << 20;

/// Receives posted on a link's QP, each buffer owned by its WR until the completion.
pub(crate) type Posted = PostedBufs<()>;
/// Received chunks copied per round of the engine, between two polls of the CQ (a small
/// message polled meanwhile waits behind this many chunk copies at most; one measured best in
/// `integration-tests/benches/mixed_traffic.rs`).
const CHUNK_COPIES_PER_ROUND: usize = 1;
/// Busy rounds of the engine between two yields to its runtime.
const BUSY_ROUNDS_PER_YIELD: u32 = 8;
/// wr_id tags (top byte) of the link's receive and send WRs, which share one CQ.
const RECV_TAG: u8 = 1;
const SEND_TAG: u8 = 2;
/// wr_id tags of memory-window binds (rendezvous loans) and of RDMA READs (rendezvous bodies).
const LEND_TAG: u8 = 3;
const READ_TAG: u8 = 4;
/// Every SIGNAL_EVERY-th SEND in a row is signaled (selective signaling), so at most
/// `SIGNAL_EVERY - 1` unsignaled ones precede a signaled one; capped at half the send queue
/// ([`signal_every`]). What keeps the queue from filling with WRs no CQE would free is that
/// the last SEND of every round is signaled; this bound only spreads CQEs within a long round.
const SIGNAL_EVERY: u32 = 16;
/// Inline bytes asked for at QP creation (`QpCap::max_inline_data`), at most the device's:
/// a SEND this small (header included; what the device granted decides) is copied into the
/// WQE at post, sparing the device a DMA read of the send buffer, which goes back to the pool
/// at once.
pub(crate) const INLINE_ASK: u32 = 256;

/// Posts the initial `grant + 1` receives (the QP must be past RESET); call before the peer may
/// send.
pub(crate) fn post_initial_receives(parts: &RdmaParts) -> Result<Posted, SetupError> {
    let mut posted = Posted::new(RECV_TAG);
    for _ in 0..=parts.grant {
        let buf = parts.recv_pool.alloc().map_err(SetupError::Buffers)?;
        post_recv(&parts.qp, buf, &mut posted).map_err(SetupError::PostRecv)?;
    }
    Ok(posted)
}

fn post_recv(qp: &Qp, buf: PoolBuf, posted: &mut Posted) -> Result<(), byteexpress_verbs::Error> {
    posted
        .post_recv(qp, buf, ())
        .map(|_| ())
        .map_err(|(e, _)| e)
}

/// Starts the engine on a new link in state `Rdma` (`machine`). `ctrl_dead` resolves when the
/// TCP control connection ends; when the QP fails, the engine hands its messages over through
/// `handover` ([`failover`]) instead of closing the link.
pub(crate) fn spawn(
    parts: RdmaParts,
    posted: Posted,
    dispatch: Arc<dyn Dispatch>,
    ctrl_dead: tokio::sync::oneshot::Receiver<Status>,
    machine: crate::link_state::LinkMachine,
    handover: tokio::sync::oneshot::Sender<failover::Handover>,
) -> LinkTx {
    let (tx, rx) = mpsc::unbounded_channel();
    let link = LinkTx::with_machine(
        tx,
        Transport::Rdma {
            device: parts.device,
        },
        parts.max_message,
        machine,
    );
    start(
        parts,
        posted,
        dispatch,
        ctrl_dead,
        link.clone(),
        rx,
        handover,
        (0, 0),
    );
    link
}

/// Runs an engine for `link` on `parts` (a link's first QP, or a re-probe's), taking messages
/// from `rx`; `seqs` = (sent, received): the link's message counts on RDMA so far
/// ([`failover::Seqs::starting_at`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn start(
    parts: RdmaParts,
    posted: Posted,
    dispatch: Arc<dyn Dispatch>,
    ctrl_dead: tokio::sync::oneshot::Receiver<Status>,
    link: LinkTx,
    rx: mpsc::UnboundedReceiver<Outgoing>,
    handover: tokio::sync::oneshot::Sender<failover::Handover>,
    seqs: (u64, u64),
) {
    let counters = link.counters().clone();
    *counters.qp.lock() = Some(parts.qp.clone());
    #[cfg(feature = "test-hooks")]
    link.faults().set_qp(Some(parts.qp.clone()));
    counters
        .window_cap
        .store(parts.window.cap(), std::sync::atomic::Ordering::Relaxed);
    counters.metrics.set_window_cap(parts.window.cap());
    let closer = Arc::new(Closer::new(dispatch.clone(), link.clone()));
    let credits = Credits::new(
        CreditConfig::new(parts.grant)
            .unwrap_or_else(|_| CreditConfig::new(1).expect("grant 1 is valid")),
    );
    let (parts_device, qp_num, cq_id) = (parts.device, parts.qp.qp_num(), parts.cq.id());
    let parts_sq_depth = parts.queues.sq_depth();
    let parts_max_inline = parts.qp.cap().max_inline_data as usize;
    let lender = lend::Lender::new(lend::LendConfig {
        threshold: parts.rendezvous_threshold,
        pool: parts.lend_pool.clone(),
        windows: parts.lend_windows,
        pd: parts.pd.clone(),
        max_lent: parts.max_lent,
    });
    let reader = read::Reader::new(read::ReadConfig {
        pool: parts.read_pool.clone(),
        piece: parts.read_piece,
        max_reads: parts.max_reads,
    });
    let engine = Engine {
        lender,
        reader,
        queues: queue_budget(parts.queues, &posted),
        reassembly: Reassembly::new(
            parts.max_message,
            Some(parts.reassembly_pool.clone()),
            counters.clone(),
        )
        .with_budget(dispatch.budget().clone()),
        chunks: VecDeque::with_capacity(32),
        outbox: Outbox::new(parts.sched, parts.chunk),
        parts,
        recv_posted: posted,
        send_posted: PostedSends::new(SEND_TAG),
        signal_every: signal_every(parts_sq_depth),
        unsignaled_run: 0,
        max_inline: parts_max_inline,
        covered: Vec::new(),
        credits,
        link: link.clone(),
        dispatch,
        counters,
        epoch: Instant::now(),
        held: Vec::new(),
        held_until: None,
        delivered: false,
        arrived: None,
        batch: Vec::new(),
        seqs: failover::Seqs::starting_at(seqs.0, seqs.1),
        qp_failed: None,
        draining: false,
        alarm: async_watch::register(parts_device, qp_num, cq_id),
    };
    tokio::spawn(engine.run(rx, ctrl_dead, closer, handover));
}

/// The period of forced signaling on a send queue of `sq_depth` WRs: every n-th SEND in a row
/// is signaled, n = [`SIGNAL_EVERY`], at most half the queue, at least 1 (1: every SEND
/// signaled).
fn signal_every(sq_depth: u32) -> u32 {
    SIGNAL_EVERY.min(sq_depth / 2).max(1)
}

/// The send slots and CQ entries left once `posted` receives are on the QP.
fn queue_budget(cfg: QueueConfig, posted: &Posted) -> QueueBudget {
    let mut queues = QueueBudget::new(cfg);
    for _ in 0..posted.len() {
        let taken = queues.try_post_recv();
        debug_assert!(taken.is_ok(), "grant + 1 receives fit the RQ");
    }
    queues
}

/// What a posted SEND carries besides its buffer (which [`PostedSends`] keeps until a
/// completion covers it, unless it went inline): the bytes charged to the windows (0 for a
/// credit update, which bypasses them) and when it was posted.
struct SendMeta {
    charged: u64,
    posted_at: Instant,
    /// The message number (per direction) this SEND completes, if it completes one.
    seq: Option<u64>,
}

/// What one [`Engine::step`] did.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Round {
    /// Delivered a message to the application; deferred chunks still to copy.
    Delivered,
    /// Did something else: run again before sleeping.
    Busy,
    /// Nothing to do: sleep until a completion, a message or a timer.
    Idle,
}

struct Engine {
    parts: RdmaParts,
    recv_posted: Posted,
    /// SENDs posted and not yet covered by a completion, in posting order.
    send_posted: PostedSends<SendMeta>,
    /// Every this-many-th SEND in a row is signaled ([`signal_every`]).
    signal_every: u32,
    /// Unsignaled SENDs posted since the last signaled one.
    unsignaled_run: u32,
    /// SENDs of at most this many bytes go inline: the QP's granted `max_inline_data`.
    max_inline: usize,
    /// (bytes charged, RTT in µs) of the SENDs one completion covers, with an adaptive window
    /// (kept to reuse its allocation).
    covered: Vec<(u64, u64)>,
    credits: Credits,
    outbox: Outbox,
    /// Send-queue slots and CQ entries: the second and third credits (a SEND needs a free
    /// slot and a CQ entry for its completion besides a receiver credit).
    queues: QueueBudget,
    link: LinkTx,
    dispatch: Arc<dyn Dispatch>,
    reassembly: Reassembly,
    /// Chunks received and not yet copied into their messages, oldest first
    /// ([`Engine::copy_chunks`]).
    chunks: VecDeque<(PoolBuf, Header, byteexpress_flow::credit::MsgKind)>,
    counters: Arc<LinkCounters>,
    /// Origin of the µs clock passed to the window.
    epoch: Instant,
    /// Consumed receive buffers held back by a test stall ([`crate::test_hooks`]), and when
    /// to re-post them.
    held: Vec<(PoolBuf, byteexpress_flow::credit::MsgKind)>,
    held_until: Option<Instant>,
    /// A message was delivered to the application in the current round.
    delivered: bool,
    /// A message taken from the callers' channel while the engine slept, for
    /// [`Engine::send_queued`] to offer first.
    arrived: Option<Outgoing>,
    /// The chunks of the round being posted ([`Engine::grant_batch`]), kept to reuse its
    /// capacity.
    batch: Vec<Next>,
    /// Message numbers per direction and the messages sent but not yet confirmed by their
    /// SEND completion ([`failover`]).
    seqs: failover::Seqs,
    /// Why the QP failed, when it did: the engine then hands over to the fallback.
    qp_failed: Option<failover::QpFault>,
    /// The QP failed and the engine is draining its CQ: consumed receive buffers go back to
    /// the pool instead of being re-posted.
    draining: bool,
    /// Raised by the device's watcher on a fatal async event of this QP, its CQ or its
    /// device ([`async_watch`]): the engine falls back as on an error completion.
    alarm: async_watch::Registration,
    /// Rendezvous: messages lent to the peer ([`lend`]) and bodies being READ ([`read`]).
    lender: lend::Lender,
    reader: read::Reader,
}

impl Engine {
    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Outgoing>,
        mut ctrl_dead: tokio::sync::oneshot::Receiver<Status>,
        closer: Arc<Closer>,
        handover: tokio::sync::oneshot::Sender<failover::Handover>,
    ) {
        let mut busy_rounds = 0u32;
        // Hybrid polling: after the last round that did work, idle rounds keep polling (the CQ,
        // the callers' channel, the control connection) for the policy's budget ([`poll`]),
        // yielding to the runtime between them, before the engine sleeps on the CQ. Never a
        // synchronous spin: handlers, callers and timers on this runtime run between polls.
        let mut policy = poll::PollPolicy::new(self.parts.busy_poll, self.parts.poll_wake_cost);
        let mut last_work = Instant::now();
        // The rounds since the last work found nothing (an idle gap is open), and whether the
        // engine slept on its CQ during it.
        let mut gap_open = false;
        let mut slept = false;
        let why = loop {
            if let Some(ev) = self.alarm.alarm().event() {
                tracing::info!(?ev, "fatal async event: the link falls back to TCP");
                LinkCounters::bump(&self.counters.fatal_events);
                self.qp_failed
                    .get_or_insert(failover::QpFault::AsyncEvent(ev));
                break EngineError::Qp(failover::QpFault::AsyncEvent(ev)).into();
            }
            if self.link.fall_back_pending() {
                self.qp_failed
                    .get_or_insert(failover::QpFault::PeerFellBack);
                break EngineError::Qp(failover::QpFault::PeerFellBack).into();
            }
            let round = self.step(&mut rx);
            if matches!(round, Ok(Round::Delivered | Round::Busy)) && gap_open {
                policy.on_gap(last_work.elapsed(), slept);
                gap_open = false;
                slept = false;
            }
            match round {
                Ok(Round::Delivered) => {
                    // A message went to its handler or caller: let it run now (on a
                    // current-thread runtime it runs only when the engine yields), post what
                    // it answered, then copy the chunks this round left, so chunks progress
                    // however many small messages arrive.
                    busy_rounds = 0;
                    tokio::task::yield_now().await;
                    let after = self
                        .send_queued(&mut rx)
                        .and_then(|_| self.copy_chunks(CHUNK_COPIES_PER_ROUND));
                    if let Err(why) = after {
                        break why.into();
                    }
                    // after the handlers' turn and the posting of their answers: an idle gap
                    // starts here, not before the work they did
                    last_work = Instant::now();
                    continue;
                }
                Ok(Round::Busy) => {
                    last_work = Instant::now();
                    // Let the handlers and callers on this runtime run every few busy rounds
                    // (a round posts one bulk chunk and copies one): on a current-thread
                    // runtime a busy engine would otherwise hold a small call's handler until
                    // bulk stops. Not every round: a yield may wake another worker thread.
                    busy_rounds += 1;
                    if busy_rounds == BUSY_ROUNDS_PER_YIELD {
                        busy_rounds = 0;
                        tokio::task::yield_now().await;
                    }
                    continue;
                }
                Ok(Round::Idle) => {}
                Err(why) => break why.into(),
            }
            gap_open = true;
            let polling = last_work.elapsed() < policy.budget();
            if polling {
                LinkCounters::bump(&self.counters.idle_polls);
            } else {
                slept = true;
                LinkCounters::bump(&self.counters.engine_sleeps);
            }
            let cq = self.parts.cq.clone();
            let stall_over = async {
                match self.held_until {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = stall_over => {}
                m = rx.recv() => match m {
                    Some(m) => self.arrived = Some(m),
                    None => break EngineError::Dropped.into(),
                },
                // Polling: another round as soon as the runtime has run what else is ready.
                _ = tokio::task::yield_now(), if polling => {}
                r = cq.ready(Duration::ZERO), if !polling => if let Err(e) = r {
                    self.qp_failed.get_or_insert(failover::QpFault::CqWait(e));
                    break EngineError::QpFailed("CQ wait").into();
                },
                _ = self.link.fall_back_requested() => continue,
                _ = self.alarm.alarm().raised() => continue,
                why = &mut ctrl_dead => break why.unwrap_or_else(|_| EngineError::ControlClosed.into()),
                _ = self.link.close_requested() => break EngineError::Closed.into(),
            }
        };
        if let Some(fault) = self.qp_failed.take()
            && !self.link.is_closed()
            && !handover.is_closed()
        {
            tracing::debug!(%why, %fault, "RDMA engine hands over to the fallback");
            let h = self.hand_over(rx, fault).await;
            if let Err(h) = handover.send(h) {
                // The control connection ended meanwhile: the link closes.
                drop(h);
                closer.close(why);
            }
            return;
        }
        let _ = self.parts.qp.to_err();
        self.release_windows();
        closer.close(why);
        tracing::debug!(
            stats = ?self.counters.snapshot(),
            partial = self.reassembly.in_progress(),
            "RDMA engine stopped"
        );
    }

    /// One round of work: poll the CQ (single-chunk messages are delivered, chunks deferred),
    /// post what is due, then copy a few deferred chunks unless a message was delivered (the
    /// caller yields first, then copies them).
    fn step(&mut self, rx: &mut mpsc::UnboundedReceiver<Outgoing>) -> Result<Round, EngineError> {
        let released = self.release_held()?;
        let mut wcs = [Wc::default(); 32];
        let n = self.parts.cq.poll(&mut wcs).map_err(|e| {
            self.qp_failed.get_or_insert(failover::QpFault::Poll(e));
            EngineError::QpFailed("poll_cq")
        })?;
        if n > 0 {
            // completions, received or acknowledged by the peer: it is alive (keepalive)
            self.link.touch();
        }
        self.delivered = false;
        // With a static window the SEND completions of one poll release the windows once,
        // their bytes summed (completions may be merged, `Window::on_complete`; the RTT plays
        // no part).
        let mut done = 0;
        for (i, wc) in wcs[..n].iter().enumerate() {
            if let Err(why) = self.on_completion(wc, &mut done) {
                let _ = self.release(done, 0);
                // Taken off the CQ but not handled: a fallback's drain takes them first (their
                // WRs' buffers are freed only at their completions).
                self.seqs.polled.extend_from_slice(&wcs[i..n]);
                return Err(why);
            }
        }
        self.release(done, 0)?;
        let sent = self.send_queued(rx)?;
        if self.delivered {
            return Ok(Round::Delivered);
        }
        // Copies re-post receive buffers: the credits they free go out in the next round.
        let copied = !self.chunks.is_empty();
        self.copy_chunks(CHUNK_COPIES_PER_ROUND)?;
        if self.delivered {
            // The copy completed a message: its handler or caller runs first, too.
            return Ok(Round::Delivered);
        }
        Ok(if n > 0 || sent || released || copied {
            Round::Busy
        } else {
            Round::Idle
        })
    }

    /// Handles one completion. A SEND releases its window charge: at once with an adaptive
    /// window, else added to `done` (bytes) for the caller to release with the rest of the
    /// poll.
    fn on_completion(&mut self, wc: &Wc, done: &mut u64) -> Result<(), EngineError> {
        if wc.status != WcStatus::Success {
            LinkCounters::bump(&self.counters.qp_errors);
            if wc.status == WcStatus::RnrRetryExcErr {
                LinkCounters::bump(&self.counters.rnr_errors);
            }
            self.qp_failed.get_or_insert(failover::QpFault::Completion {
                status: wc.status,
                wr_id: wc.wr_id,
            });
            return Err(EngineError::Qp(failover::QpFault::Completion {
                status: wc.status,
                wr_id: wc.wr_id,
            }));
        }
        // (The opcode is valid only on success: an error fails the link above.)
        match wc.opcode {
            WcOpcode::Recv => {
                self.queues
                    .on_recv_completion()
                    .map_err(EngineError::Queues)?;
                self.on_receive(wc)
            }
            _ if wc.wr_id >> 56 == u64::from(READ_TAG) => {
                self.queues
                    .on_send_completion()
                    .map_err(EngineError::Queues)?;
                self.on_read_done(wc.wr_id)
            }
            // A window bound for a loan: nothing to do but the slot and CQ entry.
            _ if wc.wr_id >> 56 == u64::from(LEND_TAG) => self
                .queues
                .on_send_completion()
                .map_err(EngineError::Queues),
            _ => self.on_send_done(wc, done),
        }
    }

    /// A successful SEND completion: it completes its SEND and every unsignaled one posted
    /// before it (an RC send queue completes in order), which all reached the peer. Frees their
    /// SQ slots and CQ entries, confirms the last message number among them (and so every
    /// earlier one, [`failover::Seqs::confirm`]) and releases their window charges, as
    /// [`Engine::on_completion`] says.
    fn on_send_done(&mut self, wc: &Wc, done: &mut u64) -> Result<(), EngineError> {
        LinkCounters::bump(&self.counters.send_completions);
        let adaptive = self.parts.window.adaptive_config().is_some();
        let mut covered = std::mem::take(&mut self.covered);
        let mut n = 0u32;
        let mut last_seq = None;
        for d in self.send_posted.complete(wc) {
            n += 1;
            last_seq = d.data.seq.or(last_seq);
            if adaptive {
                // The adaptive window reacts to each SEND's RTT (the clock is read only for
                // it): for a covered SEND, from its post to this completion's poll.
                let rtt_us = d.data.posted_at.elapsed().as_micros() as u64;
                covered.push((d.data.charged, rtt_us));
            } else {
                *done += d.data.charged;
            }
        }
        if let Some(seq) = last_seq {
            self.seqs.confirm(seq);
        }
        let freed = self
            .queues
            .on_send_completions(n)
            .map_err(EngineError::Queues);
        let mut released = Ok(());
        for (charged, rtt_us) in covered.drain(..) {
            if released.is_ok() {
                released = self.release(charged, rtt_us);
            }
        }
        self.covered = covered;
        freed?;
        released
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Releases `bytes` from the QP and device windows (a completion `rtt_us` after post).
    fn release(&mut self, bytes: u64, rtt_us: u64) -> Result<(), EngineError> {
        if bytes == 0 {
            return Ok(());
        }
        let now = self.now_us();
        self.parts
            .window
            .on_complete(&mut self.parts.device_window.lock(), bytes, rtt_us, now)
            .map_err(EngineError::Window)?;
        self.counters.window_cap.store(
            self.parts.window.cap(),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.counters
            .metrics
            .set_window_cap(self.parts.window.cap());
        Ok(())
    }

    /// The link is gone: gives back what its unfinished SENDs hold of the shared device window.
    fn release_windows(&mut self) {
        let charged: u64 =
            self.send_posted.data().map(|f| f.charged).sum::<u64>() + self.reader.charged();
        let _ = self.release(charged, 0);
    }

    /// Posts chunks as the scheduler designates them while the gate admits them (credit, SQ
    /// slot, send buffer, windows), then an explicit credit update if one is due.
    ///
    /// In two steps: [`Engine::grant_batch`] decides which chunks go and takes what they
    /// need (the window as it admits each, the credits once for all); then each is copied and
    /// posted, the first carrying the credits owed to the peer.
    /// A large message's chunk ends the batch, so the CQ is polled between two chunk copies.
    fn send_queued(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    ) -> Result<bool, EngineError> {
        let (mut batch, first, mut unposted) = self.grant_batch(rx)?;
        let sent = !batch.is_empty();
        // The first header returns everything owed (`Credits::try_send_data_batch`).
        let mut pb = first;
        let mut chunks = batch.drain(..);
        let mut failed = None;
        while let Some(n) = chunks.next() {
            let wire = u64::from(n.wire);
            // The round's last SEND is signaled: its completion (and so the release of the
            // windows, slots and buffers of the round) never waits for a later round.
            let last = chunks.len() == 0;
            let posted = self.post_chunk(n, std::mem::take(&mut pb), last);
            if let Err(why) = posted {
                // The link fails; what the windows hold for chunks never posted goes back,
                // and the messages whose last chunk was granted but not posted are kept for
                // a fallback to send.
                for n in chunks.by_ref() {
                    if n.last {
                        let m = match n.msg {
                            Source::Queued(id) => self.outbox.finish(id),
                            Source::Bypassed(m) => Some(m),
                        };
                        self.seqs.unposted.extend(m.map(|m| m.into_msg()));
                    }
                }
                failed = Some(why);
                break;
            }
            unposted -= wire;
        }
        drop(chunks);
        if let Some(why) = failed {
            let _ = self.release(unposted, 0);
            self.batch = batch;
            return Err(why);
        }
        self.batch = batch;
        // Rendezvous: descriptors of messages to lend, then READs of the peer's.
        let lent = self.post_lends()?;
        let read = self.post_reads()?;
        let sent = sent || lent || read;
        if self.credits.update_due() {
            // An update's SEND passes gates 1-3 (slot, CQ entry, buffer; no credit, no window).
            let room = Room::new(
                &self.queues,
                &self.credits,
                self.parts.send_pool.available(),
            );
            if let Err(g) = gate::admit_update(&room) {
                self.counters.refused(g);
            } else if let Some(pb) = self.credits.poll_update() {
                let buf = chunk_buf(&self.parts, Header::new(Kind::CreditUpdate), pb, |_| Ok(()))?;
                self.post(buf, 0, None, WrOp::Send, true)?;
                LinkCounters::bump(&self.counters.credit_updates_sent);
                return Ok(true);
            }
        }
        Ok(sent)
    }

    /// Grants the chunks to post now, in the scheduler's order, while the admission gates of
    /// `byteexpress_flow::gate` admit them, in their order: gates 1-4 (a send slot, a CQ
    /// entry, a send buffer and a credit beside those the batch holds: `gate::admit_round`)
    /// before the scheduler is asked, so a round that runs out of any ends without a refused
    /// request; then, as the scheduler's gate, a bulk chunk's latency reserve and room in the
    /// QP and device windows (`gate::admit_chunk`), charged as each chunk is admitted
    /// (`Window::charge`). The gate that refuses is counted ([`LinkCounters::refused`]).
    /// Then takes the batch's credits at once; returns the batch, the piggyback of its first
    /// header (the others carry none) and the bytes charged.
    ///
    /// Messages the callers queued meanwhile join the outbox before every grant, so a small
    /// call that arrives while a bulk message is being posted goes out next; a chunk of a
    /// large message ends the batch.
    fn grant_batch(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    ) -> Result<(Vec<Next>, Piggyback, u64), EngineError> {
        let mut batch = std::mem::take(&mut self.batch);
        let mut bytes = 0u64;
        // The device's window, shared with its other links, is locked once there is something
        // to post, and held for the round: one lock per round rather than one per chunk, at
        // the price of holding it while arrivals join the outbox.
        let mut dev = None;
        // What gates 1-4 read, once something waits: nothing they count moves before the
        // round's chunks are posted.
        let mut room = None;
        loop {
            // A message that finds the outbox empty is offered on arrival (the scheduler's
            // idle bypass); any more are queued behind it, in order.
            let mut fresh = self.arrived.take().and_then(|m| self.lender.divert(m));
            while let Ok(m) = rx.try_recv() {
                let Some(m) = self.lender.divert(m) else {
                    continue;
                };
                if fresh.is_none() && self.outbox.is_empty() {
                    fresh = Some(m);
                } else {
                    if let Some(f) = fresh.take() {
                        self.outbox.push(f);
                    }
                    self.outbox.push(m);
                }
            }
            if fresh.is_none() && self.outbox.is_empty() {
                break;
            }
            // Below the send slots, a u32.
            let held = batch.len() as u32;
            let room = *room.get_or_insert_with(|| {
                Room::new(
                    &self.queues,
                    &self.credits,
                    self.parts.send_pool.available(),
                )
            });
            // Gates 1-4 for one more chunk: when one refuses, the round ends without asking
            // the scheduler, whose gate would refuse whatever it designated.
            if let Err(g) = gate::admit_round(&room, held) {
                if let Some(f) = fresh {
                    self.outbox.push(f);
                }
                self.counters.refused(g);
                break;
            }
            let dev = dev.get_or_insert_with(|| self.parts.device_window.lock());
            let mut refused = None;
            let window = &mut self.parts.window;
            let escapes = &self.counters.window_escapes;
            // The chunk's gates (a bulk chunk's reserve, the windows), charged as admitted.
            let gate = |len: u32, class| match gate::admit_chunk(
                &room,
                held,
                class,
                window,
                dev,
                len.into(),
            ) {
                Ok(a) => {
                    if window.charge(dev, a).over_cap {
                        LinkCounters::bump(escapes);
                    }
                    true
                }
                Err(g) => {
                    refused = Some(g);
                    false
                }
            };
            let offered = fresh.is_some();
            let next = match fresh {
                Some(m) => self.outbox.offer(m, gate),
                None => self.outbox.next(gate),
            };
            let Some(n) = next else {
                match refused {
                    Some(g) => self.counters.refused(g),
                    // The gate was not asked: an offered message too large for the bypass
                    // was queued; the scheduler grants its first chunk next time round.
                    None if offered => continue,
                    None => {}
                }
                break;
            };
            bytes += u64::from(n.wire);
            let chunked = n.chunked;
            batch.push(n);
            if chunked {
                // One chunk of a large message per round: completions (a small call's
                // answer among them) are polled before the next one is copied.
                break;
            }
        }
        drop(dev);
        let mut first = Piggyback::default();
        if !batch.is_empty() {
            // Below `free_sends`, a u32.
            let Some(pb) = self.credits.try_send_data_batch(batch.len() as u32) else {
                // (The gate admitted each chunk's credit: not reached.) The link fails and
                // gives back what the windows hold for the batch.
                let _ = self.release(bytes, 0);
                return Err(EngineError::CreditVanished);
            };
            first = pb;
            LinkCounters::bump(&self.counters.send_rounds);
        }
        Ok((batch, first, bytes))
    }

    /// Copies a granted chunk (its credit already taken; `pb` its header's piggyback) into a
    /// send buffer and posts it, signaled if `last` of its round ([`Engine::post`]); the
    /// windows were charged for it by [`Engine::grant_batch`].
    fn post_chunk(&mut self, n: Next, pb: Piggyback, last: bool) -> Result<(), EngineError> {
        let msg = match &n.msg {
            Source::Queued(id) => self.outbox.msg(*id),
            Source::Bypassed(m) => {
                LinkCounters::bump(&self.counters.bypassed);
                m
            }
        };
        let mut header = n.header;
        let seq = n.last.then(|| self.seqs.next_sent());
        if let Some(seq) = seq {
            header.seq = seq as u16;
        }
        let buf = chunk_buf(&self.parts, header, pb, |b| {
            msg.copy_payload(b, n.off, n.len)
        });
        let mut whole = None;
        if n.last {
            whole = match n.msg {
                Source::Queued(id) => self.outbox.finish(id),
                Source::Bypassed(m) => Some(m),
            };
            if n.chunked {
                LinkCounters::bump(&self.counters.messages_chunked);
            }
        }
        let op = match header.kind {
            Kind::Release if header.timeout_us & read::RELEASE_INVALIDATES != 0 => {
                WrOp::SendWithInv {
                    rkey: header.timeout_us as u32,
                }
            }
            _ => WrOp::Send,
        };
        let posted = buf.and_then(|buf| self.post(buf, n.wire.into(), seq, op, last));
        if let Some(m) = whole {
            // Kept until its SEND completes, for a fallback to re-send if need be.
            self.seqs.sent(seq, m.into_msg(), posted.is_ok());
        }
        posted?;
        LinkCounters::bump(&self.counters.chunks_sent);
        self.counters.metrics.chunks_sent.increment(1);
        self.counters.metrics.bytes_sent.increment(n.wire.into());
        Ok(())
    }

    /// Posts a SEND of `buf`, which charged `charged` bytes to the windows (the caller
    /// releases them if this fails).
    ///
    /// Signaled when `signal` (the last SEND of a round, a credit update, a rendezvous
    /// descriptor) or when [`Engine::signal_every`] unsignaled ones precede it; otherwise
    /// unsignaled, completed by the next signaled SEND's completion. Its SQ slot and CQ entry
    /// are taken either way (a failure flushes every WR with a CQE). Inline when its bytes fit
    /// the QP's `max_inline_data`: the buffer then returns to the pool once posted.
    fn post(
        &mut self,
        buf: PoolBuf,
        charged: u64,
        seq: Option<u64>,
        op: WrOp<'_>,
        signal: bool,
    ) -> Result<(), EngineError> {
        self.queues.try_post_send().map_err(EngineError::Queues)?;
        let meta = SendMeta {
            charged,
            posted_at: Instant::now(),
            seq,
        };
        let flags = SendFlags {
            signaled: signal || self.unsignaled_run + 1 >= self.signal_every,
            inline: buf.len() <= self.max_inline,
        };
        self.send_posted
            .post(&self.parts.qp, buf, op, meta, flags)
            .map_err(|(e, _buf)| {
                self.qp_failed.get_or_insert(failover::QpFault::PostSend(e));
                EngineError::QpFailed("post_send")
            })?;
        if flags.signaled {
            self.unsignaled_run = 0;
            LinkCounters::bump(&self.counters.sends_signaled);
        } else {
            self.unsignaled_run += 1;
            LinkCounters::bump(&self.counters.sends_unsignaled);
        }
        if flags.inline {
            LinkCounters::bump(&self.counters.sends_inline);
        }
        Ok(())
    }
}

/// A send buffer holding `h` (with the piggyback `pb` filled in) and what `fill` appends.
fn chunk_buf(
    parts: &RdmaParts,
    mut h: Header,
    pb: Piggyback,
    fill: impl FnOnce(&mut PoolBuf) -> Result<(), byteexpress_mem::MemError>,
) -> Result<PoolBuf, EngineError> {
    h.credits = u16::try_from(pb.credits).map_err(|_| EngineError::CreditOverflow)?;
    if pb.slot_return {
        h.flags |= FLAG_SLOT_RETURN;
    }
    let exhausted = EngineError::Buffers;
    let mut buf = parts.send_pool.alloc().map_err(exhausted)?;
    buf.extend_from_slice(&h.encode()).map_err(exhausted)?;
    fill(&mut buf).map_err(exhausted)?;
    debug_assert!(buf.len() <= parts.chunk && buf.len() >= HEADER_LEN);
    Ok(buf)
}
