//! The server: runs a [`Service`] for every call of every link, enforcing deadlines and
//! cancelling handlers whose client gave up.

use foldhash::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use byteexpress_tcp_fallback::{FrameConfig, FrameWriter};
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::task::AbortHandle;

use crate::accept::ConnSlot;
use crate::budget::MemoryBudget;
use crate::engine::{Dispatch, LinkTx};
use crate::link_io::LinkStream;
use crate::message::{Incoming, Outgoing};
use crate::wire::CONN_MAGIC;
use crate::wire::header::Kind;
use crate::{Code, Config, Metadata, Response, Status, Transport};

/// A call as the server's handler sees it.
#[derive(Debug, Clone)]
pub struct ServerRequest {
    /// Method path.
    pub method: String,
    /// Request metadata.
    pub metadata: Metadata,
    /// Request message; on RDMA, when the request fit one chunk, a slice of the registered
    /// receive buffer (zero copy), else a buffer it was reassembled into (one copy).
    pub body: Bytes,
    /// When the client gives up (from its `timeout_us`); the handler is cancelled then.
    pub deadline: Option<tokio::time::Instant>,
    /// Transport of the link the call came on.
    pub transport: Transport,
    /// The client's logical connection on that link (its `conn_id`); unique per link only.
    pub conn_id: u32,
    /// Test-only faults of the link the call came on (feature `test-hooks`): how a test
    /// server's named control RPC reaches its own link.
    #[cfg(feature = "test-hooks")]
    pub link_faults: crate::test_hooks::LinkFaults,
}

/// Boxed future of a handler.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a server runs for each call. Implemented for every `Fn(ServerRequest) -> impl Future`.
/// The future is dropped (cancelled) when the deadline passes, the client cancels, or the link
/// fails.
pub trait Service: Send + Sync + 'static {
    /// Handles one call.
    fn call(&self, req: ServerRequest) -> BoxFuture<Result<Response, Status>>;
}

impl<F, Fut> Service for F
where
    F: Fn(ServerRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Response, Status>> + Send + 'static,
{
    fn call(&self, req: ServerRequest) -> BoxFuture<Result<Response, Status>> {
        Box::pin(self(req))
    }
}

/// A server's draining switch, shared by every link of the server (and by whoever holds a
/// clone): [`Drain::start`] makes the server refuse every new call and stream **before
/// dispatch** (UNAVAILABLE "server is draining", marked refused on the wire so that clients
/// retry it transparently on another replica: `crate::retry`), while the calls already running
/// go on to their end; [`Drain::drained`] resolves when none is left. Links stay up (a
/// client's next call on them is refused the same way); stop accepting by dropping the
/// [`Server::serve`] future. As gRPC servers' `GracefulStop` minus the GOAWAY.
#[derive(Debug, Clone, Default)]
pub struct Drain {
    inner: Arc<DrainState>,
}

#[derive(Debug, Default)]
struct DrainState {
    draining: std::sync::atomic::AtomicBool,
    in_flight: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

impl Drain {
    /// A switch, off.
    pub fn new() -> Drain {
        Drain::default()
    }

    /// Starts draining: from now on new calls and streams are refused before dispatch.
    pub fn start(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
        tracing::info!("server draining: new calls are refused before dispatch");
        self.inner.idle.notify_waiters();
    }

    /// Whether [`Drain::start`] was called.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::SeqCst)
    }

    /// Handlers (calls and streams) running now on every link of the server.
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::SeqCst)
    }

    /// Resolves once draining has started and no handler is running.
    pub async fn drained(&self) {
        loop {
            let idle = self.inner.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.is_draining() && self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }

    fn enter(&self) -> InFlight {
        self.inner.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.inner.clone())
    }
}

/// One running handler, counted in its server's [`Drain`].
struct InFlight(Arc<DrainState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Serves one [`Service`] on TCP listeners; every connection becomes a link (RDMA or TCP as the
/// client negotiates).
#[derive(Clone)]
pub struct Server {
    service: Arc<dyn Service>,
    cfg: Config,
    /// [`Config::memory_budget`], shared by all links of this server.
    budget: MemoryBudget,
    /// The handler of streams ([`Server::with_streams`]); without one, a stream is answered
    /// UNIMPLEMENTED.
    streams: Option<Arc<dyn crate::stream::StreamService>>,
    drain: Drain,
    /// TLS before the preface ([`Server::with_tls`]); `None`: plain TCP.
    #[cfg(feature = "tls")]
    tls: Option<crate::tls::TlsAcceptor>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("cfg", &self.cfg).finish()
    }
}

impl Server {
    /// A server of `service` with `cfg` (its `transport` pins what the server accepts).
    pub fn new(service: impl Service, cfg: Config) -> Self {
        Server {
            service: Arc::new(service),
            budget: MemoryBudget::new(cfg.memory_budget),
            cfg,
            streams: None,
            drain: Drain::new(),
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// Speaks TLS first on every connection [`Server::serve`] accepts (feature `tls`): the
    /// handshake, offering ALPN [`ALPN_BXRPC`](crate::tls::ALPN_BXRPC), must finish within
    /// [`Config::detect_timeout`]; then the preface, set-up and the link's TCP frames go
    /// inside the session. A connection whose handshake fails is closed having been sent
    /// nothing but TLS records. Certificate files that change on disk are used for new
    /// connections ([`crate::tls`]). Errors: `cfg`'s material does not load.
    #[cfg(feature = "tls")]
    pub fn with_tls(mut self, cfg: crate::tls::ServerTlsConfig) -> Result<Self, crate::TlsError> {
        self.tls = Some(cfg.acceptor(&[crate::tls::ALPN_BXRPC])?);
        Ok(self)
    }

    /// Uses `drain` as this server's draining switch (e.g. one the caller keeps to drain the
    /// server on SIGTERM); each server has one of its own otherwise ([`Server::drain`]).
    pub fn with_drain(mut self, drain: Drain) -> Self {
        self.drain = drain;
        self
    }

    /// This server's draining switch ([`Drain`]): `server.drain().start()` stops dispatching
    /// new calls and lets running ones finish.
    pub fn drain(&self) -> Drain {
        self.drain.clone()
    }

    /// Serves streams (client, server and bidirectional streaming: [`crate::stream`]) with
    /// `svc`, beside the unary calls of the service given to [`Server::new`].
    pub fn with_streams(mut self, svc: impl crate::stream::StreamService) -> Self {
        self.streams = Some(Arc::new(svc));
        self
    }

    /// Accepts connections for as long as the process runs: accept errors (EMFILE, ENFILE,
    /// ENOMEM, ECONNABORTED, ...) are logged at most once a second and retried, and the
    /// connection caps of the [`Config`] apply ([`crate::accept::Acceptor`]). Returns only if
    /// the future is dropped, or at once with `InvalidInput` when the config fails
    /// [`Config::validate`].
    pub async fn serve(self, listener: TcpListener) -> std::io::Result<()> {
        self.cfg
            .validate()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let mut acceptor = crate::accept::Acceptor::new(listener, &self.cfg);
        loop {
            let (stream, peer, slot) = acceptor.accept().await;
            let this = self.clone();
            tokio::spawn(async move {
                let _ = stream.set_nodelay(true);
                #[cfg(feature = "tls")]
                let stream = match &this.tls {
                    None => LinkStream::from(stream),
                    Some(tls) => {
                        match tokio::time::timeout(this.cfg.detect_timeout, tls.accept(stream))
                            .await
                        {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::info!(%peer, error = %crate::tls::chain(&e), "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                tracing::info!(%peer, "no TLS handshake within the detect timeout");
                                return;
                            }
                        }
                    }
                };
                #[cfg(not(feature = "tls"))]
                let stream = LinkStream::from(stream);
                if let Err(e) = this.serve_connection_held(stream, Some(slot)).await {
                    tracing::info!(%peer, "connection ended: {e}");
                }
            });
        }
    }

    /// Serves one connection: checks the ByteExpress [`CONN_MAGIC`] (anything else gets an ERROR
    /// message and a close; nothing within [`Config::detect_timeout`], a close), then runs
    /// set-up and the link.
    /// The stream is a plain TCP connection or a TLS session whose handshake is done
    /// ([`LinkStream`]). On a server configured [`Server::with_tls`] a plain TCP stream is
    /// refused (closed with nothing sent, logged; PERMISSION_DENIED): the handshake is the
    /// caller's (or [`Server::serve`]'s), and a link without it would be unencrypted.
    pub async fn serve_connection(&self, stream: impl Into<LinkStream>) -> Result<(), Status> {
        let stream = stream.into();
        self.refuse_plain_under_tls(&stream)?;
        self.serve_connection_held(stream, None).await
    }

    /// Errors (PERMISSION_DENIED, logged) when this server is configured with TLS and
    /// `stream` is plain TCP; the caller drops the stream, which closes it.
    fn refuse_plain_under_tls(&self, stream: &LinkStream) -> Result<(), Status> {
        #[cfg(feature = "tls")]
        if self.tls.is_some() && !stream.is_tls() {
            tracing::warn!(
                peer = ?stream.peer_addr().ok(),
                "a plain TCP stream handed to a server configured with TLS: closed"
            );
            return Err(Status::new(
                Code::PermissionDenied,
                "this server requires TLS: a plain TCP stream is not served",
            ));
        }
        #[cfg(not(feature = "tls"))]
        let _ = stream;
        Ok(())
    }

    /// [`Server::serve_connection`], holding `slot` (its place under the connection caps)
    /// until the connection closes.
    async fn serve_connection_held(
        &self,
        mut stream: LinkStream,
        slot: Option<ConnSlot>,
    ) -> Result<(), Status> {
        let mut magic = [0u8; 8];
        match tokio::time::timeout(self.cfg.detect_timeout, stream.read_exact(&mut magic)).await {
            Ok(Ok(_)) if magic == CONN_MAGIC => self.serve_after_magic_held(stream, slot).await,
            Ok(Ok(_)) => {
                let why = Status::new(Code::Unavailable, "not a ByteExpress connection");
                reject(&mut stream, &why).await;
                Err(why)
            }
            Ok(Err(e)) => Err(Status::new(Code::Unavailable, e.to_string())),
            Err(_) => Err(Status::new(Code::DeadlineExceeded, "no connection preface")),
        }
    }

    /// Serves a connection whose first 8 bytes were [`CONN_MAGIC`] and have been read (for
    /// front ends that tell protocols apart by the first bytes). A plain TCP stream on a server
    /// configured with TLS is refused as by [`Server::serve_connection`].
    pub async fn serve_after_magic(&self, stream: impl Into<LinkStream>) -> Result<(), Status> {
        let stream = stream.into();
        self.refuse_plain_under_tls(&stream)?;
        self.serve_after_magic_held(stream, None).await
    }

    /// [`Server::serve_after_magic`], holding `slot` (the connection's place under the caps of
    /// an [`Acceptor`](crate::accept::Acceptor)) for as long as the link lives. `stream` is
    /// plain TCP or a TLS session ([`LinkStream`]; feature `tls`); plain TCP on a server
    /// configured with TLS is refused as by [`Server::serve_connection`].
    pub async fn serve_after_magic_held(
        &self,
        stream: LinkStream,
        slot: Option<ConnSlot>,
    ) -> Result<(), Status> {
        self.refuse_plain_under_tls(&stream)?;
        let dispatch = Arc::new(Handlers {
            service: self.service.clone(),
            running: Arc::default(),
            max_calls: self.cfg.max_concurrent_calls.max(1) as usize,
            budget: self.budget.clone(),
            _slot: slot,
            stream_service: self.streams.clone(),
            streams: Arc::default(),
            stream_window: self.cfg.stream_window.max(1),
            peer_stream_window: AtomicU64::new(self.cfg.stream_window.max(1)),
            drain: self.drain.clone(),
        });
        let link = crate::setup::accept(stream, &self.cfg, dispatch).await?;
        tracing::debug!(transport = %link.transport(), "link accepted");
        Ok(())
    }
}

/// Writes an ERROR message frame and closes.
async fn reject(stream: &mut LinkStream, why: &Status) {
    let err = Outgoing::status(
        Kind::Error,
        0,
        0,
        why.code,
        &why.message,
        &Metadata::new(),
        Bytes::new(),
    );
    let mut w = FrameWriter::new(stream, FrameConfig::default());
    let _ = w
        .close_with_frame(&[&err.final_header().encode(), &err.meta])
        .await;
}

/// The handlers running on one link, by (conn_id, call_id).
struct Handlers {
    service: Arc<dyn Service>,
    running: Arc<Mutex<HashMap<(u32, u64), AbortHandle>>>,
    /// [`Config::max_concurrent_calls`]: more handlers than this on the link are refused.
    max_calls: usize,
    budget: MemoryBudget,
    /// The connection's place under the connection caps, freed when the link's engine drops
    /// its dispatch (the link is gone).
    _slot: Option<ConnSlot>,
    stream_service: Option<Arc<dyn crate::stream::StreamService>>,
    streams: Arc<crate::stream::server::ServerStreams>,
    stream_window: u64,
    /// The client's per-stream receive window (HELLO's `stream_window`): our send window.
    peer_stream_window: AtomicU64,
    drain: Drain,
}

/// Refuses a call before dispatch ([`Outgoing::refused_before_dispatch`]), counted under
/// `bx_server_calls_refused_total{reason}`.
fn refuse_before_dispatch(
    link: &LinkTx,
    key: (u32, u64),
    code: Code,
    why: &str,
    reason: &'static str,
) {
    metrics::counter!(crate::metrics::CALLS_REFUSED, "reason" => reason).increment(1);
    tracing::debug!(?key, reason, "call refused before dispatch");
    let _ = link.send(Outgoing::refused_before_dispatch(key, code, why));
}

const DRAINING: &str = "server is draining";

impl Dispatch for Handlers {
    fn incoming(&self, link: &LinkTx, msg: Incoming) {
        let key = (msg.header.conn_id, msg.header.call_id);
        if self.streams.incoming(&msg, &self.budget) && msg.header.kind != Kind::Cancel {
            return;
        }
        match msg.header.kind {
            Kind::Request => self.start(link, key, msg),
            Kind::StreamOpen => self.start_stream(link, key, msg),
            Kind::Cancel => {
                if let Some(h) = self.running.lock().remove(&key) {
                    tracing::debug!(?key, "call cancelled by the client");
                    h.abort();
                }
            }
            k => tracing::debug!(kind = ?k, "server ignores a message that is not a request"),
        }
    }

    fn closed(&self, why: Status) {
        tracing::debug!(%why, "link closed; cancelling its handlers");
        for (_, h) in self.running.lock().drain() {
            h.abort();
        }
        self.streams.closed(&why);
    }

    fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    fn calls_in_flight(&self) -> usize {
        self.running.lock().len()
    }

    fn peer_stream_window(&self, bytes: u64) {
        self.peer_stream_window.store(bytes, Ordering::Relaxed);
    }

    fn refused(&self, link: &LinkTx, h: &crate::wire::header::Header, why: Status) {
        if self.streams.refused((h.conn_id, h.call_id), why.clone()) {
            return;
        }
        if h.kind == Kind::StreamOpen {
            // as the drain and concurrency refusals: the stream's early and later frames are
            // dropped, not held (charged to the budget) until the link closes
            self.streams.refused_open((h.conn_id, h.call_id));
        }
        if matches!(h.kind, Kind::Request | Kind::StreamOpen) {
            // refused unread: no handler ran
            refuse_before_dispatch(
                link,
                (h.conn_id, h.call_id),
                why.code,
                &why.message,
                "memory_budget",
            );
        }
    }
}

/// A peer opened a call or stream under the (conn_id, call_id) of one still running: a protocol
/// error of that peer (as HTTP/2's reuse of a stream id, RFC 9113 §5.1.1), which would
/// otherwise let it run handlers past `max_concurrent_calls` and orphan the earlier one. The
/// link is closed; it costs that peer only its own link and calls.
fn reused_call_id(link: &LinkTx, key: (u32, u64)) {
    tracing::warn!(
        ?key,
        "peer reused the call id of a running call: protocol error, link closed"
    );
    link.close();
}

impl Handlers {
    /// Refuses a call or stream before dispatch: the link runs `max_calls` handlers already.
    fn refuse_over_concurrency(&self, link: &LinkTx, key: (u32, u64)) {
        refuse_before_dispatch(
            link,
            key,
            Code::ResourceExhausted,
            &format!(
                "more than the {} concurrent calls this server runs per link",
                self.max_calls
            ),
            "concurrency_limit",
        );
    }

    /// Starts a stream's handler, counted as one call against the link's limit.
    fn start_stream(&self, link: &LinkTx, key: (u32, u64), msg: Incoming) {
        let refuse = |code: Code, why: String| {
            self.streams.refused_open(key);
            let _ = link.send(Outgoing::refusal(key, code, &why));
        };
        let Some(svc) = &self.stream_service else {
            return refuse(Code::Unimplemented, "this server serves no streams".into());
        };
        if self.drain.is_draining() {
            self.streams.refused_open(key);
            return refuse_before_dispatch(link, key, Code::Unavailable, DRAINING, "draining");
        }
        let mut map = self.running.lock();
        if map.contains_key(&key) {
            drop(map);
            return reused_call_id(link, key);
        }
        if map.len() >= self.max_calls {
            drop(map);
            self.streams.refused_open(key);
            return self.refuse_over_concurrency(link, key);
        }
        let running = self.running.clone();
        let counted = self.drain.enter();
        let on_end = move || {
            running.lock().remove(&key);
            drop(counted);
        };
        if let Some(h) = self.streams.start(
            link,
            msg,
            svc,
            (
                self.stream_window,
                self.peer_stream_window.load(Ordering::Relaxed),
            ),
            on_end,
        ) {
            map.insert(key, h);
        }
    }

    fn start(&self, link: &LinkTx, key: (u32, u64), msg: Incoming) {
        let (method, metadata) = match crate::wire::meta::decode(&msg.meta) {
            Ok(m) => m,
            Err(e) => {
                let _ = link.send(Outgoing::refusal(key, Code::Internal, &e.to_string()));
                return;
            }
        };
        let deadline = (msg.header.timeout_us > 0)
            .then(|| tokio::time::Instant::now() + Duration::from_micros(msg.header.timeout_us));
        let req = ServerRequest {
            method,
            metadata,
            body: msg.body,
            deadline,
            transport: link.transport(),
            conn_id: key.0,
            #[cfg(feature = "test-hooks")]
            link_faults: link.faults().clone(),
        };
        // Held across the check, spawn and insert, so the task's own removal (below) comes
        // after the insert.
        let mut map = self.running.lock();
        if map.contains_key(&key) {
            drop(map);
            return reused_call_id(link, key);
        }
        if map.len() >= self.max_calls {
            drop(map);
            return self.refuse_over_concurrency(link, key);
        }
        if self.drain.is_draining() {
            drop(map);
            return refuse_before_dispatch(link, key, Code::Unavailable, DRAINING, "draining");
        }
        let fut = self.service.call(req);
        let link = link.clone();
        let running = self.running.clone();
        let counted = self.drain.enter();
        let handle = tokio::spawn(async move {
            let _counted = counted;
            let result = match deadline {
                Some(d) => tokio::time::timeout_at(d, fut).await.unwrap_or_else(|_| {
                    Err(Status::new(
                        Code::DeadlineExceeded,
                        "deadline exceeded on the server",
                    ))
                }),
                None => fut.await,
            };
            // Off the count before the answer leaves, so the client's next call (sent when
            // this answer arrives) finds the place free.
            running.lock().remove(&key);
            let msg = match result {
                Ok(r) => Outgoing::new(Kind::Response, key.0, key.1, "", &r.metadata, r.body),
                Err(s) => Outgoing::status(
                    Kind::Response,
                    key.0,
                    key.1,
                    s.code,
                    &s.message,
                    &s.metadata,
                    Bytes::new(),
                ),
            };
            if let Err(e) = link.send(msg)
                && e.code == Code::ResourceExhausted
            {
                // the answer is larger than the peer accepts: tell the client so
                let _ = link.send(Outgoing::refusal(key, e.code, &e.message));
            }
        });
        map.insert(key, handle.abort_handle());
    }
}

#[cfg(test)]
mod budget_refusal_tests {
    use super::*;
    use crate::wire::header::Header;

    fn handlers(budget: usize) -> Handlers {
        let svc = |_req: ServerRequest| async { Ok::<_, Status>(Response::default()) };
        Handlers {
            service: Arc::new(svc),
            running: Arc::default(),
            max_calls: 8,
            budget: MemoryBudget::new(budget),
            _slot: None,
            stream_service: None,
            streams: Arc::default(),
            stream_window: 1 << 20,
            peer_stream_window: AtomicU64::new(1 << 20),
            drain: Drain::new(),
        }
    }

    /// Review of issue 19: a STREAM_OPEN refused unread for the memory budget must end the
    /// stream here as the drain and concurrency refusals do; its later STREAM_MESSAGE frames
    /// were kept as "early" frames charged to the budget until the link closed.
    #[test]
    fn a_stream_refused_for_budget_at_open_holds_none_of_its_later_frames() {
        let h = handlers(64 << 20);
        let (tx, _out) = tokio::sync::mpsc::unbounded_channel();
        let link = LinkTx::new(tx, Transport::Tcp, 16 << 20);
        let mut open = Header::new(Kind::StreamOpen);
        open.call_id = 7;
        let before = h.budget.used();
        h.refused(&link, &open, h.budget.refusal(128 << 20));
        for _ in 0..4 {
            let mut m = Header::new(Kind::StreamMessage);
            m.call_id = 7;
            h.incoming(
                &link,
                Incoming {
                    header: m,
                    meta: Bytes::new(),
                    body: Bytes::from(vec![0u8; 100_000]),
                },
            );
        }
        assert_eq!(
            h.budget.used(),
            before,
            "later frames of a stream refused at open are held against the memory budget"
        );
    }
}
