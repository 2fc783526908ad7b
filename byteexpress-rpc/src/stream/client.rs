//! The client's side of streams: [`Client::open_stream`], [`DirectSender`],
//! [`DirectReceiver`], and the dispatch of stream frames arriving on a client's link.

use foldhash::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;

use super::Shared;
pub use super::replay::{RequestSender, ResponseReceiver};
use crate::message::{Incoming, Outgoing};
use crate::retry::{AttemptError, AttemptInfo, Stage};
use crate::wire::header::{FLAG_AFTER_HEADERS, FLAG_END_STREAM, FLAG_MESSAGE, FLAG_REFUSED, Kind};
use crate::{Client, Code, Metadata, Status};

/// The streams open on one client link, by `(conn_id, call_id)`.
#[derive(Default)]
pub(crate) struct ClientStreams {
    map: Mutex<HashMap<(u32, u64), Arc<Shared>>>,
}

impl ClientStreams {
    /// Takes the frames of open streams; hands back any other message.
    pub(crate) fn incoming(&self, msg: Incoming) -> Option<Incoming> {
        let key = (msg.header.conn_id, msg.header.call_id);
        let Some(s) = self.map.lock().get(&key).cloned() else {
            return Some(msg);
        };
        let n = msg.header.timeout_us;
        if msg.header.flags & FLAG_AFTER_HEADERS != 0
            && matches!(msg.header.kind, Kind::StreamMessage | Kind::Response)
        {
            s.st.lock().headers_due = true;
        }
        match msg.header.kind {
            Kind::StreamHeaders => {
                let md = crate::wire::meta::decode(&msg.meta)
                    .map(|(_, md)| md)
                    .unwrap_or_default();
                s.st.lock().headers = Some(md);
                s.notify.notify_waiters();
            }
            Kind::StreamMessage => {
                if let Err(why) = s.on_message(n, msg.body) {
                    self.reset(&s, why);
                }
            }
            Kind::WindowUpdate => s.on_window_update(n),
            Kind::Response => {
                let end = match crate::wire::meta::decode(&msg.meta) {
                    Err(e) => Err(Status::new(Code::Internal, e.to_string())),
                    Ok((message, metadata)) => match Code::from_u16(msg.header.status) {
                        Code::Ok => Ok(metadata),
                        code => Err(Status::with_metadata(code, message, metadata)),
                    },
                };
                let mut count = n;
                if msg.header.flags & FLAG_REFUSED != 0 {
                    s.st.lock().refused = true;
                }
                if msg.header.flags & FLAG_MESSAGE != 0 {
                    if let Err(why) = s.on_message(n, msg.body) {
                        self.reset(&s, why);
                        return None;
                    }
                    count += 1;
                }
                s.on_end(count, end, true);
            }
            k => tracing::debug!(kind = ?k, "client ignores a stream frame of this kind"),
        }
        // Forgotten once the end and every message before it arrived (on RDMA a one-chunk
        // RESPONSE may overtake the last chunks of an earlier message).
        let complete = {
            let st = s.st.lock();
            st.failed.is_some()
                || (st.end_at.is_some_and(|e| st.next_seq >= e) && !st.awaiting_headers())
        };
        if complete {
            self.map.lock().remove(&key);
        }
        None
    }

    /// Fails `s` here and tells the server to cancel it.
    fn reset(&self, s: &Shared, why: Status) {
        self.map.lock().remove(&s.key);
        if s.fail(why) {
            let _ = s.link.send(cancel(s.key));
        }
    }

    /// A frame of stream `key` was refused unread for want of budget: the stream fails with
    /// `why` (the server is told to cancel). False when `key` is no stream.
    pub(crate) fn refused(&self, key: (u32, u64), why: Status) -> bool {
        let Some(s) = self.map.lock().get(&key).cloned() else {
            return false;
        };
        self.reset(&s, why);
        true
    }

    pub(crate) fn closed(&self, why: &Status) {
        for (_, s) in self.map.lock().drain() {
            s.fail(why.clone());
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }
}

fn cancel(key: (u32, u64)) -> Outgoing {
    Outgoing::new(
        Kind::Cancel,
        key.0,
        key.1,
        "",
        &Metadata::new(),
        Bytes::new(),
    )
}

/// What opens a stream ([`Client::open_stream`]).
#[derive(Debug, Clone, Default)]
pub struct OpenStream {
    /// Method path, e.g. `/grpc.health.v1.Health/Watch`.
    pub method: String,
    /// Request metadata (gRPC's request headers).
    pub metadata: Metadata,
    /// Time allowed for the whole stream (gRPC's deadline): sent to the server, which drops the
    /// handler then; the client's receiver fails DEADLINE_EXCEEDED then.
    pub timeout: Option<Duration>,
    /// A first message, sent with the opening frame.
    pub first: Option<Bytes>,
    /// Half-close with the opening frame: the client sends no message after `first`.
    pub half_close: bool,
}

impl Client {
    /// Opens a stream: client, server or bidirectional streaming as gRPC has them, over this
    /// connection's link. Returns the request direction's sender and the response direction's
    /// receiver; each message is sent as one frame as soon as the receiver's window
    /// (the server's [`Config::stream_window`](crate::Config::stream_window), announced in its
    /// HELLO_ACK) allows. The stream holds one
    /// place under the server's `max_concurrent_calls` until it ends (waited for here, within
    /// the timeout). Errors: as [`Client::call`] before sending (UNAVAILABLE,
    /// DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED for a first message above
    /// [`Client::max_message`]).
    ///
    /// With a [`ServiceConfig`](crate::ServiceConfig) attached
    /// ([`Client::with_service_config`]), a stream of a method with a policy is retried or
    /// hedged as a call until it commits, when the server's headers, first message or end
    /// arrive (`crate::retry`, "Streams"): a stream whose request is complete at open
    /// (`half_close`) is waited for here until then; any other returns at once, and its
    /// request messages are kept and sent to every attempt (replayed on a retry, sent to each
    /// hedged attempt) until the commit or A6's per-RPC buffer limit.
    pub async fn open_stream(
        &self,
        req: OpenStream,
    ) -> Result<(RequestSender, ResponseReceiver), Status> {
        let retry = self.retrier().clone();
        let plan = retry.plan(&req.method, req.timeout, None);
        if super::replay::replays(&retry, &req) {
            let c = self.clone();
            let r = req.clone();
            return Ok(super::replay::relayed(
                retry,
                req,
                plan.deadline,
                move |info| {
                    let (c, r) = (c.clone(), r.clone());
                    async move { c.open_stream_once(&r, info).await }
                },
            ));
        }
        let (tx, rx) = retry
            .run(&req.method, plan.deadline, |info| {
                let req = &req;
                async move {
                    let (tx, mut rx) = self.open_stream_once(req, info).await?;
                    if req.half_close {
                        rx.commit_point().await?;
                    }
                    Ok((tx, rx))
                }
            })
            .await?;
        Ok((RequestSender::direct(tx), ResponseReceiver::direct(rx)))
    }

    /// One attempt at opening a stream, until its opening frame is sent.
    pub(crate) async fn open_stream_once(
        &self,
        req: &OpenStream,
        info: AttemptInfo,
    ) -> Result<(DirectSender, DirectReceiver), AttemptError> {
        let t0 = std::time::Instant::now();
        let deadline = info.deadline;
        let slot = self.stream_slot(deadline).await?;
        let s = Shared::new(slot.link.clone(), slot.key, slot.window, slot.send_window);
        {
            let mut st = s.st.lock();
            st.permit = Some(slot.permit);
            if let Some(m) = &req.first {
                st.avail -= super::cost(m.len()) as i64;
                st.sent = 1;
            }
            if req.half_close {
                st.out_closed = Some(Status::new(
                    Code::FailedPrecondition,
                    "the stream is half-closed",
                ));
            }
        }
        let mut out = Outgoing::new(
            Kind::StreamOpen,
            slot.key.0,
            slot.key.1,
            &req.method,
            &info.metadata(&req.metadata),
            req.first.clone().unwrap_or_default(),
        );
        if req.first.is_some() {
            out.header.flags |= FLAG_MESSAGE;
        }
        if req.half_close {
            out.header.flags |= FLAG_END_STREAM;
        }
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(tokio::time::Instant::now());
            out.header.timeout_us = (left.as_micros() as u64).max(1);
        }
        slot.streams.map.lock().insert(slot.key, s.clone());
        let sent = match self.hooked_send_failure() {
            Some(e) => Err(e),
            None => slot.link.send(out),
        };
        if let Err(e) = sent {
            slot.streams.map.lock().remove(&slot.key);
            return Err(if e.code == Code::ResourceExhausted {
                AttemptError::other(e)
            } else {
                AttemptError::local(e)
            });
        }
        Ok((
            DirectSender {
                s: s.clone(),
                done: req.half_close,
            },
            DirectReceiver {
                s,
                streams: slot.streams,
                deadline,
                done: false,
                on_end: None,
                metric: Some((req.method.clone(), t0)),
            },
        ))
    }
}

/// The client's sending half of a stream (gRPC's request messages). Dropping it half-closes.
pub(crate) struct DirectSender {
    s: Arc<Shared>,
    done: bool,
}

impl std::fmt::Debug for DirectSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectSender")
            .field("key", &self.s.key)
            .finish()
    }
}

impl DirectSender {
    /// Sends one message, waiting while the server's window is full (a server that does not
    /// read holds the sender here). Errors: the stream's status once it ended or failed
    /// (CANCELLED after the server finished, DEADLINE_EXCEEDED, UNAVAILABLE when the link
    /// closed), RESOURCE_EXHAUSTED for a message above the link's `max_message`.
    pub async fn send(&mut self, msg: Bytes) -> Result<(), Status> {
        self.s.send(msg).await
    }

    /// Half-closes: the server's receiver sees the end after the messages sent before.
    pub fn finish(mut self) -> Result<(), Status> {
        self.done = true;
        self.s.send_end(Kind::HalfClose)
    }

    /// Resolves once sends would fail (the stream ended, failed or was cancelled).
    pub async fn closed(&self) {
        self.s.out_closed().await
    }
}

impl Drop for DirectSender {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.s.send_end(Kind::HalfClose);
        }
    }
}

/// The client's receiving half of a stream: initial metadata, the server's messages in order,
/// then its trailers or status. Dropping it before the end cancels the stream (the server's
/// handler is dropped), as gRPC's RST_STREAM(CANCEL).
pub(crate) struct DirectReceiver {
    s: Arc<Shared>,
    streams: Arc<ClientStreams>,
    deadline: Option<tokio::time::Instant>,
    done: bool,
    /// Told the stream's outcome once (a replica set's bookkeeping).
    on_end: Option<OnEnd>,
    /// The stream's method and start, until its outcome is recorded in the call metrics
    /// (`crate::metrics::record_call`, side `client`): once, at its end, failure or drop.
    metric: Option<(String, std::time::Instant)>,
}

/// What a [`DirectReceiver`] tells of its stream's outcome.
pub(crate) type OnEnd = Box<dyn FnOnce(Result<(), Status>) + Send>;

impl std::fmt::Debug for DirectReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectReceiver")
            .field("key", &self.s.key)
            .finish()
    }
}

impl DirectReceiver {
    async fn bounded<T>(&mut self, f: impl std::future::Future<Output = T>) -> Result<T, Status> {
        match self.deadline {
            None => Ok(f.await),
            Some(d) => match tokio::time::timeout_at(d, f).await {
                Ok(v) => Ok(v),
                Err(_) => {
                    let why = Status::new(Code::DeadlineExceeded, "deadline exceeded");
                    self.streams.reset(&self.s, why.clone());
                    self.done = true;
                    self.record(Code::DeadlineExceeded);
                    Err(why)
                }
            },
        }
    }

    /// The server's initial metadata: waits for it, or for the stream's end or first message
    /// (then empty: the server sent none; its status, if an error, comes from
    /// [`DirectReceiver::message`]). Errors: the stream failed here first (DEADLINE_EXCEEDED,
    /// UNAVAILABLE, CANCELLED).
    pub async fn headers(&mut self) -> Result<Metadata, Status> {
        let s = self.s.clone();
        self.bounded(async move {
            loop {
                let n = s.notify.notified();
                {
                    let st = s.st.lock();
                    if let Some(h) = &st.headers {
                        return Ok(h.clone());
                    }
                    if let Some(f) = &st.failed {
                        return Err(f.clone());
                    }
                    if !st.awaiting_headers() && (!st.queue.is_empty() || st.end.is_some()) {
                        return Ok(Metadata::new());
                    }
                }
                n.await;
            }
        })
        .await?
    }

    /// Waits for the stream's commit point (`crate::retry`): the server's headers, a message or
    /// its end. Errors: the stream ended with a failure before any header or message (then
    /// its outcome is recorded here), classified for the retry rule.
    pub(crate) async fn commit_point(&mut self) -> Result<(), AttemptError> {
        if let Err(e) = self.headers().await {
            self.ended(Err(e.clone()));
            return Err(AttemptError::other(e));
        }
        let refused = {
            let st = self.s.st.lock();
            if st.headers.is_some() || !st.queue.is_empty() || !matches!(st.end, Some(Err(_))) {
                return Ok(());
            }
            st.refused
        };
        let status = match self.message().await {
            Err(e) => e,
            Ok(_) => return Ok(()),
        };
        Err(AttemptError {
            status,
            stage: if refused {
                Stage::Refused
            } else {
                Stage::Other
            },
        })
    }

    /// Whether the server sent its initial metadata as such (STREAM_HEADERS); false when the
    /// stream ended with its only answer in the RESPONSE (a unary answer).
    pub fn headers_sent(&self) -> bool {
        self.s.st.lock().headers.is_some()
    }

    /// The next message; `Ok(None)` after the last one, when the server ended with OK (then
    /// [`DirectReceiver::trailers`]). Errors: the server's status after its messages, or
    /// this stream's failure (DEADLINE_EXCEEDED, UNAVAILABLE, RESOURCE_EXHAUSTED when the
    /// server broke the window).
    pub async fn message(&mut self) -> Result<Option<Bytes>, Status> {
        let s = self.s.clone();
        let r = self.bounded(async move { s.next().await }).await;
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                self.ended(Err(e.clone()));
                return Err(e);
            }
        };
        match &r {
            Ok(Some(_)) => {}
            Ok(None) => self.ended(Ok(())),
            Err(e) => self.ended(Err(e.clone())),
        }
        r
    }

    /// The trailers of a stream that ended OK (after [`DirectReceiver::message`] returned
    /// `Ok(None)`); `None` before.
    pub fn trailers(&self) -> Option<Metadata> {
        match &self.s.st.lock().end {
            Some(Ok(md)) => Some(md.clone()),
            _ => None,
        }
    }

    /// Sets what is told of the stream's outcome, once: at its end, its failure, or its
    /// cancellation (CANCELLED) when the receiver is dropped first.
    pub(crate) fn set_on_end(&mut self, f: OnEnd) {
        self.on_end = Some(f);
    }

    /// Records the stream's outcome in the call metrics, once.
    fn record(&mut self, code: Code) {
        if let Some((method, t0)) = self.metric.take() {
            crate::metrics::record_call(crate::metrics::Side::Client, &method, code, t0.elapsed());
        }
    }

    fn ended(&mut self, res: Result<(), Status>) {
        self.done = true;
        self.record(res.as_ref().map_or_else(|e| e.code, |_| Code::Ok));
        if let Some(f) = self.on_end.take() {
            f(res);
        }
    }

    /// Cancels the stream (the server's handler is dropped); as dropping the receiver.
    pub fn cancel(mut self) {
        self.cancel_now();
    }

    fn cancel_now(&mut self) {
        if !self.done {
            self.done = true;
            self.streams.reset(
                &self.s,
                Status::new(Code::Cancelled, "stream cancelled by the client"),
            );
        }
    }
}

impl Drop for DirectReceiver {
    fn drop(&mut self) {
        let end = self.s.st.lock().end.as_ref().map(|e| match e {
            Ok(_) => Code::Ok,
            Err(s) => s.code,
        });
        if end.is_none() {
            self.cancel_now();
        }
        self.record(end.unwrap_or(Code::Cancelled));
        if let Some(f) = self.on_end.take() {
            f(Err(Status::new(
                Code::Cancelled,
                "stream dropped before its end",
            )));
        }
    }
}
