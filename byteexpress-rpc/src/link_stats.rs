//! Counters of one link, readable while it runs ([`crate::Client::link_stats`]).

use std::sync::atomic::{AtomicU64, Ordering};

use byteexpress_flow::gate::Gate;
use byteexpress_verbs::{Qp, QpState};

/// A snapshot of a link's counters since it was set up (unit: events unless stated). On TCP
/// only the message counters that apply move; `qp_state` is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// State of the link's QP now (RDMA); `Some(QpState::Rts)` while it can send.
    pub qp_state: Option<QpState>,
    /// Completions with an error status (RNR, retry exceeded, flush, ...); each fails the link.
    pub qp_errors: u64,
    /// Of those, RNR retry exceeded: a SEND found no posted receive (credits make this a bug).
    pub rnr_errors: u64,
    /// Times the chunk due next waited because no send credit was left (receiver backpressure):
    /// `gate_refusals.credit`.
    pub credit_blocked: u64,
    /// Times the chunk due next waited because the QP or device window was full:
    /// `gate_refusals.qp_window + gate_refusals.device_window`.
    pub window_blocked: u64,
    /// Chunks larger than the whole window, posted alone once nothing else was in flight
    /// (the window's single-chunk escape, so a window below `max_chunk` cannot block forever).
    pub window_escapes: u64,
    /// Data SENDs posted (one per chunk; a message that fits one chunk is one SEND).
    pub chunks_sent: u64,
    /// Rounds of the RDMA engine that posted data SENDs: each took the credits of the chunks it
    /// granted at once, so `chunks_sent / send_rounds` is the mean batch.
    pub send_rounds: u64,
    /// Messages sent in more than one chunk.
    pub messages_chunked: u64,
    /// Messages received in more than one chunk and reassembled (one copy each).
    pub messages_reassembled: u64,
    /// Single-chunk messages copied out of their receive buffer because the receive pool had
    /// no free buffer to post in its place (otherwise they reach the application zero copy).
    pub copied_out: u64,
    /// Explicit CREDIT_UPDATE messages sent.
    pub credit_updates_sent: u64,
    /// Messages posted as they arrived, without entering the outbox (nothing was queued, they
    /// fit one chunk and the gate admitted them: the scheduler's idle bypass).
    pub bypassed: u64,
    /// Reassembled messages that went to the heap instead of the link's registered pool
    /// (larger than its 2 MiB largest class, the pool used up, or registration refused).
    pub reassembled_on_heap: u64,
    /// Cap of the QP's software window now (bytes; `u64::MAX` = unlimited, 0 on TCP). Fixed at
    /// `Config::window_bytes` unless `Config::window_target_delay` makes it adaptive.
    pub window_cap: u64,
    /// The link's state now ([`crate::LinkState`]); `None` only in a snapshot not taken from a
    /// link.
    pub link_state: Option<crate::LinkState>,
    /// Transitions of the link's state machine so far (set-up's included).
    pub transitions: u64,
    /// Times the link fell back from RDMA to its TCP control connection (its QP failed).
    pub fallbacks: u64,
    /// Re-probes started: new QP handshakes tried while in fallback.
    pub reprobes: u64,
    /// Messages re-sent over TCP after a fallback because the peer's resync said they were
    /// never delivered.
    pub resent: u64,
    /// WRs of failed QPs whose completion (a flush) has not come yet: their buffers are held
    /// until it does; those never completed stay counted (freed only with their QP).
    pub awaiting_flush: u64,
    /// Refusals of the send path's admission gates, by gate (RDMA).
    pub gate_refusals: GateRefusals,
    /// Fatal async events (`ibv_get_async_event(3)`: QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR of
    /// the link's QP, CQ_ERR of its CQ, PORT_ERR, DEVICE_FATAL) the link fell back on.
    pub fatal_events: u64,
    /// Messages sent by rendezvous: lent for the peer's READ, one descriptor SEND each.
    pub messages_lent: u64,
    /// Of those, released by the peer (it READ them; their memory is free again).
    pub messages_released: u64,
    /// Messages received by rendezvous: their bodies RDMA READ from the peer.
    pub messages_read: u64,
    /// RDMA READ WRs posted for those (a body is read in pieces).
    pub reads_posted: u64,
    /// Times the RDMA engine went to sleep on its CQ's completion channel (each later wake-up
    /// costs a process wake-up).
    pub engine_sleeps: u64,
    /// Rounds the RDMA engine polled without finding work (hybrid polling: CPU spent to save
    /// wake-ups; `Config::busy_poll`, `Config::poll_wake_cost`).
    pub idle_polls: u64,
    /// SENDs posted signaled (a CQE on success): the last of each engine round, the 16th in
    /// a row after 15 unsignaled (fewer on a short send queue), credit updates and rendezvous descriptors.
    pub sends_signaled: u64,
    /// SENDs posted unsignaled: no CQE of their own on success; the next signaled SEND's
    /// completion completes them (selective signaling, DESIGN.md 3.5).
    pub sends_unsignaled: u64,
    /// Of all SENDs, those posted inline (their bytes at most the QP's `max_inline_data`,
    /// copied at post; the send buffer went back to the pool at once).
    pub sends_inline: u64,
    /// Successful SEND completions polled (CQEs; each also completes the unsignaled SENDs
    /// before it).
    pub send_completions: u64,
}

/// Times each admission gate of the RDMA send path held a SEND back (unit: refusals). The
/// gates are `byteexpress_flow::gate`'s, checked in the order of these fields; the first that
/// refuses ends the engine's round (or holds back the chunk the scheduler designated) and is
/// counted once. A refused chunk stays queued: a refusal is a wait. Metric:
/// `bx_send_gate_refusals_total{gate=...}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateRefusals {
    /// No free send-queue slot (`max_send_wr` SENDs outstanding).
    pub sq_slot: u64,
    /// No CQ entry left for a send completion (a CQ smaller than the queues).
    pub cq_entry: u64,
    /// No free registered send buffer.
    pub send_buf: u64,
    /// No send credit (receiver backpressure), or for a bulk chunk none beyond the latency
    /// reserve.
    pub credit: u64,
    /// The QP's window was full.
    pub qp_window: u64,
    /// The device's window (shared by the device's links) was full.
    pub device_window: u64,
    /// A READ of a rendezvous body waited: the device's outstanding READs were all in use.
    pub read_depth: u64,
}

/// The live counters behind [`LinkStats`], shared by the engine (writer) and the link's users.
#[derive(Debug, Default)]
pub(crate) struct LinkCounters {
    pub qp_errors: AtomicU64,
    pub rnr_errors: AtomicU64,
    /// Refusals by gate, indexed by `Gate::index` ([`LinkCounters::refused`]).
    pub gate_refusals: [AtomicU64; 7],
    pub window_escapes: AtomicU64,
    pub chunks_sent: AtomicU64,
    pub send_rounds: AtomicU64,
    pub messages_chunked: AtomicU64,
    pub messages_reassembled: AtomicU64,
    pub copied_out: AtomicU64,
    pub credit_updates_sent: AtomicU64,
    pub bypassed: AtomicU64,
    pub reassembled_on_heap: AtomicU64,
    pub window_cap: AtomicU64,
    pub resent: AtomicU64,
    pub awaiting_flush: AtomicU64,
    pub fatal_events: AtomicU64,
    pub messages_lent: AtomicU64,
    pub messages_released: AtomicU64,
    pub messages_read: AtomicU64,
    pub reads_posted: AtomicU64,
    pub engine_sleeps: AtomicU64,
    pub idle_polls: AtomicU64,
    pub sends_signaled: AtomicU64,
    pub sends_unsignaled: AtomicU64,
    pub sends_inline: AtomicU64,
    pub send_completions: AtomicU64,
    /// The link's QP (RDMA), to read its state.
    pub qp: parking_lot::Mutex<Option<Qp>>,
    /// The same events (and bytes) for the `metrics` facade ([`crate::metrics`]).
    pub metrics: crate::metrics::LinkMetrics,
}

impl LinkCounters {
    /// Adds 1 to `c`.
    pub(crate) fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refusal by `gate`: [`LinkStats::gate_refusals`] and its metrics.
    pub(crate) fn refused(&self, gate: Gate) {
        Self::bump(&self.gate_refusals[gate.index()]);
        self.metrics.gate_refusals[gate.index()].increment(1);
        match gate {
            Gate::Credit => self.metrics.credit_stalls.increment(1),
            Gate::QpWindow | Gate::DeviceWindow => self.metrics.window_stalls.increment(1),
            _ => {}
        }
    }

    pub(crate) fn snapshot(&self) -> LinkStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let r = |gate: Gate| g(&self.gate_refusals[gate.index()]);
        let gate_refusals = GateRefusals {
            sq_slot: r(Gate::SqSlot),
            cq_entry: r(Gate::CqEntry),
            send_buf: r(Gate::SendBuf),
            credit: r(Gate::Credit),
            qp_window: r(Gate::QpWindow),
            device_window: r(Gate::DeviceWindow),
            read_depth: r(Gate::ReadDepth),
        };
        LinkStats {
            qp_state: self.qp.lock().as_ref().map(Qp::state),
            qp_errors: g(&self.qp_errors),
            rnr_errors: g(&self.rnr_errors),
            credit_blocked: gate_refusals.credit,
            window_blocked: gate_refusals.qp_window + gate_refusals.device_window,
            window_escapes: g(&self.window_escapes),
            chunks_sent: g(&self.chunks_sent),
            send_rounds: g(&self.send_rounds),
            messages_chunked: g(&self.messages_chunked),
            messages_reassembled: g(&self.messages_reassembled),
            copied_out: g(&self.copied_out),
            credit_updates_sent: g(&self.credit_updates_sent),
            bypassed: g(&self.bypassed),
            reassembled_on_heap: g(&self.reassembled_on_heap),
            window_cap: g(&self.window_cap),
            gate_refusals,
            resent: g(&self.resent),
            awaiting_flush: g(&self.awaiting_flush),
            fatal_events: g(&self.fatal_events),
            messages_lent: g(&self.messages_lent),
            messages_released: g(&self.messages_released),
            messages_read: g(&self.messages_read),
            reads_posted: g(&self.reads_posted),
            engine_sleeps: g(&self.engine_sleeps),
            idle_polls: g(&self.idle_polls),
            sends_signaled: g(&self.sends_signaled),
            sends_unsignaled: g(&self.sends_unsignaled),
            sends_inline: g(&self.sends_inline),
            send_completions: g(&self.send_completions),
            ..LinkStats::default()
        }
    }
}
