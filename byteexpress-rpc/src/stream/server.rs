//! The server's side of streams: [`StreamService`], [`RequestReceiver`], [`ResponseSender`],
//! and the dispatch of stream frames arriving on a server's link.

use foldhash::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::task::AbortHandle;

use super::Shared;
use crate::budget::{Charge, MemoryBudget};
use crate::engine::LinkTx;
use crate::message::{Incoming, Outgoing};
use crate::server::BoxFuture;
use crate::wire::header::{FLAG_AFTER_HEADERS, FLAG_END_STREAM, FLAG_MESSAGE, Kind};
use crate::{Code, Metadata, Status, Transport};

/// A stream as the server's handler sees it (the messages come through its
/// [`RequestReceiver`]).
#[derive(Debug, Clone)]
pub struct StreamRequest {
    /// Method path.
    pub method: String,
    /// Request metadata.
    pub metadata: Metadata,
    /// When the client gives up on the whole stream; the handler is dropped then.
    pub deadline: Option<tokio::time::Instant>,
    /// Transport of the link.
    pub transport: Transport,
    /// The stream's logical connection (`conn_id`): each stream has its own, so the link's
    /// scheduler shares the QP among streams; unique per link only.
    pub conn_id: u32,
}

/// What a server runs for each stream (`Server::with_streams`). Implemented for every
/// `Fn(StreamRequest, RequestReceiver, ResponseSender) -> impl Future`. The handler's result
/// ends the stream after the messages it sent: `Ok(trailers)` as status OK with those
/// trailers, or the error status with its metadata (gRPC trailers). The future is dropped
/// when the client cancels, the deadline passes or the link fails; it counts as one call
/// against `Config::max_concurrent_calls` while it runs.
pub trait StreamService: Send + Sync + 'static {
    /// Handles one stream.
    fn call(
        &self,
        req: StreamRequest,
        rx: RequestReceiver,
        tx: ResponseSender,
    ) -> BoxFuture<Result<Metadata, Status>>;
}

impl<F, Fut> StreamService for F
where
    F: Fn(StreamRequest, RequestReceiver, ResponseSender) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Metadata, Status>> + Send + 'static,
{
    fn call(
        &self,
        req: StreamRequest,
        rx: RequestReceiver,
        tx: ResponseSender,
    ) -> BoxFuture<Result<Metadata, Status>> {
        Box::pin(self(req, rx, tx))
    }
}

/// An open stream and its handler's abort handle.
type Entry = (Arc<Shared>, Option<AbortHandle>);

/// The streams open on one server link.
#[derive(Default)]
pub(crate) struct ServerStreams {
    map: Mutex<HashMap<(u32, u64), Entry>>,
    early: Mutex<Early>,
}

/// Frames of streams not open yet, and the streams that ended lately. On RDMA a one-chunk
/// frame (STREAM_MESSAGE, HALF_CLOSE, WINDOW_UPDATE) may overtake the chunks of its stream's
/// STREAM_OPEN (the sender's latency class, the receiver's deferred chunk copies): it waits
/// here for its STREAM_OPEN, within [`EARLY_BYTES`] per link. A frame of a stream that ended
/// (a client's late WINDOW_UPDATE or HALF_CLOSE) is dropped.
#[derive(Default)]
struct Early {
    /// Each frame with its charge on the server's memory budget, returned when it is taken.
    frames: HashMap<(u32, u64), Vec<(Incoming, Charge)>>,
    bytes: usize,
    ended: foldhash::HashSet<(u32, u64)>,
    ended_order: std::collections::VecDeque<(u32, u64)>,
}

/// Bytes of early frames a link holds at most (beyond, they are dropped and logged).
const EARLY_BYTES: usize = 4 << 20;
/// Ended streams a link remembers, to drop their late frames.
const ENDED_KEPT: usize = 4096;

impl Early {
    fn ended(&mut self, key: (u32, u64)) {
        if self.ended.insert(key) {
            self.ended_order.push_back(key);
            if self.ended_order.len() > ENDED_KEPT
                && let Some(old) = self.ended_order.pop_front()
            {
                self.ended.remove(&old);
            }
        }
    }
}

impl ServerStreams {
    /// Takes the frames of open streams (and CANCEL of one); false for anything else. A frame
    /// ahead of its STREAM_OPEN waits here, charged to `budget` (the server's
    /// [`Config::memory_budget`](crate::Config::memory_budget)); dropped when that is full.
    pub(crate) fn incoming(&self, msg: &Incoming, budget: &MemoryBudget) -> bool {
        let key = (msg.header.conn_id, msg.header.call_id);
        let Some(s) = self.map.lock().get(&key).map(|e| e.0.clone()) else {
            if !matches!(
                msg.header.kind,
                Kind::StreamMessage | Kind::HalfClose | Kind::WindowUpdate
            ) {
                return false;
            }
            let mut early = self.early.lock();
            let len = msg.body.len() + 64;
            if early.ended.contains(&key) {
                // late: the stream is gone
            } else if early.bytes + len > EARLY_BYTES {
                tracing::debug!(
                    ?key,
                    "stream frame ahead of its STREAM_OPEN dropped: too many"
                );
            } else if let Some(charge) = budget.try_take(len) {
                early.bytes += len;
                // copied out, so a frame waiting for its STREAM_OPEN never holds a receive
                // buffer of the link (zero-copy bodies are slices of registered buffers)
                let mut copy = msg.clone();
                copy.body = Bytes::copy_from_slice(&msg.body);
                early.frames.entry(key).or_default().push((copy, charge));
            } else {
                tracing::debug!(
                    ?key,
                    "stream frame ahead of its STREAM_OPEN dropped: memory budget full"
                );
            }
            return true;
        };
        self.apply(key, &s, msg)
    }

    /// Applies a frame of the open stream `s`.
    fn apply(&self, key: (u32, u64), s: &Arc<Shared>, msg: &Incoming) -> bool {
        let n = msg.header.timeout_us;
        match msg.header.kind {
            Kind::StreamMessage => {
                if let Err(why) = s.on_message(n, msg.body.clone()) {
                    self.reset(key, why, true);
                }
            }
            Kind::HalfClose => s.on_end(n, Ok(Metadata::new()), false),
            Kind::WindowUpdate => s.on_window_update(n),
            Kind::Cancel => {
                tracing::debug!(?key, "stream cancelled by the client");
                self.reset(
                    key,
                    Status::new(Code::Cancelled, "cancelled by the client"),
                    false,
                );
            }
            _ => return false,
        }
        true
    }

    /// Ends the stream `key` here: drops its handler, answers `why` when `answer`.
    fn reset(&self, key: (u32, u64), why: Status, answer: bool) {
        let Some((s, h)) = self.map.lock().remove(&key) else {
            return;
        };
        self.early.lock().ended(key);
        if let Some(h) = h {
            h.abort();
        }
        s.fail(why.clone());
        if answer {
            let mut o = Outgoing::refusal(key, why.code, &why.message);
            // after the messages already sent, and after the headers
            let st = s.st.lock();
            o.header.timeout_us = st.sent;
            if st.headers_sent {
                o.header.flags |= FLAG_AFTER_HEADERS;
            }
            drop(st);
            let _ = s.link.send(o);
        }
    }

    /// A frame of stream `key` was refused unread for want of budget: the stream ends with
    /// `why`. False when `key` is no open stream.
    pub(crate) fn refused(&self, key: (u32, u64), why: Status) -> bool {
        if !self.map.lock().contains_key(&key) {
            return false;
        }
        self.reset(key, why, true);
        true
    }

    /// The stream `key` was refused before it started: its early frames are dropped and its
    /// late ones will be.
    pub(crate) fn refused_open(&self, key: (u32, u64)) {
        let mut e = self.early.lock();
        if let Some(frames) = e.frames.remove(&key) {
            e.bytes -= frames.iter().map(|m| m.0.body.len() + 64).sum::<usize>();
        }
        e.ended(key);
    }

    pub(crate) fn closed(&self, why: &Status) {
        for (_, (s, h)) in self.map.lock().drain() {
            if let Some(h) = h {
                h.abort();
            }
            s.fail(why.clone());
        }
    }

    /// Starts the handler of the STREAM_OPEN `msg`, already counted by the caller.
    pub(crate) fn start(
        self: &Arc<Self>,
        link: &LinkTx,
        msg: Incoming,
        svc: &Arc<dyn StreamService>,
        (window, send_window): (u64, u64),
        on_end: impl FnOnce() + Send + 'static,
    ) -> Option<AbortHandle> {
        let key = (msg.header.conn_id, msg.header.call_id);
        let (method, metadata) = match crate::wire::meta::decode(&msg.meta) {
            Ok(m) => m,
            Err(e) => {
                drop(on_end); // nothing counted yet: the caller inserts only on Some
                self.refused_open(key);
                let _ = link.send(Outgoing::refusal(key, Code::Internal, &e.to_string()));
                return None;
            }
        };
        let deadline = (msg.header.timeout_us > 0)
            .then(|| tokio::time::Instant::now() + Duration::from_micros(msg.header.timeout_us));
        let s = Shared::new(link.clone(), key, window, send_window);
        if msg.header.flags & FLAG_MESSAGE != 0 {
            let _ = s.on_message(0, msg.body);
        }
        if msg.header.flags & FLAG_END_STREAM != 0 {
            let n = s.st.lock().next_seq;
            s.on_end(n, Ok(Metadata::new()), false);
        }
        let req = StreamRequest {
            method,
            metadata,
            deadline,
            transport: link.transport(),
            conn_id: key.0,
        };
        let mut map = self.map.lock();
        map.insert(key, (s.clone(), None));
        let early = {
            let mut e = self.early.lock();
            let frames = e.frames.remove(&key).unwrap_or_default();
            e.bytes -= frames.iter().map(|m| m.0.body.len() + 64).sum::<usize>();
            frames
        };
        for (m, _charge) in &early {
            let n = m.header.timeout_us;
            match m.header.kind {
                Kind::StreamMessage => {
                    if let Err(why) = s.on_message(n, m.body.clone()) {
                        map.remove(&key);
                        drop(map);
                        self.early.lock().ended(key);
                        let _ = link.send(Outgoing::refusal(key, why.code, &why.message));
                        return None;
                    }
                }
                Kind::HalfClose => s.on_end(n, Ok(Metadata::new()), false),
                Kind::WindowUpdate => s.on_window_update(n),
                _ => {}
            }
        }
        let fut = svc.call(
            req,
            RequestReceiver { s: s.clone() },
            ResponseSender { s: s.clone() },
        );
        let streams = self.clone();
        let on_end = OnDrop(Some(Box::new(on_end)));
        let handle = tokio::spawn(async move {
            let on_end = on_end;
            let result = match deadline {
                Some(d) => tokio::time::timeout_at(d, fut).await.unwrap_or_else(|_| {
                    Err(Status::new(
                        Code::DeadlineExceeded,
                        "deadline exceeded on the server",
                    ))
                }),
                None => fut.await,
            };
            let _ = streams.map.lock().remove(&key);
            streams.early.lock().ended(key);
            drop(on_end);
            let (sent, last, failed, after_headers) = {
                let mut st = s.st.lock();
                let after = if st.headers_sent {
                    FLAG_AFTER_HEADERS
                } else {
                    0
                };
                (st.sent, st.last.take(), st.failed.is_some(), after)
            };
            if failed {
                return;
            }
            s.fail(Status::new(Code::Cancelled, "the stream has ended"));
            let mut out = match result {
                Ok(trailers) => {
                    let mut o = Outgoing::new(
                        Kind::Response,
                        key.0,
                        key.1,
                        "",
                        &trailers,
                        last.clone().unwrap_or_default(),
                    );
                    if last.is_some() {
                        o.header.flags |= FLAG_MESSAGE;
                    }
                    o
                }
                Err(e) => Outgoing::status(
                    Kind::Response,
                    key.0,
                    key.1,
                    e.code,
                    &e.message,
                    &e.metadata,
                    Bytes::new(),
                ),
            };
            out.header.timeout_us = sent;
            out.header.flags |= after_headers;
            if let Err(e) = s.link.send(out) {
                let mut o = Outgoing::refusal(key, e.code, &e.message);
                o.header.timeout_us = sent;
                o.header.flags |= after_headers;
                let _ = s.link.send(o);
            }
        });
        if let Some(e) = map.get_mut(&key) {
            e.1 = Some(handle.abort_handle());
        }
        Some(handle.abort_handle())
    }
}

/// Runs its function when dropped (a handler's end, or its abort).
struct OnDrop(Option<Box<dyn FnOnce() + Send>>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// The server's receiving half of a stream: the client's messages in order, then the end of
/// its direction (half-close).
pub struct RequestReceiver {
    s: Arc<Shared>,
}

impl std::fmt::Debug for RequestReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestReceiver")
            .field("key", &self.s.key)
            .finish()
    }
}

impl RequestReceiver {
    /// The next message; `Ok(None)` once the client half-closed after its last one. Taking a
    /// message grants its bytes back to the client's window. Errors: CANCELLED (the client
    /// cancelled), UNAVAILABLE (the link closed), RESOURCE_EXHAUSTED (the client broke the
    /// window).
    pub async fn message(&mut self) -> Result<Option<Bytes>, Status> {
        self.s.next().await
    }
}

/// The server's sending half of a stream: initial metadata, then messages; the handler's
/// result is the trailers.
pub struct ResponseSender {
    s: Arc<Shared>,
}

impl std::fmt::Debug for ResponseSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseSender")
            .field("key", &self.s.key)
            .finish()
    }
}

impl ResponseSender {
    /// Sends the initial metadata now (gRPC's response headers), at most once; later calls do
    /// nothing. Without it the client sees empty headers.
    pub fn send_headers(&mut self, md: &Metadata) -> Result<(), Status> {
        let mut st = self.s.st.lock();
        if st.headers_sent {
            return Ok(());
        }
        if let Some(s) = &st.out_closed {
            return Err(s.clone());
        }
        st.headers_sent = true;
        let key = self.s.key;
        self.s.link.send(Outgoing::new(
            Kind::StreamHeaders,
            key.0,
            key.1,
            "",
            md,
            Bytes::new(),
        ))
    }

    /// Sends one message, waiting while the client's window is full (a client that does not
    /// read holds the handler here). Errors: CANCELLED once the client cancelled, UNAVAILABLE
    /// when the link closed, RESOURCE_EXHAUSTED above the link's `max_message`.
    pub async fn send(&mut self, msg: Bytes) -> Result<(), Status> {
        self.s.send(msg).await
    }

    /// Keeps `msg` to go as the last message, in the same frame as the trailers (a unary
    /// answer is then one frame).
    pub fn send_last(&mut self, msg: Bytes) {
        self.s.st.lock().last = Some(msg);
    }

    /// Whether [`ResponseSender::send_headers`] sent headers.
    pub fn headers_sent(&self) -> bool {
        self.s.st.lock().headers_sent
    }
}
