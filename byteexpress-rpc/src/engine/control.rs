//! The TCP control connection of an RDMA link, and the link's fallback to it.
//!
//! While the link is on RDMA the control connection carries keepalive PING and PONG frames
//! ([`super::keepalive`]). When the QP fails (the engine hands over, [`rdma::failover`]) or the
//! peer's RESYNC says its QP failed, the link falls back to this connection
//! (`LinkState::FallbackTcp`, `Client::transport` = `tcp(fallback)`):
//! 1. each side sends RESYNC (`call_id` = messages it received whole over RDMA, `timeout_us` =
//!    messages it sent) once its own CQ is drained, and reads the peer's;
//! 2. each re-sends, as TCP frames and in order, the messages the peer's count says it never
//!    received (posted but not confirmed, numbered at or above the count), then the messages
//!    never posted whole, before anything the callers queue after them;
//! 3. the link then runs as a TCP link ([`tcp::resume`]) on the same connection.
//!
//! A peer count below what this side's completions confirmed, or above what it sent, is a
//! protocol error: the link closes.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use byteexpress_tcp_fallback::{FrameError, FrameReader, FrameWriter};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};

use super::keepalive::{self, Liveness};
use super::rdma::failover::Handover;
use super::rdma::{self, Posted, RdmaParts};
use super::tcp::{self, Closer};
use super::{Dispatch, LinkTx};
use crate::Status;
use crate::error::EngineError;
use crate::link_state::{LinkEvent, LinkMachine};
use crate::message::{Incoming, Outgoing};
use crate::setup::{Prober, ReprobeError};
use crate::wire::header::{Header, Kind};

/// Why a fallback could not go on. Crate-private; mapped to UNAVAILABLE when the link closes.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FallbackError {
    /// Reading or writing the control connection failed.
    #[error("control connection")]
    Io(#[source] FrameError),
    /// The peer closed the control connection.
    #[error("the peer closed the control connection")]
    PeerClosed,
    /// A frame that does not decode as a message header.
    #[error("control connection: undecodable frame")]
    Garbage(#[source] crate::wire::WireError),
    /// A message other than PING, PONG or RESYNC before the peer's RESYNC.
    #[error("control connection: {0:?} before the peer's RESYNC")]
    OutOfTurn(Kind),
    /// The peer's RESYNC states a count this side's own completions contradict.
    #[error(
        "resync: the peer received {peer} messages, but {sent} were sent and the first {confirmed} confirmed"
    )]
    Resync {
        peer: u64,
        sent: u64,
        confirmed: u64,
    },
    /// No RESYNC from the peer within the time limit.
    #[error("resync: no RESYNC from the peer within {0:?}")]
    Timeout(Duration),
}

/// Longest wait for the peer's RESYNC once this side sent its own.
const RESYNC_LIMIT: Duration = Duration::from_secs(10);

/// Starts an RDMA link: its engine on `parts`, and the control connection `(r, w)` with its
/// keepalive, fallback and re-probes (`prober`). `machine` is in `Rdma`.
pub(crate) fn start_rdma<R, W>(
    parts: RdmaParts,
    (r, w): (FrameReader<R>, FrameWriter<W>),
    dispatch: Arc<dyn Dispatch>,
    posted: Posted,
    live: Liveness,
    machine: LinkMachine,
    prober: Prober,
) -> LinkTx
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (dead_tx, dead_rx) = oneshot::channel();
    let (ho_tx, ho_rx) = oneshot::channel();
    let link = rdma::spawn(parts, posted, dispatch.clone(), dead_rx, machine, ho_tx);
    let phase = RdmaPhase {
        r,
        w,
        dead_tx,
        ho_rx,
    };
    tokio::spawn(run(phase, live, dispatch, link.clone(), prober));
    link
}

/// What ended the RDMA phase of the control connection.
enum End {
    /// The link closes, for this reason.
    Close(EngineError),
    /// The link falls back; the peer's RESYNC (count, body) when it came first.
    FallBack(Option<(u64, Bytes)>),
}

/// The control connection while the link runs on a QP, and its ties to the engine.
struct RdmaPhase<R, W> {
    r: FrameReader<R>,
    w: FrameWriter<W>,
    /// Tells the engine the control connection ended.
    dead_tx: oneshot::Sender<Status>,
    /// The engine's messages when its QP fails.
    ho_rx: oneshot::Receiver<Handover>,
}

/// A link's counts after a resync: (messages sent that the peer received, messages received),
/// the count a new QP continues from; and, from the server, the nonce for the next re-probe.
struct Resynced {
    /// The messages the peer never received, to write before anything else.
    resend: Vec<Outgoing>,
    rx: mpsc::UnboundedReceiver<Outgoing>,
    seqs: (u64, u64),
    nonce: Option<u64>,
}

/// The link's life after set-up: RDMA phases, fallbacks and re-probes, until it closes.
async fn run<R, W>(
    mut phase: RdmaPhase<R, W>,
    live: Liveness,
    dispatch: Arc<dyn Dispatch>,
    link: LinkTx,
    prober: Prober,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    // The backoff that opened the current RDMA phase (`None`: set-up opened it) and when it
    // began: a re-probed QP that fails before the phase outlived the backoff cap was a flap,
    // so the next re-probe waits twice as long instead of starting over (`next_backoff`).
    let mut opened_by: Option<Duration> = None;
    let mut rdma_since = Instant::now();
    loop {
        let (end, handover) = watch_rdma(&mut phase, live, &dispatch, &link).await;
        let RdmaPhase {
            mut r,
            mut w,
            dead_tx,
            ho_rx,
        } = phase;
        let peer = match end {
            End::Close(why) => {
                let _ = dead_tx.send(why.into());
                let _ = w.shutdown().await;
                return;
            }
            End::FallBack(peer) => peer,
        };
        let handover = match handover {
            Some(h) => h,
            None => tokio::select! {
                h = ho_rx => match h {
                    Ok(h) => h,
                    Err(_) => return,
                },
                _ = link.close_requested() => return,
            },
        };
        // From here on the engine is gone: this task closes the link if the fallback fails.
        drop(dead_tx);
        let closer = Arc::new(Closer::new(dispatch.clone(), link.clone()));
        let mut resynced = match fall_back(&mut r, &mut w, handover, peer, &link, &prober).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "link fallback failed");
                closer.close(EngineError::Fallback(e));
                let _ = w.shutdown().await;
                return;
            }
        };
        // The TCP phase, with the hooks a re-probe needs.
        let (events_tx, events) = mpsc::channel(tcp::REPROBE_QUEUE);
        let (stop_tx, stop_writing) = oneshot::channel();
        let (writer_back, writer_rx) = oneshot::channel();
        let (reader_back, reader_rx) = oneshot::channel();
        let over = tokio_util::sync::CancellationToken::new();
        let hooks = tcp::Phase {
            events: events_tx,
            stop_writing,
            writer_back,
            reader_back,
            over: over.clone(),
            first: std::mem::take(&mut resynced.resend),
        };
        tcp::resume(
            r,
            w,
            resynced.rx,
            link.clone(),
            dispatch.clone(),
            closer.clone(),
            live,
            Some(hooks),
        );
        let ends = PhaseEnd {
            events,
            stop_tx,
            writer_rx,
            reader_rx,
        };
        let next = if prober.is_client() {
            let (first, max, _) = prober.timing();
            let start = next_backoff(first, max, opened_by, rdma_since.elapsed());
            reprobe_client(&prober, &link, &closer, ends, resynced.nonce, start).await
        } else {
            reprobe_server(&prober, &link, &closer, ends).await
        };
        let Some(next) = next else { return };
        opened_by = Some(next.backoff);
        rdma_since = Instant::now();
        over.cancel();
        let (dead_tx, dead_rx) = oneshot::channel();
        let (ho_tx, ho_rx) = oneshot::channel();
        link.rearm_fall_back();
        link.touch();
        let _ = link.machine().apply(
            LinkEvent::QpUp,
            &format_args!("re-probe {} switched", next.probe),
        );
        rdma::start(
            next.parts,
            next.posted,
            dispatch.clone(),
            dead_rx,
            link.clone(),
            next.rx,
            ho_tx,
            resynced.seqs,
        );
        phase = RdmaPhase {
            r: next.r,
            w: next.w,
            dead_tx,
            ho_rx,
        };
    }
}

/// Runs the control connection while the link is on a QP: PING and PONG, keepalive, and the
/// signs of a fallback (the engine's hand-over, the peer's RESYNC).
async fn watch_rdma<R, W>(
    phase: &mut RdmaPhase<R, W>,
    live: Liveness,
    dispatch: &Arc<dyn Dispatch>,
    link: &LinkTx,
) -> (End, Option<Handover>)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (ping_tx, mut ping_rx) = mpsc::unbounded_channel::<u64>();
    let watcher = keepalive::watch(link, live, &**dispatch, move |n| {
        let _ = ping_tx.send(n);
    });
    tokio::pin!(watcher);
    let RdmaPhase { r, w, ho_rx, .. } = phase;
    loop {
        let reply = tokio::select! {
            f = r.read_frame() => match f {
                Ok(Some(frame)) => match Incoming::parse(frame) {
                    Ok(msg) if msg.header.kind == Kind::Ping => {
                        link.touch();
                        tcp::control(Kind::Pong, msg.header.call_id)
                    }
                    Ok(msg) if msg.header.kind == Kind::Pong => {
                        link.touch();
                        continue;
                    }
                    Ok(msg) if msg.header.kind == Kind::Resync => {
                        link.touch();
                        link.fall_back();
                        return (End::FallBack(Some((msg.header.call_id, msg.body))), None);
                    }
                    Ok(msg) => return (End::Close(tcp::peer_error(&msg)), None),
                    Err(e) => return (End::Close(EngineError::ControlGarbled(e)), None),
                },
                Ok(None) => return (End::Close(EngineError::ControlClosed), None),
                Err(e) => return (End::Close(EngineError::Control(e)), None),
            },
            Some(n) = ping_rx.recv() => tcp::control(Kind::Ping, n),
            why = &mut watcher => return (End::Close(why), None),
            h = &mut *ho_rx => return match h {
                Ok(h) => (End::FallBack(None), Some(h)),
                // The engine closed the link.
                Err(_) => (End::Close(EngineError::Closed), None),
            },
            _ = link.close_requested() => return (End::Close(EngineError::Closed), None),
        };
        let h = reply.final_header().encode();
        if let Err(e) = w.write_frame(&[&h]).await {
            return (End::Close(EngineError::Control(e)), None);
        }
        if let Err(e) = w.flush().await {
            return (End::Close(EngineError::Control(e)), None);
        }
    }
}

/// Steps 1 and 2 of the module docs; returns the callers' channel for the TCP engine and the
/// counts a new QP continues from.
async fn fall_back<R, W>(
    r: &mut FrameReader<R>,
    w: &mut FrameWriter<W>,
    h: Handover,
    peer_resync: Option<(u64, Bytes)>,
    link: &LinkTx,
    prober: &Prober,
) -> Result<Resynced, FallbackError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let Handover {
        fault,
        received,
        sent,
        unconfirmed,
        unsent,
        lent,
        holes,
        rx,
        remains,
    } = h;
    let _ = link.machine().apply(LinkEvent::QpFailed, &fault);
    *link.counters().qp.lock() = None;
    #[cfg(feature = "test-hooks")]
    link.faults().set_qp(None);
    let watched = link.clone();
    tokio::spawn(remains.reap(async move { watched.close_requested().await }));
    let mut resync = Header::new(Kind::Resync);
    resync.call_id = received;
    resync.timeout_us = sent;
    // The server arms a nonce on its device for the client's first re-probe; then the holes.
    let mut body = Vec::with_capacity(8 + 8 * holes.len());
    if !prober.is_client() {
        body.extend_from_slice(&prober.arm().to_le_bytes());
    }
    for h in &holes {
        body.extend_from_slice(&h.to_le_bytes());
    }
    resync.body_len = body.len() as u64;
    w.write_frame(&[&resync.encode(), &body])
        .await
        .map_err(FallbackError::Io)?;
    w.flush().await.map_err(FallbackError::Io)?;
    let (peer, peer_body) = match peer_resync {
        Some(p) => p,
        None => tokio::time::timeout(RESYNC_LIMIT, read_resync(r, w))
            .await
            .map_err(|_| FallbackError::Timeout(RESYNC_LIMIT))??,
    };
    link.touch();
    // The server's RESYNC starts with its nonce; the rest are the peer's holes.
    let (nonce, peer_holes) = if prober.is_client() {
        match peer_body.len() {
            n if n >= 8 => (
                Some(u64::from_le_bytes(
                    peer_body[..8].try_into().expect("8 bytes"),
                )),
                &peer_body[8..],
            ),
            _ => (None, &peer_body[..]),
        }
    } else {
        (None, &peer_body[..])
    };
    let peer_holes = parse_holes(peer_holes)?;
    // Written first by the TCP phase's write task, while its read task reads (the peer may be
    // re-sending as much at the same time).
    let resend: Vec<Outgoing> = to_resend(&unconfirmed, &lent, &peer_holes, &unsent, sent, peer)?
        .cloned()
        .collect();
    let resent = resend.len() as u64;
    link.counters()
        .resent
        .fetch_add(resent, std::sync::atomic::Ordering::Relaxed);
    crate::metrics::messages_resent(resent);
    tracing::info!(
        received,
        sent,
        peer_received = peer,
        resent,
        "link resynced over TCP"
    );
    Ok(Resynced {
        resend,
        rx,
        seqs: (peer, received),
        nonce,
    })
}

/// How the control task ends a TCP phase ([`tcp::Phase`]).
struct PhaseEnd<R, W> {
    events: mpsc::Receiver<Incoming>,
    stop_tx: oneshot::Sender<Outgoing>,
    writer_rx: oneshot::Receiver<(FrameWriter<W>, mpsc::UnboundedReceiver<Outgoing>)>,
    reader_rx: oneshot::Receiver<FrameReader<R>>,
}

/// A re-probe that worked: the new QP, and the connection and channel back from TCP.
struct Switched<R, W> {
    probe: u64,
    /// The wait before the re-probe that worked (zero on the server, which never waits).
    backoff: Duration,
    parts: RdmaParts,
    posted: Posted,
    r: FrameReader<R>,
    w: FrameWriter<W>,
    rx: mpsc::UnboundedReceiver<Outgoing>,
}

/// A re-probe message (REPROBE, REPROBE_ACK or SWITCH) numbered `probe`.
fn reprobe_msg(kind: Kind, probe: u64, nonce: u64, body: Vec<u8>) -> Outgoing {
    let mut header = Header::new(kind);
    header.call_id = probe;
    header.timeout_us = nonce;
    Outgoing {
        header,
        meta: Vec::new(),
        body: body.into(),
    }
}

/// Ends the TCP phase after the re-probe `probe` was agreed: sends SWITCH last on TCP, and
/// takes the connection back once the peer's SWITCH was read.
async fn switch<R, W>(
    probe: u64,
    backoff: Duration,
    parts: RdmaParts,
    posted: Posted,
    end: PhaseEnd<R, W>,
) -> Option<Switched<R, W>> {
    let PhaseEnd {
        stop_tx,
        writer_rx,
        reader_rx,
        ..
    } = end;
    stop_tx
        .send(reprobe_msg(Kind::Switch, probe, 0, Vec::new()))
        .ok()?;
    let (w, rx) = writer_rx.await.ok()?;
    let r = reader_rx.await.ok()?;
    Some(Switched {
        probe,
        backoff,
        parts,
        posted,
        r,
        w,
        rx,
    })
}

/// The first wait of a fallen-back link's re-probes: `first` (`Config::reprobe_backoff`),
/// unless the RDMA phase that just failed was opened by a re-probe after `opened_by` and lasted
/// less than `max` (`Config::reprobe_backoff_max`): then twice `opened_by`, capped at `max`. So
/// a path that lets a QP handshake through (it runs over TCP) but drops RoCE makes the link
/// flap at a falling rate (each flap costs its calls one retry timeout, about 0.5 s) instead of
/// every `first` + 0.5 s.
fn next_backoff(
    first: Duration,
    max: Duration,
    opened_by: Option<Duration>,
    lasted: Duration,
) -> Duration {
    match opened_by {
        Some(b) if lasted < max => (b * 2).clamp(first, max),
        _ => first,
    }
}

/// Client: re-probes with capped exponential backoff, the first after `start`, until one
/// works (or the link closes).
async fn reprobe_client<R, W>(
    prober: &Prober,
    link: &LinkTx,
    closer: &Closer,
    mut end: PhaseEnd<R, W>,
    mut nonce: Option<u64>,
    start: Duration,
) -> Option<Switched<R, W>> {
    let (first, max, limit) = prober.timing();
    if first.is_zero() {
        // Re-probes are off: the link stays on TCP until it closes (reading what the server
        // sends meanwhile: nothing it may send stops the link's reader but a SWITCH).
        loop {
            tokio::select! {
                m = end.events.recv() => match m {
                    Some(m) if m.header.kind == Kind::Switch => {
                        unasked_switch(closer);
                        return None;
                    }
                    Some(_) => {}
                    None => return None,
                },
                _ = link.close_requested() => return None,
            }
        }
    }
    let mut backoff = start;
    let mut probe = 0u64;
    loop {
        let sleep = tokio::time::sleep(backoff);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => break,
                m = end.events.recv() => match m {
                    // A late answer to a try that timed out: its nonce is the freshest.
                    Some(m) if m.header.kind == Kind::ReprobeAck => nonce = Some(m.header.timeout_us),
                    Some(m) if m.header.kind == Kind::Switch => {
                        unasked_switch(closer);
                        return None;
                    }
                    Some(_) => {}
                    None => return None,
                },
                _ = link.close_requested() => return None,
            }
        }
        probe += 1;
        let _ = link.machine().apply(
            LinkEvent::ProbeDue,
            &format_args!("re-probe {probe} after {backoff:?}"),
        );
        let tried = tokio::time::timeout(
            limit,
            try_reprobe(prober, link, &mut end, &mut nonce, probe),
        )
        .await;
        match tried {
            Ok(Ok((parts, posted))) => return switch(probe, backoff, parts, posted, end).await,
            Ok(Err(ReprobeError::UnaskedSwitch)) => {
                unasked_switch(closer);
                return None;
            }
            Ok(Err(why)) => {
                let _ = link.machine().apply(LinkEvent::ProbeFailed, &why.chain());
            }
            Err(_) => {
                let _ = link.machine().apply(
                    LinkEvent::ProbeFailed,
                    &format_args!("re-probe {probe}: no answer within {limit:?}"),
                );
            }
        }
        if link.is_closed() {
            return None;
        }
        backoff = (backoff * 2).min(max);
    }
}

/// One re-probe from the client: probe, offer a new QP, wait for the answer, connect.
async fn try_reprobe<R, W>(
    prober: &Prober,
    link: &LinkTx,
    end: &mut PhaseEnd<R, W>,
    nonce: &mut Option<u64>,
    probe: u64,
) -> Result<(RdmaParts, Posted), ReprobeError> {
    // Answers to earlier probes that timed out carry fresher nonces.
    while let Ok(m) = end.events.try_recv() {
        if m.header.kind == Kind::ReprobeAck {
            *nonce = Some(m.header.timeout_us);
        }
    }
    #[cfg(feature = "test-hooks")]
    if link.faults().reprobes_blocked() {
        return Err(ReprobeError::Blocked);
    }
    let (mut parts, select) = match nonce.map(|n| prober.offer(n)) {
        Some(Ok(offer)) => offer,
        // No nonce, or the probe failed: the path may be down, or the nonce is stale (a
        // device forgets an armed nonce after a while, and a probe spends it). Ask the server
        // for a fresh one (a REPROBE with an empty body) and probe once more with it.
        Some(Err(ReprobeError::Unreachable)) | None => {
            link.send(reprobe_msg(Kind::Reprobe, probe, 0, Vec::new()))
                .map_err(|_| ReprobeError::LinkClosed)?;
            let ack = await_ack(end, nonce, probe).await?;
            if !ack.body.is_empty() {
                return Err(ReprobeError::Unexpected("an empty REPROBE_ACK (a nonce)"));
            }
            prober.offer(nonce.ok_or(ReprobeError::NoNonce)?)?
        }
        Some(Err(e)) => return Err(e),
    };
    link.send(reprobe_msg(Kind::Reprobe, probe, 0, select))
        .map_err(|_| ReprobeError::LinkClosed)?;
    let ack = await_ack(end, nonce, probe).await?;
    let posted = prober.complete(&mut parts, &ack.body)?;
    Ok((parts, posted))
}

/// Waits for the REPROBE_ACK of `probe`, keeping the nonce of every REPROBE_ACK read (the
/// newest is the one the server armed last).
async fn await_ack<R, W>(
    end: &mut PhaseEnd<R, W>,
    nonce: &mut Option<u64>,
    probe: u64,
) -> Result<Incoming, ReprobeError> {
    loop {
        let m = end.events.recv().await.ok_or(ReprobeError::LinkClosed)?;
        if m.header.kind == Kind::ReprobeAck {
            *nonce = Some(m.header.timeout_us);
            if m.header.call_id == probe {
                return Ok(m);
            }
        } else if m.header.kind == Kind::Switch {
            return Err(ReprobeError::UnaskedSwitch);
        }
    }
}

/// The server sent SWITCH before the client sent its own (a client's SWITCH always comes
/// first): its reader has stopped at it, so the link cannot go on. Closes it with a typed
/// error instead of leaving its calls to their deadlines.
fn unasked_switch(closer: &Closer) {
    tracing::warn!("the peer sent a SWITCH nobody agreed to: link closed");
    closer.close(EngineError::ReprobeProtocol("a SWITCH before this side's"));
}

/// Server: answers re-probes until the client's SWITCH for an accepted one (or the link
/// closes).
async fn reprobe_server<R, W>(
    prober: &Prober,
    link: &LinkTx,
    closer: &Closer,
    mut end: PhaseEnd<R, W>,
) -> Option<Switched<R, W>> {
    let mut pending: Option<(u64, RdmaParts, Posted)> = None;
    loop {
        let m = tokio::select! {
            m = end.events.recv() => m?,
            _ = link.close_requested() => return None,
        };
        let probe = m.header.call_id;
        match m.header.kind {
            Kind::Reprobe if m.body.is_empty() => {
                // A nonce request: the client's nonce went stale. Answer with a fresh one; no
                // QP is built and any pending re-probe stays.
                if link
                    .send(reprobe_msg(
                        Kind::ReprobeAck,
                        probe,
                        prober.arm(),
                        Vec::new(),
                    ))
                    .is_err()
                {
                    return None;
                }
            }
            Kind::Reprobe => {
                if link.machine().state() == crate::LinkState::Reprobe {
                    let _ = link.machine().apply(
                        LinkEvent::ProbeFailed,
                        &format_args!("re-probe {probe} replaces the last"),
                    );
                }
                let _ = link
                    .machine()
                    .apply(LinkEvent::ProbeDue, &format_args!("REPROBE {probe}"));
                let next = prober.arm();
                let answer = match prober.answer(&m.body) {
                    Ok((parts, posted, accept)) => {
                        pending = Some((probe, parts, posted));
                        accept
                    }
                    Err(why) => {
                        pending = None;
                        let reason = why.chain();
                        let _ = link.machine().apply(LinkEvent::ProbeFailed, &reason);
                        crate::wire::hello::Hello::Refuse { reason }.encode()
                    }
                };
                if link
                    .send(reprobe_msg(Kind::ReprobeAck, probe, next, answer))
                    .is_err()
                {
                    return None;
                }
            }
            Kind::Switch => {
                // The read side has ended at the client's SWITCH: it must be for the QP
                // accepted last, or the link cannot go on.
                match pending.take() {
                    Some((p, parts, posted)) if p == probe => {
                        return switch(probe, Duration::ZERO, parts, posted, end).await;
                    }
                    _ => {
                        tracing::warn!(
                            probe,
                            "the peer sent a SWITCH for no accepted re-probe: link closed"
                        );
                        closer.close(EngineError::ReprobeProtocol(
                            "a SWITCH for no accepted re-probe",
                        ));
                        return None;
                    }
                }
            }
            _ => {}
        }
    }
}

/// Most holes a RESYNC may list (a peer listing more breaks the protocol): each is a
/// rendezvous message whose descriptor took one of our credits, so at most a few thousand.
const MAX_HOLES: usize = 1 << 16;

/// The peer's holes: u64 LE message numbers, ascending.
fn parse_holes(b: &[u8]) -> Result<Vec<u64>, FallbackError> {
    if !b.len().is_multiple_of(8) || b.len() / 8 > MAX_HOLES {
        return Err(FallbackError::Garbage(crate::wire::WireError(format!(
            "RESYNC body of {} bytes",
            b.len()
        ))));
    }
    let mut holes: Vec<u64> = b
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    holes.sort_unstable();
    Ok(holes)
}

/// The messages to re-send over TCP, in order, once the peer said it received `peer` of the
/// `sent` messages this side numbered, and listed `holes` (numbers of messages lent by
/// rendezvous whose descriptor it received but whose bytes it never READ): by number, those
/// of `unconfirmed` (numbered, posted, not confirmed by a SEND completion; oldest first)
/// numbered `peer` or above, and those of `lent` (not released) numbered `peer` or above or
/// listed as a hole (a lent message below the count and not a hole was read: its RELEASE was
/// lost with the QP); then every one of `unsent`. A count below the first unconfirmed number
/// (a message this side's completions confirmed would be lost) or above `sent` is refused.
fn to_resend<'a>(
    unconfirmed: &'a VecDeque<(u64, Outgoing)>,
    lent: &'a std::collections::BTreeMap<u64, Outgoing>,
    holes: &[u64],
    unsent: &'a [Outgoing],
    sent: u64,
    peer: u64,
) -> Result<impl Iterator<Item = &'a Outgoing>, FallbackError> {
    // The first number the peer may not have: the oldest unconfirmed or still lent.
    let confirmed = unconfirmed
        .front()
        .map(|(s, _)| *s)
        .into_iter()
        .chain(lent.keys().next().copied())
        .min()
        .unwrap_or(sent);
    if peer < confirmed || peer > sent {
        return Err(FallbackError::Resync {
            peer,
            sent,
            confirmed,
        });
    }
    let mut numbered: Vec<(u64, &Outgoing)> = unconfirmed
        .iter()
        .filter(|(s, _)| *s >= peer)
        .map(|(s, m)| (*s, m))
        .chain(
            lent.iter()
                .filter(|(s, _)| **s >= peer || holes.binary_search(s).is_ok())
                .map(|(s, m)| (*s, m)),
        )
        .collect();
    numbered.sort_unstable_by_key(|&(s, _)| s);
    Ok(numbered.into_iter().map(|(_, m)| m).chain(unsent))
}

/// Reads the control connection up to the peer's RESYNC (answering PINGs on the way) and
/// returns its count and body.
async fn read_resync<R, W>(
    r: &mut FrameReader<R>,
    w: &mut FrameWriter<W>,
) -> Result<(u64, Bytes), FallbackError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let frame = r
            .read_frame()
            .await
            .map_err(FallbackError::Io)?
            .ok_or(FallbackError::PeerClosed)?;
        let m = Incoming::parse(frame).map_err(FallbackError::Garbage)?;
        let h = m.header;
        match h.kind {
            Kind::Resync => return Ok((h.call_id, m.body)),
            Kind::Ping => {
                let pong = tcp::control(Kind::Pong, h.call_id).final_header().encode();
                w.write_frame(&[&pong]).await.map_err(FallbackError::Io)?;
                w.flush().await.map_err(FallbackError::Io)?;
            }
            Kind::Pong => {}
            k => return Err(FallbackError::OutOfTurn(k)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_re_probed_qp_that_failed_before_the_cap_doubles_the_next_first_wait() {
        let (first, max) = (Duration::from_millis(100), Duration::from_secs(30));
        let ms = Duration::from_millis;
        // Set-up opened the phase: start over.
        assert_eq!(super::next_backoff(first, max, None, ms(5)), first);
        // A re-probe after 400 ms opened it and it failed 1 s later: a flap.
        assert_eq!(
            super::next_backoff(first, max, Some(ms(400)), ms(1000)),
            ms(800)
        );
        // Capped.
        assert_eq!(
            super::next_backoff(first, max, Some(ms(20_000)), ms(10)),
            max
        );
        // It outlived the cap: start over.
        assert_eq!(super::next_backoff(first, max, Some(ms(400)), max), first);
        // The server's switches (no wait) still start at `first`.
        assert_eq!(
            super::next_backoff(first, max, Some(Duration::ZERO), ms(1)),
            first
        );
    }

    use super::*;

    fn msg(call_id: u64) -> Outgoing {
        tcp::control(Kind::Ping, call_id)
    }

    fn ids<'a>(it: impl Iterator<Item = &'a Outgoing>) -> Vec<u64> {
        it.map(|m| m.header.call_id).collect()
    }

    /// Messages 10..14 posted and not confirmed, 2 never posted: the peer's count decides which
    /// of the posted ones go again (it received 12: 10 and 11 must not run twice).
    #[test]
    fn only_messages_the_peer_did_not_receive_are_re_sent_then_the_unsent_in_order() {
        let unconfirmed: VecDeque<_> = (10..14).map(|s| (s, msg(s))).collect();
        let unsent = vec![msg(100), msg(101)];
        let got = ids(to_resend(&unconfirmed, &Default::default(), &[], &unsent, 14, 12).unwrap());
        assert_eq!(got, [12, 13, 100, 101]);
        let got = ids(to_resend(&unconfirmed, &Default::default(), &[], &unsent, 14, 10).unwrap());
        assert_eq!(got, [10, 11, 12, 13, 100, 101]);
        let got = ids(to_resend(&unconfirmed, &Default::default(), &[], &unsent, 14, 14).unwrap());
        assert_eq!(got, [100, 101]);
    }

    /// A count that contradicts this side's completions (below the first unconfirmed message:
    /// a confirmed one would be lost) or claims more than was sent closes the link.
    #[test]
    fn a_peer_count_below_the_confirmed_or_above_the_sent_is_refused() {
        let unconfirmed: VecDeque<_> = (10..14).map(|s| (s, msg(s))).collect();
        for peer in [0, 9, 15] {
            assert!(
                matches!(
                    to_resend(&unconfirmed, &Default::default(), &[], &[], 14, peer),
                    Err(FallbackError::Resync { .. })
                ),
                "peer count {peer}"
            );
        }
        assert_eq!(
            ids(to_resend(&VecDeque::new(), &Default::default(), &[], &[], 14, 14).unwrap()),
            [] as [u64; 0]
        );
        assert!(to_resend(&VecDeque::new(), &Default::default(), &[], &[], 14, 13).is_err());
    }

    /// Messages 5 and 8 were lent by rendezvous and never released; the peer counted 10
    /// messages and lists 5 as a hole (its READ was cut by the failure): 5 goes again, in
    /// number order among the unconfirmed ones; 8 was read (only its RELEASE was lost) and
    /// does not.
    #[test]
    fn lent_messages_go_again_when_the_peer_lists_them_as_holes_or_never_counted_them() {
        let unconfirmed: VecDeque<_> = (9..12).map(|s| (s, msg(s))).collect();
        let lent: std::collections::BTreeMap<u64, Outgoing> =
            [5, 8, 12].into_iter().map(|s| (s, msg(s))).collect();
        let unsent = vec![msg(100)];
        let got = ids(to_resend(&unconfirmed, &lent, &[5], &unsent, 13, 10).unwrap());
        assert_eq!(got, [5, 10, 11, 12, 100]);
        // Only lent messages outstanding: the peer's count may be as low as the oldest one.
        let none = VecDeque::new();
        let got = ids(to_resend(&none, &lent, &[], &[], 13, 5).unwrap());
        assert_eq!(got, [5, 8, 12]);
        assert!(to_resend(&none, &lent, &[], &[], 13, 4).is_err());
        assert!(parse_holes(&[0; 7]).is_err(), "a partial number");
        assert_eq!(
            parse_holes(&[&9u64.to_le_bytes()[..], &3u64.to_le_bytes()].concat()).unwrap(),
            [3, 9]
        );
    }
}
