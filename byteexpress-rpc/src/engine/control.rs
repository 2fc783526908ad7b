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
use std::time::Duration;

use byteexpress_tcp_fallback::{FrameError, FrameReader, FrameWriter};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;

use super::keepalive::{self, Liveness};
use super::rdma::failover::Handover;
use super::rdma::{self, Posted, RdmaParts};
use super::tcp::{self, Closer};
use super::{Dispatch, LinkTx};
use crate::link_state::{LinkEvent, LinkMachine};
use crate::message::{Incoming, Outgoing};
use crate::wire::header::{Header, Kind};
use crate::{Code, Status};

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

impl From<FallbackError> for Status {
    fn from(e: FallbackError) -> Status {
        let mut msg = format!("link fallback to TCP failed: {e}");
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            src = s.source();
        }
        Status::new(Code::Unavailable, msg)
    }
}

/// Longest wait for the peer's RESYNC once this side sent its own.
const RESYNC_LIMIT: Duration = Duration::from_secs(10);

/// Starts an RDMA link: its engine on `parts`, and the control connection `(r, w)` with its
/// keepalive and fallback. `machine` is in `Rdma`.
pub(crate) fn start_rdma<R, W>(
    parts: RdmaParts,
    (r, w): (FrameReader<R>, FrameWriter<W>),
    dispatch: Arc<dyn Dispatch>,
    posted: Posted,
    live: Liveness,
    machine: LinkMachine,
) -> LinkTx
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (dead_tx, dead_rx) = oneshot::channel();
    let (ho_tx, ho_rx) = oneshot::channel();
    let link = rdma::spawn(parts, posted, dispatch.clone(), dead_rx, machine, ho_tx);
    tokio::spawn(run(r, w, live, dispatch, link.clone(), dead_tx, ho_rx));
    link
}

/// What ended the RDMA phase of the control connection.
enum End {
    /// The link closes, for this reason.
    Close(Status),
    /// The link falls back; the peer's RESYNC count when it came first.
    FallBack(Option<u64>),
}

async fn write_msg<W: AsyncWrite + Unpin>(
    w: &mut FrameWriter<W>,
    m: &Outgoing,
) -> Result<(), FrameError> {
    let h = m.final_header().encode();
    w.write_frame(&[&h, &m.meta, &m.body]).await
}

async fn run<R, W>(
    mut r: FrameReader<R>,
    mut w: FrameWriter<W>,
    live: Liveness,
    dispatch: Arc<dyn Dispatch>,
    link: LinkTx,
    dead_tx: oneshot::Sender<Status>,
    mut ho_rx: oneshot::Receiver<Handover>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (ping_tx, mut ping_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let mut handover = None;
    let end = {
        let watcher = keepalive::watch(&link, live, &*dispatch, move |n| {
            let _ = ping_tx.send(n);
        });
        tokio::pin!(watcher);
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
                            break End::FallBack(Some(msg.header.call_id));
                        }
                        Ok(msg) => break End::Close(tcp::peer_error(&msg)),
                        Err(e) => break End::Close(unavailable(format!("control channel: {e}"))),
                    },
                    Ok(None) => break End::Close(unavailable("peer closed the control connection")),
                    Err(e) => break End::Close(unavailable(format!("control connection: {e}"))),
                },
                Some(n) = ping_rx.recv() => tcp::control(Kind::Ping, n),
                why = &mut watcher => break End::Close(why),
                h = &mut ho_rx => match h {
                    Ok(h) => {
                        handover = Some(h);
                        break End::FallBack(None);
                    }
                    // The engine closed the link.
                    Err(_) => break End::Close(unavailable("link closed")),
                },
                _ = link.close_requested() => break End::Close(unavailable("link closed")),
            };
            let h = reply.final_header().encode();
            if let Err(e) = w.write_frame(&[&h]).await {
                break End::Close(unavailable(format!("control connection: {e}")));
            }
            if let Err(e) = w.flush().await {
                break End::Close(unavailable(format!("control connection: {e}")));
            }
        }
    };
    let peer_count = match end {
        End::Close(why) => {
            let _ = dead_tx.send(why);
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
    match fall_back(&mut r, &mut w, handover, peer_count, &link).await {
        Ok(rx) => tcp::resume(r, w, rx, link, dispatch, closer, live),
        Err(e) => {
            tracing::warn!(error = %e, "link fallback failed");
            closer.close(e.into());
            let _ = w.shutdown().await;
        }
    }
}

/// Steps 1 and 2 of the module docs; returns the callers' channel for the TCP engine.
async fn fall_back<R, W>(
    r: &mut FrameReader<R>,
    w: &mut FrameWriter<W>,
    h: Handover,
    peer_count: Option<u64>,
    link: &LinkTx,
) -> Result<tokio::sync::mpsc::UnboundedReceiver<Outgoing>, FallbackError>
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
    w.write_frame(&[&resync.encode()])
        .await
        .map_err(FallbackError::Io)?;
    w.flush().await.map_err(FallbackError::Io)?;
    let peer = match peer_count {
        Some(p) => p,
        None => tokio::time::timeout(RESYNC_LIMIT, read_resync(r, w))
            .await
            .map_err(|_| FallbackError::Timeout(RESYNC_LIMIT))??,
    };
    link.touch();
    let mut resent = 0u64;
    for m in to_resend(&unconfirmed, &unsent, sent, peer)? {
        write_msg(w, m).await.map_err(FallbackError::Io)?;
        resent += 1;
    }
    w.flush().await.map_err(FallbackError::Io)?;
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
    Ok(rx)
}

/// The messages to re-send over TCP, in order, once the peer said it received `peer` of the
/// `sent` messages this side numbered: those of `unconfirmed` (numbered, posted, not confirmed
/// by a SEND completion; oldest first) numbered `peer` or above, then every one of `unsent`.
/// A count below the first unconfirmed number (a message this side's completions confirmed
/// would be lost) or above `sent` is refused.
fn to_resend<'a>(
    unconfirmed: &'a VecDeque<(u64, Outgoing)>,
    unsent: &'a [Outgoing],
    sent: u64,
    peer: u64,
) -> Result<impl Iterator<Item = &'a Outgoing>, FallbackError> {
    let confirmed = unconfirmed.front().map_or(sent, |(s, _)| *s);
    if peer < confirmed || peer > sent {
        return Err(FallbackError::Resync {
            peer,
            sent,
            confirmed,
        });
    }
    Ok(unconfirmed
        .iter()
        .filter(move |(s, _)| *s >= peer)
        .map(|(_, m)| m)
        .chain(unsent))
}

/// Reads the control connection up to the peer's RESYNC (answering PINGs on the way) and
/// returns its count.
async fn read_resync<R, W>(
    r: &mut FrameReader<R>,
    w: &mut FrameWriter<W>,
) -> Result<u64, FallbackError>
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
        let h = Header::decode(&frame).map_err(FallbackError::Garbage)?;
        match h.kind {
            Kind::Resync => return Ok(h.call_id),
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

fn unavailable(msg: impl std::fmt::Display) -> Status {
    Status::new(Code::Unavailable, msg.to_string())
}

#[cfg(test)]
mod tests {
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
        let got = ids(to_resend(&unconfirmed, &unsent, 14, 12).unwrap());
        assert_eq!(got, [12, 13, 100, 101]);
        let got = ids(to_resend(&unconfirmed, &unsent, 14, 10).unwrap());
        assert_eq!(got, [10, 11, 12, 13, 100, 101]);
        let got = ids(to_resend(&unconfirmed, &unsent, 14, 14).unwrap());
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
                    to_resend(&unconfirmed, &[], 14, peer),
                    Err(FallbackError::Resync { .. })
                ),
                "peer count {peer}"
            );
        }
        assert_eq!(
            ids(to_resend(&VecDeque::new(), &[], 14, 14).unwrap()),
            [] as [u64; 0]
        );
        assert!(to_resend(&VecDeque::new(), &[], 14, 13).is_err());
    }
}
