//! The client: unary calls over a shared link, with deadlines and cancellation.

use foldhash::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{Semaphore, oneshot};

use crate::budget::MemoryBudget;
use crate::engine::{Dispatch, LinkTx};
use crate::message::{Incoming, Outgoing};
use crate::retry::{AttemptError, AttemptInfo, Retrier, Stage};
use crate::wire::header::{FLAG_REFUSED, Kind};
use crate::{Code, Config, Metadata, Status, Transport};

/// A unary call.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// Method path, e.g. `/ps.ParameterServer/Pull`.
    pub method: String,
    /// Request metadata.
    pub metadata: Metadata,
    /// Request message (opaque bytes; the facade carries gRPC-framed protobuf).
    pub body: Bytes,
    /// Time allowed for the call; sent to the server (which enforces it too) as `timeout_us`.
    pub timeout: Option<Duration>,
}

/// A successful call's result.
#[derive(Debug, Clone, Default)]
pub struct Response {
    /// Response metadata.
    pub metadata: Metadata,
    /// Response message. On RDMA, when the answer fit one chunk, it is a slice of the
    /// registered receive buffer it arrived in (zero copy; the buffer returns to the pool when
    /// the last clone drops), else a buffer it was reassembled into (one copy).
    pub body: Bytes,
}

type CallKey = (u32, u64);
type Pending = oneshot::Sender<Result<Response, AttemptError>>;

/// The calls waiting on one link.
struct Calls {
    pending: Mutex<HashMap<CallKey, Pending>>,
    closed: Mutex<Option<Status>>,
    /// Woken when the link closes ([`Client::link_closed`]).
    gone: tokio::sync::Notify,
    budget: MemoryBudget,
    /// One permit per call the server runs at once on this link (HELLO_ACK's
    /// `max_concurrent_calls`, added once set-up is done); a call holds one from before it is
    /// sent until it is answered or given up. Closed with the link.
    slots: Arc<Semaphore>,
    /// Streams open on this link ([`crate::stream`]).
    streams: Arc<crate::stream::client::ClientStreams>,
    /// The server's per-stream receive window (HELLO_ACK's `stream_window`): our send window.
    peer_stream_window: AtomicU64,
}

impl Calls {
    fn new(cfg: &Config) -> Self {
        Calls {
            pending: Mutex::default(),
            closed: Mutex::default(),
            gone: tokio::sync::Notify::new(),
            budget: client_budget(cfg),
            slots: Arc::new(Semaphore::new(0)),
            streams: Arc::default(),
            peer_stream_window: AtomicU64::new(cfg.stream_window.max(1)),
        }
    }
}

/// The process's budget for answers in transit under `cfg.memory_budget`: one budget per
/// distinct [`Config::memory_budget`] value, shared by every client link set up with it. Each
/// client's own setting holds, whichever link of the process came first.
fn client_budget(cfg: &Config) -> MemoryBudget {
    static BUDGETS: std::sync::OnceLock<Mutex<HashMap<usize, MemoryBudget>>> =
        std::sync::OnceLock::new();
    BUDGETS
        .get_or_init(Default::default)
        .lock()
        .entry(cfg.memory_budget)
        .or_insert_with(|| MemoryBudget::new(cfg.memory_budget))
        .clone()
}

impl Dispatch for Calls {
    fn incoming(&self, _link: &LinkTx, msg: Incoming) {
        let Some(msg) = self.streams.incoming(msg) else {
            return;
        };
        if msg.header.kind != Kind::Response {
            tracing::debug!(kind = ?msg.header.kind, "client ignores a message that is not a response");
            return;
        }
        let key = (msg.header.conn_id, msg.header.call_id);
        let Some(tx) = self.pending.lock().remove(&key) else {
            return; // the call was given up (deadline, cancellation)
        };
        let refused = msg.header.flags & FLAG_REFUSED != 0;
        let _ = tx.send(decode_response(msg).map_err(|status| AttemptError {
            status,
            stage: if refused {
                Stage::Refused
            } else {
                Stage::Other
            },
        }));
    }

    fn closed(&self, why: Status) {
        *self.closed.lock() = Some(why.clone());
        self.gone.notify_waiters();
        self.slots.close();
        self.streams.closed(&why);
        let pending = std::mem::take(&mut *self.pending.lock());
        for (_, tx) in pending {
            // sent: the handler may have run
            let _ = tx.send(Err(AttemptError::other(why.clone())));
        }
    }

    fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    fn calls_in_flight(&self) -> usize {
        self.pending.lock().len() + self.streams.len()
    }

    fn peer_stream_window(&self, bytes: u64) {
        self.peer_stream_window.store(bytes, Ordering::Relaxed);
    }

    fn refused(&self, _link: &LinkTx, h: &crate::wire::header::Header, why: Status) {
        if self.streams.refused((h.conn_id, h.call_id), why.clone()) {
            return;
        }
        if h.kind == Kind::Response
            && let Some(tx) = self.pending.lock().remove(&(h.conn_id, h.call_id))
        {
            let _ = tx.send(Err(AttemptError::other(why)));
        }
    }
}

fn decode_response(msg: Incoming) -> Result<Response, Status> {
    let (message, metadata) = crate::wire::meta::decode(&msg.meta)
        .map_err(|e| Status::new(Code::Internal, e.to_string()))?;
    match Code::from_u16(msg.header.status) {
        Code::Ok => Ok(Response {
            metadata,
            body: msg.body,
        }),
        code => Err(Status::with_metadata(code, message, metadata)),
    }
}

struct ClientLink {
    tx: LinkTx,
    calls: Arc<Calls>,
    next_conn: AtomicU32,
    next_call: AtomicU64,
}

impl Drop for ClientLink {
    fn drop(&mut self) {
        self.tx.close();
    }
}

/// A logical connection to a server: its own connection id on a link shared with every other
/// [`Client`] of this process that reaches the same address with the same transport settings.
/// Cloning shares the connection.
///
/// When the link dies (server gone, QP error), calls waiting on it fail with UNAVAILABLE; the
/// next call sets up a new link (and connection id) and goes on, as tonic's own `Channel`
/// reconnects. A call is re-sent only as `crate::retry` allows: transparently when it never
/// left the client or the server refused it before dispatch, else as the attached
/// [`ServiceConfig`](crate::ServiceConfig)'s policy says ([`Client::with_service_config`]).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Conn>,
    retry: Arc<Retrier>,
}

struct Conn {
    addr: String,
    cfg: Config,
    /// The live link and this connection's id on it.
    current: Mutex<(Arc<ClientLink>, u32)>,
    /// Held while a new link is set up, so concurrent calls reconnect once.
    reconnecting: tokio::sync::Mutex<()>,
    /// Whether this connection's links come from the process registry (shared) or are its own.
    shared: bool,
    /// Test hook: sends still to fail before the wire ([`Client::fail_next_sends`]).
    #[cfg(feature = "test-hooks")]
    fail_sends: std::sync::atomic::AtomicU32,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("addr", &self.inner.addr)
            .field("conn_id", &self.inner.current.lock().1)
            .field("transport", &self.transport())
            .finish()
    }
}

/// A logical connection on the process's live link to `addr`, setting one up if needed.
async fn open_conn(
    addr: &str,
    cfg: &Config,
    shared: bool,
) -> Result<(Arc<ClientLink>, u32), Status> {
    if !shared {
        let link = new_link(addr, cfg).await?;
        let conn_id = link.next_conn.fetch_add(1, Ordering::Relaxed);
        return Ok((link, conn_id));
    }
    let key = format!(
        "{addr}|{:?}|{}|{}|{}|{}|{}|{}|{}|{:?}|{:?}|{:?}|{:?}|{}|{}|{}",
        cfg.transport,
        cfg.allow_soft,
        cfg.grant,
        cfg.recv_buf_size,
        cfg.max_send_wr,
        cfg.max_chunk,
        cfg.max_message,
        cfg.window_bytes,
        cfg.sched,
        cfg.window_target_delay,
        cfg.busy_poll,
        cfg.poll_wake_cost,
        cfg.memory_budget,
        cfg.rendezvous_threshold,
        cfg.rendezvous_cache_bytes
    );
    // links with another TLS config (or none) are other links
    #[cfg(feature = "tls")]
    let key = format!("{key}|tls={:?}", cfg.tls.as_ref().map(|t| t.registry_key()));
    let mut links = registry().lock().await;
    let link = match links.get(&key).and_then(Weak::upgrade) {
        Some(l) if !l.tx.is_closed() => l,
        _ => {
            let l = new_link(addr, cfg).await?;
            links.insert(key, Arc::downgrade(&l));
            l
        }
    };
    let conn_id = link.next_conn.fetch_add(1, Ordering::Relaxed);
    Ok((link, conn_id))
}

/// Sets up a new link to `addr` (HELLO, transport choice, QP handshake).
async fn new_link(addr: &str, cfg: &Config) -> Result<Arc<ClientLink>, Status> {
    let calls = Arc::new(Calls::new(cfg));
    let (tx, max_calls) = crate::setup::connect(addr, cfg, calls.clone()).await?;
    calls
        .slots
        .add_permits((max_calls as usize).min(Semaphore::MAX_PERMITS));
    tracing::debug!(addr, transport = %tx.transport(), max_calls, "link up");
    Ok(Arc::new(ClientLink {
        tx,
        calls,
        next_conn: AtomicU32::new(1),
        next_call: AtomicU64::new(1),
    }))
}

fn registry() -> &'static tokio::sync::Mutex<HashMap<String, Weak<ClientLink>>> {
    static LINKS: std::sync::OnceLock<tokio::sync::Mutex<HashMap<String, Weak<ClientLink>>>> =
        std::sync::OnceLock::new();
    LINKS.get_or_init(Default::default)
}

impl Client {
    /// Opens a logical connection to `addr` (`host:port`), reusing the process's live link to it
    /// or setting one up (HELLO, transport choice per `cfg.transport`, QP handshake).
    /// Errors: INVALID_ARGUMENT when `cfg` fails [`Config::validate`]; UNAVAILABLE when the
    /// server cannot be reached, refuses, or `BX_TRANSPORT=rdma`
    /// finds no RDMA path.
    pub async fn connect(addr: &str, cfg: &Config) -> Result<Client, Status> {
        Client::open(addr, cfg, true).await
    }

    /// Like [`Client::connect`], but on a link of this client's own, outside the process
    /// registry: every call of `connect_unshared` sets up a distinct link (its own TCP
    /// connection and QP), and so does every reconnection of the returned client. This is how
    /// a test gets several links to one server; a [`ReplicaSet`](crate::ReplicaSet) gives each
    /// endpoint one this way. Errors: as [`Client::connect`].
    pub async fn connect_unshared(addr: &str, cfg: &Config) -> Result<Client, Status> {
        Client::open(addr, cfg, false).await
    }

    async fn open(addr: &str, cfg: &Config, shared: bool) -> Result<Client, Status> {
        cfg.validate()
            .map_err(|e| Status::new(Code::InvalidArgument, e.to_string()))?;
        let current = open_conn(addr, cfg, shared).await?;
        Ok(Client {
            inner: Arc::new(Conn {
                addr: addr.to_string(),
                cfg: cfg.clone(),
                current: Mutex::new(current),
                reconnecting: tokio::sync::Mutex::new(()),
                shared,
                #[cfg(feature = "test-hooks")]
                fail_sends: std::sync::atomic::AtomicU32::new(0),
            }),
            retry: Arc::default(),
        })
    }

    /// This client (sharing its connection) with `sc` governing its calls: per-method
    /// timeout, retry or hedging policy, throttling (gRPC A6; `crate::retry` has the rule).
    /// Hedged and retried attempts of a single-address client all go to its one address. The
    /// throttle and [`Client::retry_stats`] are this client's own (clones made after share
    /// them). Errors: `sc` fails [`ServiceConfig::validate`](crate::ServiceConfig::validate).
    pub fn with_service_config(
        mut self,
        sc: crate::ServiceConfig,
    ) -> Result<Client, crate::ServiceConfigError> {
        self.retry = Arc::new(Retrier::new(sc)?);
        Ok(self)
    }

    /// Counters of retries, hedges, throttling, transparent retries and commits of this
    /// client's calls ([`RetryStats`](crate::RetryStats)).
    pub fn retry_stats(&self) -> crate::RetryStats {
        self.retry.stats()
    }

    pub(crate) fn retrier(&self) -> &Arc<Retrier> {
        &self.retry
    }

    /// Test hook (feature `test-hooks`): the next `n` calls or stream opens through this
    /// client (and its clones; no other client) fail to send, as a link that refuses the
    /// frame: nothing reaches the wire, and the attempt ends as "never left the client"
    /// (`crate::retry`, the rule's case 1).
    #[cfg(feature = "test-hooks")]
    pub fn fail_next_sends(&self, n: u32) {
        self.inner
            .fail_sends
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Takes one send failure of [`Client::fail_next_sends`], if any is left.
    pub(crate) fn hooked_send_failure(&self) -> Option<Status> {
        #[cfg(feature = "test-hooks")]
        {
            let left = &self.inner.fail_sends;
            if left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Some(Status::new(
                    Code::Unavailable,
                    "send failed before the wire (test hook)",
                ));
            }
        }
        None
    }

    /// Whether this connection's current link is closed (server gone, QP error); the next
    /// call would set up a new one.
    pub fn is_closed(&self) -> bool {
        let link = self.link();
        link.tx.is_closed() || link.calls.closed.lock().is_some()
    }

    /// Resolves when this connection's current link closes (at once if it is closed).
    pub async fn link_closed(&self) {
        let link = self.link();
        loop {
            let gone = link.calls.gone.notified();
            tokio::pin!(gone);
            gone.as_mut().enable();
            if link.tx.is_closed() || link.calls.closed.lock().is_some() {
                return;
            }
            gone.await;
        }
    }

    /// The live link and connection id, setting up a new link if the current one is closed.
    async fn current(&self) -> Result<(Arc<ClientLink>, u32), Status> {
        let cur = self.inner.current.lock().clone();
        if !cur.0.tx.is_closed() {
            return Ok(cur);
        }
        let _one = self.inner.reconnecting.lock().await;
        let cur = self.inner.current.lock().clone();
        if !cur.0.tx.is_closed() {
            return Ok(cur); // another call reconnected meanwhile
        }
        tracing::info!(addr = self.inner.addr, "link closed; reconnecting");
        let fresh = open_conn(&self.inner.addr, &self.inner.cfg, self.inner.shared).await?;
        *self.inner.current.lock() = fresh.clone();
        Ok(fresh)
    }

    fn link(&self) -> Arc<ClientLink> {
        self.inner.current.lock().0.clone()
    }

    /// The transport this connection's link negotiated, with the local device of an RDMA link
    /// (shown as `rdma(rxe0)`, `rdma(soft0)` or `tcp`; DESIGN.md 3.5 has the choice rule).
    pub fn transport(&self) -> Transport {
        self.link().tx.transport()
    }

    /// Largest request (40-byte header + metadata + body) the link carries, in bytes:
    /// [`Config::max_message`].
    pub fn max_message(&self) -> usize {
        self.link().tx.max_message()
    }

    /// Counters of this connection's link (shared by every [`Client`] on it): QP state and
    /// errors, credit and window waits, chunks, copies. See [`LinkStats`](crate::LinkStats).
    pub fn link_stats(&self) -> crate::LinkStats {
        self.link().tx.stats()
    }

    /// The test-only faults of this connection's link now (feature `test-hooks`): stall its
    /// receive re-posts, fail its QP ([`crate::test_hooks::LinkFaults`]).
    #[cfg(feature = "test-hooks")]
    pub fn link_faults(&self) -> crate::test_hooks::LinkFaults {
        self.link().tx.faults().clone()
    }

    /// Makes a unary call. A call beyond the server's concurrency limit on the link
    /// ([`Config::max_concurrent_calls`], announced at set-up) waits here first; that wait counts
    /// against `req.timeout`. Errors: the server's status; DEADLINE_EXCEEDED when `req.timeout`
    /// passes (the server is told to cancel the handler); UNAVAILABLE when the link fails;
    /// RESOURCE_EXHAUSTED when the request is larger than [`Client::max_message`]. Dropping
    /// the future cancels the call on the server too. The deadline bounds everything done for
    /// the call, setting up a new link included (DEADLINE_EXCEEDED when set-up outlasts it).
    pub async fn call(&self, req: Request) -> Result<Response, Status> {
        let t0 = std::time::Instant::now();
        let plan = self.retry.plan(&req.method, req.timeout, None);
        let res = self
            .retry
            .run(&req.method, plan.deadline, |info| {
                self.call_attempt(&req, info)
            })
            .await;
        crate::metrics::record_client_call(&req.method, &res, t0);
        res
    }

    /// One attempt of a call (`crate::retry`), classified by how far it got.
    pub(crate) async fn call_attempt(
        &self,
        req: &Request,
        info: AttemptInfo,
    ) -> Result<Response, AttemptError> {
        let deadline = info.deadline;
        let late = |what: &str| {
            AttemptError::other(Status::new(
                Code::DeadlineExceeded,
                format!("deadline exceeded {what}"),
            ))
        };
        let (link, conn_id) = match deadline {
            Some(d) => tokio::time::timeout_at(d, self.current())
                .await
                .map_err(|_| late("while setting up a link"))?,
            None => self.current().await,
        }
        .map_err(AttemptError::other)?;
        let link = &*link;
        if let Some(why) = link.calls.closed.lock().clone() {
            return Err(AttemptError::local(why));
        }
        // the deadline set at the start bounds the set-up above, the queueing below and the call
        let slot = link.calls.slots.clone().acquire_owned();
        let _slot = match deadline {
            Some(d) => tokio::time::timeout_at(d, slot)
                .await
                .map_err(|_| late("while queued behind the server's limit of concurrent calls"))?,
            None => slot.await,
        }
        .map_err(|_| {
            AttemptError::local(
                link.calls
                    .closed
                    .lock()
                    .clone()
                    .unwrap_or_else(|| Status::new(Code::Unavailable, "link closed")),
            )
        })?;
        let call_id = link.next_call.fetch_add(1, Ordering::Relaxed);
        let key = (conn_id, call_id);
        let mut out = Outgoing::new(
            Kind::Request,
            conn_id,
            call_id,
            &req.method,
            &info.metadata(&req.metadata),
            req.body.clone(),
        );
        if let Some(d) = deadline {
            // what is left after queueing
            let left = d.saturating_duration_since(tokio::time::Instant::now());
            out.header.timeout_us = (left.as_micros() as u64).max(1);
        }
        let (tx, rx) = oneshot::channel();
        link.calls.pending.lock().insert(key, tx);
        let mut guard = CancelOnDrop {
            link,
            key,
            armed: true,
        };
        let sent = match self.hooked_send_failure() {
            Some(e) => Err(e),
            None => link.tx.send(out),
        };
        if let Err(e) = sent {
            guard.armed = false;
            link.calls.pending.lock().remove(&key);
            // too large is final; anything else never left this process
            return Err(if e.code == Code::ResourceExhausted {
                AttemptError::other(e)
            } else {
                AttemptError::local(e)
            });
        }
        let res = match deadline {
            Some(d) => tokio::time::timeout_at(d, rx).await,
            None => Ok(rx.await),
        };
        match res {
            Ok(Ok(r)) => {
                guard.armed = false;
                r
            }
            Ok(Err(_)) => {
                guard.armed = false;
                Err(AttemptError::other(Status::new(
                    Code::Unavailable,
                    "link closed",
                )))
            }
            Err(_) => Err(late("")),
        }
    }
}

/// What a new stream needs of its client: the link, a logical connection of its own (a fresh
/// `conn_id`, so the scheduler shares the QP among streams), a call id and a place under the
/// server's concurrency limit (waited for within `timeout`).
pub(crate) struct StreamSlot {
    pub(crate) link: LinkTx,
    pub(crate) streams: Arc<crate::stream::client::ClientStreams>,
    pub(crate) key: CallKey,
    pub(crate) permit: tokio::sync::OwnedSemaphorePermit,
    /// Our receive window per stream (`Config::stream_window`), bytes.
    pub(crate) window: u64,
    /// The server's receive window per stream (HELLO_ACK's `stream_window`), bytes.
    pub(crate) send_window: u64,
}

impl Client {
    /// A link, call id and concurrency place for a new stream; the same waits and errors as
    /// [`Client::call`] before it sends.
    pub(crate) async fn stream_slot(
        &self,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<StreamSlot, AttemptError> {
        let late = || {
            AttemptError::other(Status::new(
                Code::DeadlineExceeded,
                "deadline exceeded before the stream opened",
            ))
        };
        let (link, conn_id) = match deadline {
            Some(d) => tokio::time::timeout_at(d, self.current())
                .await
                .map_err(|_| late())?,
            None => self.current().await,
        }
        .map_err(AttemptError::other)?;
        if let Some(why) = link.calls.closed.lock().clone() {
            return Err(AttemptError::local(why));
        }
        let slot = link.calls.slots.clone().acquire_owned();
        let permit = match deadline {
            Some(d) => tokio::time::timeout_at(d, slot).await.map_err(|_| late())?,
            None => slot.await,
        }
        .map_err(|_| AttemptError::local(Status::new(Code::Unavailable, "link closed")))?;
        let call_id = link.next_call.fetch_add(1, Ordering::Relaxed);
        // a stream is a logical connection of its own, so the link's scheduler shares the QP
        // among streams as among clients
        let _ = conn_id;
        let conn_id = link.next_conn.fetch_add(1, Ordering::Relaxed);
        Ok(StreamSlot {
            link: link.tx.clone(),
            streams: link.calls.streams.clone(),
            key: (conn_id, call_id),
            permit,
            window: self.inner.cfg.stream_window,
            send_window: link.calls.peer_stream_window.load(Ordering::Relaxed),
        })
    }
}

/// Forgets a call given up on and tells the server to cancel it.
struct CancelOnDrop<'a> {
    link: &'a ClientLink,
    key: CallKey,
    armed: bool,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed && self.link.calls.pending.lock().remove(&self.key).is_some() {
            let cancel = Outgoing::new(
                Kind::Cancel,
                self.key.0,
                self.key.1,
                "",
                &Metadata::new(),
                Bytes::new(),
            );
            let _ = self.link.tx.send(cancel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: the client budget was one per process, sized by the first link's
    /// `memory_budget`, so a client with a larger setting set up later (e.g. another test in
    /// the same process) had its answers over the first setting refused RESOURCE_EXHAUSTED.
    #[test]
    fn each_clients_memory_budget_holds_whichever_link_came_first() {
        let small = Config {
            memory_budget: (1 << 20) + 7,
            ..Config::default()
        };
        let large = Config {
            memory_budget: (32 << 20) + 7,
            ..Config::default()
        };
        assert_eq!(client_budget(&small).limit(), small.memory_budget);
        assert_eq!(client_budget(&large).limit(), large.memory_budget);
        // links with the same setting share one budget across the process
        let a = client_budget(&large);
        let b = client_budget(&large);
        let charge = a.try_take(1 << 20).expect("fits");
        assert!(b.used() >= 1 << 20, "one shared budget");
        drop(charge);
    }
}
