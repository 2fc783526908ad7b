//! Link and call events recorded through the `metrics` crate facade, under the names below
//! (documented for users in README and DESIGN.md 3.5). Nothing is recorded anywhere until the
//! process installs a recorder (`bx ps serve --metrics ADDR` installs a Prometheus exporter);
//! without one each event costs a branch on a no-op handle.
//!
//! Per-link handles are registered once, when the link is set up, so the engines' hot paths
//! touch an atomic, never a key lookup. Labels have bounded values: `transport` (`rdma`,
//! `tcp`), `device` (a local device name, `-` on TCP), `side` (`client`, `server`), `code`
//! (a gRPC status code name) and `method` (the gRPC method path; on the server only paths a
//! service answered, `unknown` for the rest, so a peer cannot grow the label set).
//!
//! Later issues add their events to this module under the same `bx_` prefix.

use std::time::Duration;

use byteexpress_flow::gate::Gate;
use metrics::{Counter, Gauge};

use crate::{Code, Transport};

/// Counter: links set up, labels `transport`, `device`.
pub const LINKS_OPENED: &str = "bx_links_opened_total";
/// Counter: links that ended (peer gone, QP error, closed), labels `transport`, `device`.
pub const LINKS_CLOSED: &str = "bx_links_closed_total";
/// Gauge: links open now, labels `transport`, `device`.
pub const LINKS_OPEN: &str = "bx_links_open";
/// Counter: calls finished, labels `side`, `method`, `code`.
pub const CALLS: &str = "bx_calls_total";
/// Histogram: call latency in seconds (client: send to answer; server: handler start to
/// answer), labels `side`, `method`.
pub const CALL_SECONDS: &str = "bx_call_duration_seconds";
/// Counter: times a chunk waited for a send credit (receiver backpressure), labels
/// `transport`, `device` (RDMA only).
pub const CREDIT_STALLS: &str = "bx_credit_stalls_total";
/// Counter: times a chunk waited because the QP or device window was full (RDMA only).
pub const WINDOW_STALLS: &str = "bx_window_stalls_total";
/// Counter: SENDs the send path's admission gates held back, by gate (RDMA only), labels
/// `transport`, `device`, `gate` (`sq_slot`, `cq_entry`, `send_buf`, `credit`, `qp_window`,
/// `device_window`, and `read_depth` for a rendezvous READ: `byteexpress_flow::gate`, checked in that order, the first that refuses
/// counted). `credit` counts what [`CREDIT_STALLS`] counts, `qp_window` and `device_window`
/// together what [`WINDOW_STALLS`] counts.
pub const GATE_REFUSALS: &str = "bx_send_gate_refusals_total";
/// Gauge: the QP window's cap in bytes (RDMA only; `u64::MAX` shown as +Inf is avoided: an
/// unlimited window reports 0).
pub const WINDOW_CAP: &str = "bx_window_cap_bytes";
/// Counter: bytes sent on links (wire bytes: header, metadata and body of each message or
/// chunk), labels `transport`, `device`.
pub const BYTES_SENT: &str = "bx_bytes_sent_total";
/// Counter: bytes received on links, same labels.
pub const BYTES_RECEIVED: &str = "bx_bytes_received_total";
/// Counter: data SENDs posted (one per chunk), RDMA only.
pub const CHUNKS_SENT: &str = "bx_chunks_sent_total";
/// Counter: messages received in more than one chunk and reassembled, RDMA only.
pub const MESSAGES_REASSEMBLED: &str = "bx_messages_reassembled_total";

/// Counter: endpoints of a replica set ejected by outlier detection (gRPC A50, or consecutive
/// failures), label `reason` (`success_rate`, `failure_percentage`, `consecutive_failures`).
pub const ENDPOINT_EJECTIONS: &str = "bx_endpoint_ejections_total";
/// Counter: ejected endpoints re-admitted after their ejection time.
pub const ENDPOINT_READMISSIONS: &str = "bx_endpoint_readmissions_total";
/// Counter: connections a server closed on accept for its connection caps
/// (`Config::max_connections`, `Config::max_connections_per_addr`).
pub const CONNECTIONS_REFUSED: &str = "bx_connections_refused_total";
/// Counter: accept errors a server survived (EMFILE, ENFILE, ENOMEM, ECONNABORTED, ...).
pub const ACCEPT_ERRORS: &str = "bx_accept_errors_total";
/// Counter: retries a `retryPolicy` made (gRPC A6), label `method`.
pub const RETRIES: &str = "bx_client_retries_total";
/// Counter: hedged attempts after the first that a `hedgingPolicy` started, label `method`.
pub const HEDGES: &str = "bx_client_hedges_total";
/// Counter: retries or hedges not started because retry throttling had too few tokens,
/// label `method`.
pub const RETRIES_THROTTLED: &str = "bx_client_retries_throttled_total";
/// Counter: transparent retries (an attempt that never left the client, or that a server
/// refused before dispatch), label `method`.
pub const TRANSPARENT_RETRIES: &str = "bx_client_transparent_retries_total";
/// Counter: calls of a method with a retry or hedging policy that committed to an attempt,
/// labels `method`, `reason` (`response`: its answer, headers or first message arrived;
/// `buffer_limit`: a stream's replay buffer passed the per-RPC limit).
pub const RETRY_COMMITS: &str = "bx_client_retry_commits_total";
/// Counter: calls a server refused before dispatch (no handler ran; the RESPONSE carries the
/// refused mark), label `reason` (`draining`, `concurrency_limit`, `memory_budget`).
pub const CALLS_REFUSED: &str = "bx_server_calls_refused_total";
/// Counter: transitions of a link's state machine (`crate::LinkState`), labels `from`, `to`
/// (state names: `hello`, `qp_handshake`, `rdma`, `tcp`, `fallback_tcp`, `reprobe`, `closed`).
pub const LINK_TRANSITIONS: &str = "bx_link_transitions_total";
/// Counter: messages re-sent over TCP after an RDMA→TCP fallback because the peer's resync said
/// they were never delivered.
pub const MESSAGES_RESENT: &str = "bx_messages_resent_total";

/// Every metric name this crate records, for documentation checks and scrapers.
pub const NAMES: &[&str] = &[
    LINKS_OPENED,
    LINKS_CLOSED,
    LINKS_OPEN,
    CALLS,
    CALL_SECONDS,
    CREDIT_STALLS,
    WINDOW_STALLS,
    GATE_REFUSALS,
    WINDOW_CAP,
    BYTES_SENT,
    BYTES_RECEIVED,
    CHUNKS_SENT,
    MESSAGES_REASSEMBLED,
    ENDPOINT_EJECTIONS,
    ENDPOINT_READMISSIONS,
    CONNECTIONS_REFUSED,
    ACCEPT_ERRORS,
    RETRIES,
    HEDGES,
    RETRIES_THROTTLED,
    TRANSPARENT_RETRIES,
    RETRY_COMMITS,
    CALLS_REFUSED,
    LINK_TRANSITIONS,
    MESSAGES_RESENT,
];

/// Which end of a call records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The caller ([`crate::Client::call`], or a stream's [`crate::stream::ResponseReceiver`]).
    Client,
    /// The server that ran the handler.
    Server,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Server => "server",
        }
    }
}

/// Records one finished call: [`CALLS`] and [`CALL_SECONDS`]. `method` is the gRPC path;
/// the caller passes `"unknown"` for a path no service answered. Costs two small allocations
/// (the method label) and the recorder's key lookups; nothing more without a recorder. The
/// handles are not kept between calls: a recorder that expires idle series (an exporter's
/// idle timeout) or one installed later, or a thread's local recorder, gets every call.
pub fn record_call(side: Side, method: &str, code: Code, elapsed: Duration) {
    metrics::histogram!(CALL_SECONDS, "side" => side.label(), "method" => method.to_owned())
        .record(elapsed.as_secs_f64());
    metrics::counter!(
        CALLS,
        "side" => side.label(),
        "method" => method.to_owned(),
        "code" => code_name(code)
    )
    .increment(1);
}

/// Records one finished client call from its result (every attempt and wait included in
/// `started`'s elapsed time): [`record_call`] with the result's code.
pub(crate) fn record_client_call<T>(
    method: &str,
    res: &Result<T, crate::Status>,
    started: std::time::Instant,
) {
    let code = res.as_ref().map_or_else(|s| s.code, |_| Code::Ok);
    record_call(Side::Client, method, code, started.elapsed());
}

/// Records one transition of a link's state machine ([`LINK_TRANSITIONS`]).
pub(crate) fn link_transition(side: &'static str, from: &'static str, to: &'static str) {
    metrics::counter!(LINK_TRANSITIONS, "side" => side, "from" => from, "to" => to).increment(1);
}

/// Records `n` messages re-sent over TCP after a fallback ([`MESSAGES_RESENT`]).
pub(crate) fn messages_resent(n: u64) {
    metrics::counter!(MESSAGES_RESENT).increment(n);
}

/// The code's name as the gRPC spec spells it in `doc/statuscodes.md`, in CamelCase
/// (`Ok`, `DeadlineExceeded`): a static label value.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "Ok",
        Code::Cancelled => "Cancelled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// The handles of one link, registered at set-up with its `transport` and `device` labels.
#[derive(Debug)]
pub(crate) struct LinkMetrics {
    pub credit_stalls: Counter,
    pub window_stalls: Counter,
    /// [`GATE_REFUSALS`], indexed by `Gate::index`.
    pub gate_refusals: [Counter; 7],
    pub window_cap: Gauge,
    pub bytes_sent: Counter,
    pub bytes_received: Counter,
    pub chunks_sent: Counter,
    pub messages_reassembled: Counter,
    closed: Counter,
    open: Gauge,
}

impl Default for LinkMetrics {
    /// Handles that record nothing (a link built outside set-up, e.g. in unit tests).
    fn default() -> Self {
        LinkMetrics {
            credit_stalls: Counter::noop(),
            window_stalls: Counter::noop(),
            gate_refusals: std::array::from_fn(|_| Counter::noop()),
            window_cap: Gauge::noop(),
            bytes_sent: Counter::noop(),
            bytes_received: Counter::noop(),
            chunks_sent: Counter::noop(),
            messages_reassembled: Counter::noop(),
            closed: Counter::noop(),
            open: Gauge::noop(),
        }
    }
}

impl LinkMetrics {
    /// Registers the handles of a link on `transport` and counts it as opened.
    pub(crate) fn link_up(transport: Transport) -> Self {
        let labels = [
            ("transport", transport.kind().to_string()),
            ("device", transport.device().unwrap_or("-").to_string()),
        ];
        metrics::counter!(LINKS_OPENED, &labels).increment(1);
        let m = LinkMetrics {
            credit_stalls: metrics::counter!(CREDIT_STALLS, &labels),
            window_stalls: metrics::counter!(WINDOW_STALLS, &labels),
            gate_refusals: Gate::ALL.map(|g| {
                let [t, d] = labels.clone();
                metrics::counter!(GATE_REFUSALS, &[t, d, ("gate", g.name().to_string())])
            }),
            window_cap: metrics::gauge!(WINDOW_CAP, &labels),
            bytes_sent: metrics::counter!(BYTES_SENT, &labels),
            bytes_received: metrics::counter!(BYTES_RECEIVED, &labels),
            chunks_sent: metrics::counter!(CHUNKS_SENT, &labels),
            messages_reassembled: metrics::counter!(MESSAGES_REASSEMBLED, &labels),
            closed: metrics::counter!(LINKS_CLOSED, &labels),
            open: metrics::gauge!(LINKS_OPEN, &labels),
        };
        m.open.increment(1.0);
        m
    }

    /// Counts the link as closed (called once, when its engine ends it).
    pub(crate) fn link_down(&self) {
        self.closed.increment(1);
        self.open.decrement(1.0);
    }

    /// Sets [`WINDOW_CAP`]; an unlimited window (`u64::MAX`) is reported as 0.
    pub(crate) fn set_window_cap(&self, cap: u64) {
        self.window_cap
            .set(if cap == u64::MAX { 0.0 } else { cap as f64 });
    }
}
