//! The TCP engine: one message per frame on the link's TCP connection.

use std::sync::Arc;

use byteexpress_tcp_fallback::{Frame, FrameError, FrameReader, FrameWriter, Progress};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use super::keepalive::{Liveness, watch};
use super::{Dispatch, LinkTx};
use crate::budget::UNCHARGED;
use crate::error::EngineError;
use crate::message::{Incoming, Outgoing};
use crate::wire::header::{Header, Kind, LONG_HEADER_LEN};
use crate::{Metadata, Status, Transport};

/// Starts the engine on an established connection (set-up done). Returns the link's sender.
/// `max_message` (bytes, header included) bounds what it sends; the reader's frame limit
/// bounds what it receives. `live` sets its keepalive pings and idle timeout
/// ([`super::keepalive`]).
pub(crate) fn spawn<R, W>(
    reader: FrameReader<R>,
    writer: FrameWriter<W>,
    max_message: usize,
    dispatch: Arc<dyn Dispatch>,
    live: Liveness,
    machine: crate::link_state::LinkMachine,
) -> LinkTx
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let link = LinkTx::with_machine(tx, Transport::Tcp, max_message, machine);
    let closer = Arc::new(Closer::new(dispatch.clone(), link.clone()));
    resume(
        reader,
        writer,
        rx,
        link.clone(),
        dispatch,
        closer,
        live,
        None,
    );
    link
}

/// The hooks of a fallen-back RDMA link's TCP phase ([`super::control`]): a re-probe's
/// messages (REPROBE, REPROBE_ACK, SWITCH) go to the control task instead of the application,
/// and the phase ends in order: the write side after a last message the control task hands it
/// (its SWITCH), the read side at the peer's SWITCH. Each gives its half of the connection
/// (and the callers' channel) back.
pub(crate) struct Phase<R, W> {
    /// REPROBE, REPROBE_ACK and SWITCH as they arrive.
    pub events: mpsc::Sender<Incoming>,
    /// The last message to write before the write side stops.
    pub stop_writing: tokio::sync::oneshot::Receiver<Outgoing>,
    /// The writer and the callers' channel, once the last message is written.
    pub writer_back:
        tokio::sync::oneshot::Sender<(FrameWriter<W>, mpsc::UnboundedReceiver<Outgoing>)>,
    /// The reader, once the peer's SWITCH was read.
    pub reader_back: tokio::sync::oneshot::Sender<FrameReader<R>>,
    /// Cancelled when the phase ends (stops its keepalive watcher).
    pub over: tokio_util::sync::CancellationToken,
    /// Messages to write before anything the callers queue: a fallback's re-sends. Written by
    /// the write task while the read task already reads, so two sides re-sending more than
    /// their sockets buffer never wait on each other (they did when the control task wrote
    /// them before reading: 12 × 3 MiB rendezvous re-sends each way hung both sides).
    pub first: Vec<Outgoing>,
}

/// Runs `link` as a TCP link on `(reader, writer)`, sending what the callers queue on `rx`:
/// a link set up on TCP, or an RDMA link fallen back to its control connection.
pub(crate) fn resume<R, W>(
    mut reader: FrameReader<R>,
    mut writer: FrameWriter<W>,
    rx: mpsc::UnboundedReceiver<Outgoing>,
    link: LinkTx,
    dispatch: Arc<dyn Dispatch>,
    closer: Arc<Closer>,
    live: Liveness,
    phase: Option<Phase<R, W>>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (wphase, rphase, over, first) = match phase {
        Some(p) => (
            Some((p.stop_writing, p.writer_back)),
            Some((p.events, p.reader_back)),
            p.over,
            p.first,
        ),
        None => (
            None,
            None,
            tokio_util::sync::CancellationToken::new(),
            Vec::new(),
        ),
    };
    // Bytes moving either way, also inside one long frame, show the peer alive (keepalive).
    // Bytes arriving, also inside one long frame, are the peer speaking (keepalive); bytes the
    // socket takes of our own write under way keep a PING queued behind it waiting.
    // Counted per PROGRESS_BYTES only: a peer trickling a byte now and then is not alive.
    let heard = link.clone();
    reader.on_progress(every(PROGRESS_BYTES, move || heard.touch()));
    let taken = link.clone();
    writer.on_progress(every(PROGRESS_BYTES, move || taken.write_progress()));
    tokio::spawn(write_loop(
        writer,
        first,
        rx,
        link.clone(),
        closer.clone(),
        wphase,
    ));
    tokio::spawn(read_loop(
        reader,
        link.clone(),
        dispatch.clone(),
        closer.clone(),
        rphase,
    ));
    let watched = link.clone();
    tokio::spawn(async move {
        let ping = |n| {
            let _ = watched.send(control(Kind::Ping, n));
        };
        tokio::select! {
            why = watch(&watched, live, &*dispatch, ping) => closer.close(why),
            () = watched.close_requested() => {}
            () = over.cancelled() => {}
        }
    });
}

/// A PING or PONG number `n`: the 40-byte header alone.
pub(crate) fn control(kind: Kind, n: u64) -> Outgoing {
    let mut header = crate::wire::header::Header::new(kind);
    header.call_id = n;
    Outgoing {
        header,
        meta: Vec::new(),
        body: bytes::Bytes::new(),
    }
}

/// Calls [`Dispatch::closed`] exactly once, whichever task sees the end first.
pub(crate) struct Closer {
    dispatch: Arc<dyn Dispatch>,
    link: LinkTx,
    done: std::sync::atomic::AtomicBool,
}

impl Closer {
    pub(crate) fn new(dispatch: Arc<dyn Dispatch>, link: LinkTx) -> Self {
        Closer {
            dispatch,
            link,
            done: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Closes the link with `why` ([`crate::error::EngineError`], or a status made elsewhere):
    /// the one place a link's end becomes the `Status` of its calls.
    pub(crate) fn close(&self, why: impl Into<Status>) {
        if !self.done.load(std::sync::atomic::Ordering::Acquire) {
            self.close_now(why.into());
        }
    }

    fn close_now(&self, why: Status) {
        if !self.done.swap(true, std::sync::atomic::Ordering::AcqRel) && self.link.claim_close() {
            tracing::debug!(%why, "link closed");
            let _ = self
                .link
                .machine()
                .apply(crate::link_state::LinkEvent::Closed, &why);
            self.link.close();
            self.link.counters().metrics.link_down();
            self.dispatch.closed(why);
        }
    }
}

type WritePhase<W> = (
    tokio::sync::oneshot::Receiver<Outgoing>,
    tokio::sync::oneshot::Sender<(FrameWriter<W>, mpsc::UnboundedReceiver<Outgoing>)>,
);

async fn write_loop<W: AsyncWrite + Unpin>(
    mut w: FrameWriter<W>,
    first: Vec<Outgoing>,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    link: LinkTx,
    closer: Arc<Closer>,
    phase: Option<WritePhase<W>>,
) {
    let (mut stop, back) = match phase {
        Some((stop, back)) => (Some(stop), Some(back)),
        None => (None, None),
    };
    if !first.is_empty() {
        for m in &first {
            let h = m.final_header().encode();
            if let Err(e) = w.write_frame(&[&h, &m.meta, &m.body]).await {
                closer.close(EngineError::TcpWrite(e));
                return;
            }
        }
        if let Err(e) = w.flush().await {
            closer.close(EngineError::TcpWrite(e));
            return;
        }
    }
    loop {
        let stopping = async {
            match stop.as_mut() {
                Some(s) => s.await.ok(),
                None => std::future::pending().await,
            }
        };
        let msg = tokio::select! {
            biased;
            last = stopping => {
                // The phase ends: the last message, then the writer and the channel go back.
                stop = None;
                let Some(last) = last else { continue };
                let h = last.final_header().encode();
                let done = match w.write_frame(&[&h, &last.meta, &last.body]).await {
                    Ok(()) => w.flush().await,
                    Err(e) => Err(e),
                };
                if let Err(e) = done {
                    closer.close(EngineError::TcpWrite(e));
                    return;
                }
                if let Some(back) = back {
                    let _ = back.send((w, rx));
                }
                return;
            }
            m = rx.recv() => m,
            _ = link.close_requested() => None,
        };
        let Some(msg) = msg else { break };
        // Everything queued goes out together: batches of up to WRITE_BATCH messages or
        // WRITE_BATCH_BYTES, each one vectored write (TCP writes coalesced across calls), then
        // one flush once the queue is empty. An ERROR message ends its batch and the link.
        let mut next = Some(msg);
        while let Some(first) = next.take() {
            let mut batch = vec![first];
            let mut bytes = batch[0].meta.len() + batch[0].body.len();
            while batch.len() < WRITE_BATCH
                && bytes < WRITE_BATCH_BYTES
                && batch[batch.len() - 1].header.kind != Kind::Error
            {
                match rx.try_recv() {
                    Ok(m) => {
                        bytes += m.meta.len() + m.body.len();
                        batch.push(m);
                    }
                    Err(_) => break,
                }
            }
            if let Err(e) = write_batch(&mut w, &batch, &link).await {
                closer.close(EngineError::TcpWrite(e));
                return;
            }
            if batch[batch.len() - 1].header.kind == Kind::Error {
                let _ = w.flush().await;
                closer.close(EngineError::AfterProtocolError);
                return;
            }
            next = rx.try_recv().ok();
        }
        if let Err(e) = w.flush().await {
            closer.close(EngineError::TcpWrite(e));
            return;
        }
    }
    let _ = w.shutdown().await;
    closer.close(EngineError::Closed);
}

/// Bytes that must move inside a frame, either way, before keepalive counts them as progress
/// (see [`resume`]): a live transfer moves this many in well under a millisecond, a peer
/// trickling a byte per keepalive interval never does (a reviewer's raw peer, trickling one
/// byte per 200 ms into a 1 MiB frame, was kept open for ever before this floor).
const PROGRESS_BYTES: usize = 64 * 1024;

/// A progress hook calling `f` once per `bytes` bytes moved.
fn every(bytes: usize, f: impl Fn() + Send + Sync + 'static) -> Progress {
    let moved = std::sync::atomic::AtomicUsize::new(0);
    Progress::new(move |n| {
        let total = moved.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
        if total >= bytes {
            moved.store(0, std::sync::atomic::Ordering::Relaxed);
            f();
        }
    })
}

/// Most messages one vectored write of the TCP engine carries (each is up to 4 slices: length,
/// header, metadata, body).
const WRITE_BATCH: usize = 64;
/// A batch takes no more messages once it holds this many bytes of metadata and body.
const WRITE_BATCH_BYTES: usize = 256 * 1024;

/// Writes `batch` as one run of vectored writes, counting its bytes.
async fn write_batch<W: AsyncWrite + Unpin>(
    w: &mut FrameWriter<W>,
    batch: &[Outgoing],
    link: &LinkTx,
) -> Result<(), FrameError> {
    let headers: Vec<_> = batch.iter().map(|m| m.final_header().encode()).collect();
    let parts: Vec<[&[u8]; 3]> = headers
        .iter()
        .zip(batch)
        .map(|(h, m)| [&h[..], &m.meta[..], &m.body[..]])
        .collect();
    let wire: usize = parts.iter().flatten().map(|p| p.len()).sum();
    link.counters().metrics.bytes_sent.increment(wire as u64);
    let frames: Vec<&[&[u8]]> = parts.iter().map(|p| &p[..]).collect();
    link.write_progress();
    let r = w.write_frames(&frames).await;
    link.write_done();
    if r.is_ok() && batch.iter().any(|m| m.header.kind == Kind::Ping) {
        link.ping_written();
    }
    r
}

/// The largest frame a TCP link reads at all (bytes): the largest `Config::max_message`
/// ([`crate::config_check::MAX_MESSAGE_LIMIT`]). A frame up to this above the link's own
/// `max_message` fails its call only; a longer one is garbage and closes the link.
const MAX_FRAME_ON_LINK: usize = crate::config_check::MAX_MESSAGE_LIMIT as usize;

/// Re-probe messages the control task may have unread before the peer counts as flooding: an
/// honest peer has at most two of its own unanswered (a nonce request and an offer), plus
/// late answers to tries that timed out.
pub(crate) const REPROBE_QUEUE: usize = 16;
/// The largest re-probe message body: a SELECT_RDMA or RDMA_ACCEPT set-up message, or REFUSE
/// with its reason, is far smaller (bytes).
const MAX_REPROBE_BODY: usize = 4096;

type ReadPhase<R> = (
    mpsc::Sender<Incoming>,
    tokio::sync::oneshot::Sender<FrameReader<R>>,
);

async fn read_loop<R: AsyncRead + Unpin>(
    mut r: FrameReader<R>,
    link: LinkTx,
    dispatch: Arc<dyn Dispatch>,
    closer: Arc<Closer>,
    phase: Option<ReadPhase<R>>,
) {
    let budget = dispatch.budget().clone();
    // The reader's limit (`Config::max_message`) becomes a per-message one: a frame over it is
    // refused (its bytes dropped as they arrive, its call failed RESOURCE_EXHAUSTED), not a
    // broken link. Only a length no configuration allows is a protocol error.
    let max_message = r.max_frame();
    r.set_max_frame(MAX_FRAME_ON_LINK);
    // the budget charge of the frame being read, held until it is whole
    let mut charge = None;
    let mut over_limit = false;
    loop {
        let frame = tokio::select! {
            f = r.read_frame_admit(LONG_HEADER_LEN, |len| {
                if len > max_message {
                    over_limit = true;
                    return false;
                }
                if len <= UNCHARGED {
                    return true;
                }
                charge = budget.try_take(len);
                charge.is_some()
            }) => f,
            _ = link.close_requested() => return,
        };
        charge = None;
        if let Ok(Some(f)) = &frame {
            link.touch();
            let len = match f {
                Frame::Whole(b) => b.len(),
                Frame::Refused { len, .. } => *len,
            };
            link.counters().metrics.bytes_received.increment(len as u64);
        }
        match frame {
            Ok(Some(Frame::Refused { head, len })) => match Header::decode_head(&head) {
                Ok(h) if std::mem::take(&mut over_limit) => {
                    tracing::debug!(len, max_message, "message over max_message refused");
                    let why = EngineError::MessageTooLarge {
                        len,
                        max: max_message,
                    };
                    dispatch.refused(&link, &h, why.into());
                }
                Ok(h) => {
                    tracing::debug!(len, "message refused for want of memory budget");
                    dispatch.refused(&link, &h, budget.refusal(len as u64));
                }
                Err(e) => {
                    protocol_error(&link, &closer, EngineError::Garbled(e));
                    return;
                }
            },
            Ok(Some(Frame::Whole(frame))) => match Incoming::parse(frame) {
                Ok(msg) if msg.header.kind == Kind::Error => {
                    closer.close(peer_error(&msg));
                    return;
                }
                Ok(msg) if msg.header.kind == Kind::CreditUpdate => {}
                Ok(msg) if msg.header.kind == Kind::Ping => {
                    let _ = link.send(control(Kind::Pong, msg.header.call_id));
                }
                Ok(msg) if matches!(msg.header.kind, Kind::Pong | Kind::Resync | Kind::Release) => {
                }
                Ok(msg) if msg.header.kind.is_reprobe() => {
                    // A re-probe's message: for the control task of a fallen-back link, dropped
                    // on a link set up on TCP.
                    let Some((events, _)) = &phase else { continue };
                    if msg.body.len() > MAX_REPROBE_BODY {
                        protocol_error(
                            &link,
                            &closer,
                            EngineError::ReprobeProtocol("a re-probe message over 4 KiB"),
                        );
                        return;
                    }
                    let switch = msg.header.kind == Kind::Switch;
                    if let Err(mpsc::error::TrySendError::Full(_)) = events.try_send(msg) {
                        protocol_error(
                            &link,
                            &closer,
                            EngineError::ReprobeProtocol("re-probe messages nobody asked for"),
                        );
                        return;
                    }
                    if switch {
                        // The peer's last TCP message: the reader goes back to the control task.
                        if let Some((_, back)) = phase {
                            r.set_max_frame(max_message);
                            let _ = back.send(r);
                        }
                        return;
                    }
                }
                Ok(msg) => dispatch.incoming(&link, msg),
                Err(e) => {
                    protocol_error(&link, &closer, EngineError::Garbled(e));
                    return;
                }
            },
            Ok(None) => {
                closer.close(EngineError::PeerClosed);
                return;
            }
            Err(e @ FrameError::TooLarge { .. }) => {
                protocol_error(&link, &closer, EngineError::FrameTooLarge(e));
                return;
            }
            Err(e @ FrameError::BadEscape { .. }) => {
                protocol_error(&link, &closer, EngineError::FrameGarbled(e));
                return;
            }
            Err(e) => {
                closer.close(EngineError::TcpRead(e));
                return;
            }
        }
    }
}

/// Answers a peer's protocol violation: an ERROR message, then close.
/// Answers a peer's protocol violation: an ERROR message (with the code and message of
/// `why`'s status), then close.
fn protocol_error(link: &LinkTx, closer: &Closer, why: EngineError) {
    let why = Status::from(why);
    tracing::warn!(reason = %why, "closing link after a protocol error from the peer");
    let err = Outgoing::status(
        Kind::Error,
        0,
        0,
        why.code,
        &why.message,
        &Metadata::new(),
        bytes::Bytes::new(),
    );
    if link.send(err).is_err() {
        closer.close(why);
    }
}

/// The reason an ERROR message from the peer carries (empty when it does not decode).
pub(crate) fn peer_reason(msg: &Incoming) -> String {
    crate::wire::meta::decode(&msg.meta)
        .map(|(m, _)| m)
        .unwrap_or_default()
}

/// Why the link closed when the peer sent an ERROR message.
pub(crate) fn peer_error(msg: &Incoming) -> EngineError {
    EngineError::PeerError(peer_reason(msg))
}
