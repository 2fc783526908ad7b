//! The public halves of a client stream ([`RequestSender`], [`ResponseReceiver`]), and the
//! replay of a request-streaming call under a retry policy (gRPC A6, "Streams" in
//! `crate::retry`): until the stream commits, its request messages are kept (up to
//! [`PER_RPC_BUFFER_LIMIT`](crate::retry::PER_RPC_BUFFER_LIMIT) bytes) and sent again on the
//! next attempt; the caller's halves talk to a task that runs the attempts.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::OpenStream;
use super::client::{DirectReceiver, DirectSender};
use crate::retry::{AttemptError, AttemptInfo, PER_RPC_BUFFER_LIMIT, Retrier};
use crate::{Code, Metadata, Status};

/// The client's sending half of a stream (gRPC's request messages). Dropping it half-closes.
pub struct RequestSender {
    inner: Send,
}

enum Send {
    Direct(DirectSender),
    /// To the task running the attempts of a replayed stream; dropping it half-closes.
    Relay(mpsc::Sender<Bytes>),
}

impl std::fmt::Debug for RequestSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Send::Direct(d) => d.fmt(f),
            Send::Relay(_) => f.write_str("RequestSender(replayed)"),
        }
    }
}

fn ended() -> Status {
    Status::new(Code::Cancelled, "the stream has ended")
}

impl RequestSender {
    pub(crate) fn direct(d: DirectSender) -> Self {
        RequestSender {
            inner: Send::Direct(d),
        }
    }

    /// Sends one message, waiting while the server's window is full (a server that does not
    /// read holds the sender here). Errors: the stream's status once it ended or failed
    /// (CANCELLED after the server finished, DEADLINE_EXCEEDED, UNAVAILABLE when the link
    /// closed), RESOURCE_EXHAUSTED for a message above the link's `max_message`. A stream
    /// under a retry policy reports only CANCELLED here; its status comes from the receiver.
    pub async fn send(&mut self, msg: Bytes) -> Result<(), Status> {
        match &mut self.inner {
            Send::Direct(d) => d.send(msg).await,
            Send::Relay(r) => r.send(msg).await.map_err(|_| ended()),
        }
    }

    /// Half-closes: the server's receiver sees the end after the messages sent before.
    pub fn finish(self) -> Result<(), Status> {
        match self.inner {
            Send::Direct(d) => d.finish(),
            Send::Relay(_) => Ok(()),
        }
    }

    /// Resolves once sends would fail (the stream ended, failed or was cancelled).
    pub async fn closed(&self) {
        match &self.inner {
            Send::Direct(d) => d.closed().await,
            Send::Relay(r) => r.closed().await,
        }
    }
}

/// The client's receiving half of a stream: initial metadata, the server's messages in order,
/// then its trailers or status. Dropping it before the end cancels the stream (the server's
/// handler is dropped), as gRPC's RST_STREAM(CANCEL).
pub struct ResponseReceiver {
    inner: Recv,
}

enum Recv {
    Direct(DirectReceiver),
    /// The committed attempt of a replayed stream, once there is one.
    Pending(oneshot::Receiver<Result<DirectReceiver, Status>>),
    Failed(Status),
}

impl std::fmt::Debug for ResponseReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Recv::Direct(d) => d.fmt(f),
            _ => f.write_str("ResponseReceiver(replayed)"),
        }
    }
}

impl ResponseReceiver {
    pub(crate) fn direct(d: DirectReceiver) -> Self {
        ResponseReceiver {
            inner: Recv::Direct(d),
        }
    }

    async fn resolve(&mut self) -> Result<&mut DirectReceiver, Status> {
        if let Recv::Pending(p) = &mut self.inner {
            let r = p.await.unwrap_or_else(|_| Err(ended()));
            self.inner = match r {
                Ok(d) => Recv::Direct(d),
                Err(s) => Recv::Failed(s),
            };
        }
        match &mut self.inner {
            Recv::Direct(d) => Ok(d),
            Recv::Failed(s) => Err(s.clone()),
            Recv::Pending(_) => Err(ended()),
        }
    }

    /// The server's initial metadata: waits for it, or for the stream's end or first message
    /// (then empty: the server sent none; its status, if an error, comes from
    /// [`ResponseReceiver::message`]). Errors: the stream failed here first (DEADLINE_EXCEEDED,
    /// UNAVAILABLE, CANCELLED), or every attempt of a replayed stream failed (the last status).
    pub async fn headers(&mut self) -> Result<Metadata, Status> {
        self.resolve().await?.headers().await
    }

    /// Whether the server sent its initial metadata as such (STREAM_HEADERS); false when the
    /// stream ended with its only answer in the RESPONSE (a unary answer), or before
    /// [`ResponseReceiver::headers`] resolved a replayed stream.
    pub fn headers_sent(&self) -> bool {
        match &self.inner {
            Recv::Direct(d) => d.headers_sent(),
            _ => false,
        }
    }

    /// The next message; `Ok(None)` after the last one, when the server ended with OK (then
    /// [`ResponseReceiver::trailers`]). Errors: the server's status after its messages, or
    /// this stream's failure (DEADLINE_EXCEEDED, UNAVAILABLE, RESOURCE_EXHAUSTED when the
    /// server broke the window).
    pub async fn message(&mut self) -> Result<Option<Bytes>, Status> {
        self.resolve().await?.message().await
    }

    /// The trailers of a stream that ended OK (after [`ResponseReceiver::message`] returned
    /// `Ok(None)`); `None` before.
    pub fn trailers(&self) -> Option<Metadata> {
        match &self.inner {
            Recv::Direct(d) => d.trailers(),
            _ => None,
        }
    }

    /// Cancels the stream (the server's handler is dropped); as dropping the receiver. A
    /// replayed stream not yet committed cancels every running attempt and starts no other.
    pub fn cancel(self) {
        match self.inner {
            Recv::Direct(d) => d.cancel(),
            // closing the channel wakes the relay, which drops its attempts (CANCEL each)
            Recv::Pending(mut p) => p.close(),
            Recv::Failed(_) => {}
        }
    }
}

/// Whether a stream is replayed: its method has a retry or hedging policy and its request is
/// not complete at open.
pub(crate) fn replays(retry: &Retrier, req: &OpenStream) -> bool {
    !req.half_close && retry.policy(&req.method).is_some()
}

/// What the attempts of a replayed stream share: the caller's request messages so far (after
/// the first, which goes with each attempt's opening frame), kept until the stream commits.
#[derive(Default)]
struct Input {
    buffer: Vec<Bytes>,
    /// The caller half-closed after `buffer`.
    finished: bool,
    /// Bytes of the request so far (the first message included).
    bytes: usize,
    /// The request passed the limit: no more is read until an attempt has sent all of
    /// `buffer` and commits.
    over: bool,
}

/// One attempt of a replayed stream: sends the request kept in `input` (from the start, then
/// each message as it comes) until its commit point, or, once `input` is over the limit,
/// until it has sent all of it. Returns the attempt and how much of `buffer` it sent.
async fn attempt(
    input: &parking_lot::Mutex<Input>,
    changed: &tokio::sync::watch::Sender<()>,
    tx: DirectSender,
    mut rx: DirectReceiver,
) -> Result<(Option<DirectSender>, DirectReceiver, usize), AttemptError> {
    let mut tx = Some(tx);
    let mut sent = 0usize;
    let mut seen = changed.subscribe();
    loop {
        seen.borrow_and_update();
        let (next, finished, over) = {
            let inp = input.lock();
            (inp.buffer.get(sent).cloned(), inp.finished, inp.over)
        };
        match next {
            Some(m) => {
                sent += 1;
                let Some(t) = tx.as_mut() else { continue };
                tokio::select! {
                    r = rx.commit_point() => {
                        r?;
                        // committed with `m` unsent: it is sent after the commit
                        sent -= 1;
                        return Ok((tx, rx, sent));
                    }
                    r = t.send(m) => if r.is_err() {
                        tx = None; // the stream ended: its outcome comes from `rx`
                    },
                }
                continue;
            }
            None if finished => {
                if let Some(t) = tx.take() {
                    let _ = t.finish();
                }
            }
            None if over => return Ok((tx, rx, sent)),
            None => {}
        }
        tokio::select! {
            r = rx.commit_point() => {
                r?;
                return Ok((tx, rx, sent));
            }
            _ = seen.changed(), if !finished => {}
        }
    }
}

/// A replayed stream: the caller's halves, and a task that runs its attempts (`open` opens
/// one) under `retry`'s policy (retried one after another, or hedged side by side: each
/// attempt gets every request message) until one commits, then relays the rest of the
/// request to it.
pub(crate) fn relayed<F, Fut>(
    retry: Arc<Retrier>,
    req: OpenStream,
    deadline: Option<Instant>,
    mut open: F,
) -> (RequestSender, ResponseReceiver)
where
    F: FnMut(AttemptInfo) -> Fut + std::marker::Send + 'static,
    Fut: Future<Output = Result<(DirectSender, DirectReceiver), AttemptError>> + std::marker::Send,
{
    let (in_tx, mut in_rx) = mpsc::channel::<Bytes>(1);
    let (out_tx, out_rx) = oneshot::channel();
    let method = req.method.clone();
    let first = req.first.map(|m| m.len()).unwrap_or(0);
    tokio::spawn(async move {
        let input = parking_lot::Mutex::new(Input {
            bytes: first,
            ..Input::default()
        });
        let (changed, _) = tokio::sync::watch::channel(());
        // reads the caller's messages into `input` until it is over the limit or finished
        let pump = async {
            loop {
                let m = in_rx.recv().await;
                let stop = {
                    let mut inp = input.lock();
                    match m {
                        Some(m) => {
                            inp.bytes += m.len();
                            inp.buffer.push(m);
                            if inp.bytes > PER_RPC_BUFFER_LIMIT {
                                inp.over = true;
                                retry.buffer_commit(&method);
                            }
                        }
                        None => inp.finished = true,
                    }
                    inp.over || inp.finished
                };
                changed.send_replace(());
                if stop {
                    return std::future::pending::<()>().await;
                }
            }
        };
        let run = retry.run_committable(
            &method,
            deadline,
            || input.lock().over,
            |info| {
                let (input, changed) = (&input, &changed);
                let opened = open(info);
                async move {
                    let (tx, rx) = opened.await?;
                    attempt(input, changed, tx, rx).await
                }
            },
        );
        let mut out_tx = out_tx;
        // until commit, a caller that drops its receiver (or cancels) ends the stream: the
        // running attempts are dropped here (each sends CANCEL) and none is retried or hedged
        let res = tokio::select! {
            r = run => r,
            () = pump => unreachable!("the pump never ends"),
            () = out_tx.closed() => {
                tracing::debug!(method = %method, "replayed stream dropped by its caller before commit; cancelling its attempts");
                return;
            }
        };
        let (tx, rx, sent) = match res {
            Ok(v) => v,
            Err(s) => {
                let _ = out_tx.send(Err(s));
                return;
            }
        };
        if out_tx.send(Ok(rx)).is_err() {
            return; // the caller dropped its receiver: dropping `tx` and the stream cancels
        }
        // committed: the rest of the request goes to this attempt alone
        let inp = input.into_inner();
        let Some(mut tx) = tx else { return };
        for m in inp.buffer.into_iter().skip(sent) {
            if tx.send(m).await.is_err() {
                return;
            }
        }
        if !inp.finished {
            loop {
                // a stream that ended (or whose caller dropped its receiver) ends the relay,
                // so the caller's sender sees `closed()` even while it has nothing to send
                let m = tokio::select! {
                    () = tx.closed() => return,
                    m = in_rx.recv() => m,
                };
                let Some(m) = m else { break };
                if tx.send(m).await.is_err() {
                    return;
                }
            }
        }
        let _ = tx.finish();
    });
    (
        RequestSender {
            inner: Send::Relay(in_tx),
        },
        ResponseReceiver {
            inner: Recv::Pending(out_rx),
        },
    )
}
