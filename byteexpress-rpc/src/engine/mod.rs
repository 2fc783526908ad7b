//! The two message engines (RDMA, TCP) behind one link interface.
//!
//! An engine owns its transport and moves [`Outgoing`] messages out and [`Incoming`] messages
//! in; callers hold a [`LinkTx`] and receive through a [`Dispatch`]. Nothing above this module
//! knows which engine runs, except to report it.

pub(crate) mod control;
pub(crate) mod keepalive;
pub(crate) mod rdma;
pub(crate) mod tcp;

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::budget::MemoryBudget;
use crate::error::EngineError;
use crate::link_state::LinkMachine;
use crate::link_stats::LinkCounters;
use crate::message::{Incoming, Outgoing};
use crate::wire::header::Header;
use crate::{Status, Transport};

/// Receives what an engine delivers. Called on the engine's task: must not block.
pub(crate) trait Dispatch: Send + Sync + 'static {
    /// A message arrived (REQUEST, RESPONSE or CANCEL; credit updates never reach here).
    fn incoming(&self, link: &LinkTx, msg: Incoming);
    /// The link is gone; every call still waiting on it fails with `why`. Called once.
    fn closed(&self, why: Status);
    /// The budget that partly received messages on this link are charged to.
    fn budget(&self) -> &MemoryBudget;
    /// Calls on this link not yet answered (client) or handlers running (server); the idle
    /// timeout never closes a link with calls.
    fn calls_in_flight(&self) -> usize;
    /// A message (header `h`) was refused unread for want of budget: the server answers the
    /// request with `why`, the client fails the call with it.
    fn refused(&self, link: &LinkTx, h: &Header, why: Status);
    /// The peer's per-stream receive window in bytes, as it announced it in set-up (HELLO or
    /// HELLO_ACK `stream_window`, held to `wire::hello::MAX_STREAM_WINDOW`): the most this side
    /// may have sent on one stream and not granted back (RFC 9113 §6.5.2
    /// SETTINGS_INITIAL_WINDOW_SIZE). Set-up calls it once, before the engine starts.
    fn peer_stream_window(&self, bytes: u64);
}

/// The sending side of a link, cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct LinkTx {
    inner: Arc<LinkShared>,
}

#[derive(Debug)]
struct LinkShared {
    tx: mpsc::UnboundedSender<Outgoing>,
    transport: Transport,
    max_message: usize,
    close_now: CancellationToken,
    counters: Arc<LinkCounters>,
    /// When the peer was last heard from (any message, chunk, PING or PONG), in µs after
    /// [`keepalive::epoch`].
    last_rx: std::sync::atomic::AtomicU64,
    /// While the TCP write task is inside a write (a batch not yet all taken by the socket):
    /// when the socket last took bytes of it, in µs after [`keepalive::epoch`]; 0 when no
    /// write is under way. A PING queued behind a long frame cannot be answered before the
    /// frame is out, so keepalive counts its wait from here ([`keepalive::watch`]).
    writing_since: std::sync::atomic::AtomicU64,
    /// When the TCP write task last wrote a PING out (the socket took all of it), µs after
    /// [`keepalive::epoch`]; 0 before the first.
    ping_out: std::sync::atomic::AtomicU64,
    /// The link's state machine ([`crate::link_state`]).
    machine: LinkMachine,
    /// Fired when the peer's RESYNC says its QP failed: the RDMA engine stops and hands its
    /// messages to the fallback ([`rdma::failover`]).
    fall_back_now: parking_lot::Mutex<CancellationToken>,
    /// Set by the first [`tcp::Closer`] that closes the link: `Dispatch::closed` runs once
    /// whichever engine (phase) sees the end.
    closed_once: std::sync::atomic::AtomicBool,
    /// Test-only faults of this link ([`crate::test_hooks::LinkFaults`]).
    #[cfg(feature = "test-hooks")]
    faults: crate::test_hooks::LinkFaults,
}

impl LinkTx {
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn new(
        tx: mpsc::UnboundedSender<Outgoing>,
        transport: Transport,
        max_message: usize,
    ) -> Self {
        Self::with_machine(tx, transport, max_message, LinkMachine::new("-"))
    }

    /// As [`LinkTx::new`], with the state machine set-up drove (in `Rdma` or `Tcp`).
    pub(crate) fn with_machine(
        tx: mpsc::UnboundedSender<Outgoing>,
        transport: Transport,
        max_message: usize,
        machine: LinkMachine,
    ) -> Self {
        #[cfg(feature = "test-hooks")]
        let faults = {
            let f = crate::test_hooks::LinkFaults::default();
            f.set_raw(tx.clone());
            f
        };
        LinkTx {
            inner: Arc::new(LinkShared {
                tx,
                transport,
                max_message,
                close_now: CancellationToken::new(),
                counters: Arc::new(LinkCounters {
                    metrics: crate::metrics::LinkMetrics::link_up(transport),
                    ..LinkCounters::default()
                }),
                last_rx: keepalive::now_us().into(),
                writing_since: 0.into(),
                ping_out: 0.into(),
                machine,
                fall_back_now: parking_lot::Mutex::new(CancellationToken::new()),
                closed_once: std::sync::atomic::AtomicBool::new(false),
                #[cfg(feature = "test-hooks")]
                faults,
            }),
        }
    }

    /// Queues a message. Errors with UNAVAILABLE when the link is closed, RESOURCE_EXHAUSTED when
    /// it is larger than the peer accepts or its metadata exceeds the header's 32-bit
    /// `meta_len`.
    pub(crate) fn send(&self, msg: Outgoing) -> Result<(), Status> {
        if msg.meta_too_long() {
            return Err(EngineError::MetadataTooLong {
                len: msg.meta.len(),
            }
            .into());
        }
        if msg.wire_len() > self.inner.max_message {
            return Err(EngineError::MessageTooLarge {
                len: msg.wire_len(),
                max: self.inner.max_message,
            }
            .into());
        }
        if self.is_closed() {
            return Err(EngineError::Closed.into());
        }
        self.inner
            .tx
            .send(msg)
            .map_err(|_| EngineError::Closed.into())
    }

    /// The link's counters, for the engine to update.
    pub(crate) fn counters(&self) -> &Arc<LinkCounters> {
        &self.inner.counters
    }

    /// A snapshot of the link's counters.
    pub(crate) fn stats(&self) -> crate::LinkStats {
        let mut s = self.inner.counters.snapshot();
        s.link_state = Some(self.inner.machine.state());
        (s.transitions, s.fallbacks, s.reprobes) = self.inner.machine.counts();
        s
    }

    /// The transport this link runs on now: the one it negotiated, or
    /// [`Transport::TcpFallback`] while its QP has failed.
    pub(crate) fn transport(&self) -> Transport {
        match (
            self.inner.transport,
            self.inner.machine.state().is_fallback(),
        ) {
            (Transport::Rdma { device }, true) => Transport::TcpFallback { device },
            (t, _) => t,
        }
    }

    /// The link's state machine.
    pub(crate) fn machine(&self) -> &LinkMachine {
        &self.inner.machine
    }

    /// Asks the RDMA engine to stop and hand over to the fallback (the peer's QP failed).
    pub(crate) fn fall_back(&self) {
        self.inner.fall_back_now.lock().cancel();
    }

    /// [`LinkTx::fall_back`] was called since the engine started.
    pub(crate) fn fall_back_pending(&self) -> bool {
        self.inner.fall_back_now.lock().is_cancelled()
    }

    /// Resolves when [`LinkTx::fall_back`] is called.
    pub(crate) async fn fall_back_requested(&self) {
        let t = self.inner.fall_back_now.lock().clone();
        t.cancelled().await
    }

    /// A new QP took over (a re-probe): the next fallback needs a new request.
    pub(crate) fn rearm_fall_back(&self) {
        *self.inner.fall_back_now.lock() = CancellationToken::new();
    }

    /// True the first time only: whoever gets it calls `Dispatch::closed`.
    pub(crate) fn claim_close(&self) -> bool {
        !self
            .inner
            .closed_once
            .swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// The link's test-only faults.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn faults(&self) -> &crate::test_hooks::LinkFaults {
        &self.inner.faults
    }

    /// Largest message (header + metadata + body) the peer accepts on this link, in bytes.
    pub(crate) fn max_message(&self) -> usize {
        self.inner.max_message
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.inner.close_now.is_cancelled()
    }

    /// Notes that the peer was heard from now (for keepalive and the idle timeout).
    pub(crate) fn touch(&self) {
        self.inner
            .last_rx
            .store(keepalive::now_us(), std::sync::atomic::Ordering::Relaxed);
    }

    /// The TCP write task starts a write, or the socket took bytes of the one under way.
    pub(crate) fn write_progress(&self) {
        self.inner.writing_since.store(
            keepalive::now_us().max(1),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The TCP write task's write is done: everything it had was taken by the socket.
    pub(crate) fn write_done(&self) {
        self.inner
            .writing_since
            .store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// While a write is under way, when the socket last took bytes of it (µs after
    /// [`keepalive::epoch`]); `None` when no write is under way.
    pub(crate) fn write_progress_us(&self) -> Option<u64> {
        match self
            .inner
            .writing_since
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => None,
            t => Some(t),
        }
    }

    /// The TCP write task wrote a PING out: its answer can come from now on.
    pub(crate) fn ping_written(&self) {
        self.inner
            .ping_out
            .store(keepalive::now_us(), std::sync::atomic::Ordering::Relaxed);
    }

    /// When a PING was last written out (µs after [`keepalive::epoch`]; 0: never, or a link
    /// whose PINGs go another way).
    pub(crate) fn ping_out_us(&self) -> u64 {
        self.inner
            .ping_out
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// When the peer was last heard from, in µs after [`keepalive::epoch`].
    pub(crate) fn last_rx_us(&self) -> u64 {
        self.inner
            .last_rx
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Asks the engine to stop and close its transport.
    pub(crate) fn close(&self) {
        self.inner.close_now.cancel();
    }

    /// Resolves when [`LinkTx::close`] was called.
    pub(crate) async fn close_requested(&self) {
        self.inner.close_now.cancelled().await
    }
}
