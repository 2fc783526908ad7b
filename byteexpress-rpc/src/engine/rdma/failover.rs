//! What the RDMA engine keeps so that a link outlives its QP, and what it hands over when the QP
//! fails (DESIGN.md 3.5, "Link life").
//!
//! - Messages are numbered per direction: the SEND that completes a message (a single-chunk
//!   message, or a last chunk) carries its number mod 2^16 in the header's `seq`
//!   (`wire::header`); the receiver counts the messages it received whole and checks the
//!   number. RC delivers SENDs in order, so the messages a side received are exactly the first
//!   `n` the peer completed, whatever the interleaving of chunks.
//! - A message whose completing SEND was posted stays here until that SEND's completion
//!   succeeds: then the peer's QP received it, and the peer delivers it even if its own QP
//!   fails right after (it drains its CQ before it resyncs).
//! - When the QP fails, [`Engine::hand_over`] moves it to ERR, drains the CQ (delivering every
//!   message received whole, copying the chunks deferred), and gives the fallback the count of
//!   messages received, the messages not confirmed (with their numbers), the messages not yet
//!   posted whole (in the outbox's order), the callers' channel, and the verbs objects, which
//!   keep every buffer still owned by a posted WR until its flush completion arrives (or the
//!   link ends).
//! - A fatal async event of the QP, its CQ or its device ([`super::async_watch`]) fails the
//!   QP as an error completion does. After `DeviceFatal` no flush ever comes: the hand-over
//!   does not wait for any, and the failed QP's objects and buffers are parked with the
//!   device context instead of reaped.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use byteexpress_mem::PostedSends;
use byteexpress_verbs::{Wc, WcOpcode, WcStatus};
use tokio::sync::mpsc;

use super::{Engine, Posted, RdmaParts, SendMeta};
use crate::message::Outgoing;

/// Why a link's QP was given up. Crate-private; becomes a `Status` only if the link closes.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QpFault {
    /// A work completion ended with an error status.
    #[error("RDMA completion {status:?} on wr {wr_id}")]
    Completion {
        /// The completion's status (RETRY_EXC_ERR, WR_FLUSH_ERR, ...).
        status: WcStatus,
        /// The WR it completed.
        wr_id: u64,
    },
    /// Posting a SEND failed.
    #[error("post_send failed")]
    PostSend(#[source] byteexpress_verbs::Error),
    /// Posting a receive failed.
    #[error("post_recv failed")]
    PostRecv(#[source] byteexpress_verbs::Error),
    /// Polling the CQ failed.
    #[error("poll_cq failed")]
    Poll(#[source] byteexpress_verbs::Error),
    /// Waiting on the CQ's completion channel failed.
    #[error("CQ wait failed")]
    CqWait(#[source] byteexpress_verbs::Error),
    /// The peer's RESYNC said its QP failed.
    #[error("the peer's QP failed")]
    PeerFellBack,
    /// A fatal asynchronous event named the QP, its CQ or its device
    /// (`ibv_get_async_event(3)`, [`super::async_watch`]).
    #[error("fatal async event {0:?}")]
    AsyncEvent(byteexpress_verbs::AsyncEvent),
}

impl QpFault {
    /// The device failed: no completion, not even a flush, will come from it.
    fn device_dead(&self) -> bool {
        matches!(
            self,
            QpFault::AsyncEvent(byteexpress_verbs::AsyncEvent::DeviceFatal)
        )
    }
}

/// The message numbers of one link's engine, and the messages sent and not yet confirmed.
#[derive(Debug, Default)]
pub(crate) struct Seqs {
    /// Messages whose completing SEND was posted (the next number to give).
    sent: u64,
    /// Messages received whole from the peer.
    received: u64,
    /// Messages posted and not yet confirmed by a successful SEND completion, oldest first.
    unconfirmed: VecDeque<(u64, Outgoing)>,
    /// Messages whose completing SEND was granted or built but never posted (a failed post).
    pub(super) unposted: Vec<Outgoing>,
    /// Completions polled but not handled when the QP failed (the failing one and the rest of
    /// its poll), for the drain.
    pub(super) polled: Vec<Wc>,
    /// Messages lent to the peer by rendezvous and not yet released, by number: the peer
    /// has them only once it has READ them (its RELEASE), whatever its count says.
    lent: std::collections::BTreeMap<u64, Outgoing>,
}

impl Seqs {
    /// Numbers continuing a link's counts on a new QP: `sent` = what the peer said it received
    /// (the rest went again over TCP), `received` = what this side received.
    pub(crate) fn starting_at(sent: u64, received: u64) -> Self {
        Seqs {
            sent,
            received,
            ..Seqs::default()
        }
    }

    /// The number of the message whose completing SEND is posted next.
    pub(super) fn next_sent(&mut self) -> u64 {
        let n = self.sent;
        self.sent += 1;
        n
    }

    /// Keeps `m` (number `seq`, when it got one) until its SEND is confirmed; `posted` false
    /// when its post failed: its number is given back (the engine posts nothing after a
    /// failed post, so it was the last one given), else the count of messages sent would
    /// include one the peer never got, and the resync would find the peer's count below the
    /// confirmed ones and close the link.
    pub(super) fn sent(&mut self, seq: Option<u64>, m: Outgoing, posted: bool) {
        match seq {
            Some(seq) if posted => self.unconfirmed.push_back((seq, m)),
            Some(seq) => {
                debug_assert_eq!(seq + 1, self.sent, "a failed post is the last numbered");
                self.sent = seq;
                self.unposted.push(m);
            }
            None => self.unposted.push(m),
        }
    }

    /// Keeps message `seq`, lent by rendezvous (its descriptor posted), until its RELEASE.
    pub(super) fn lent(&mut self, seq: u64, m: Outgoing) {
        self.lent.insert(seq, m);
    }

    /// The peer released message `seq`: it READ the message and delivered it.
    pub(super) fn released(&mut self, seq: u64) {
        self.lent.remove(&seq);
    }

    /// The SEND completing message `seq` succeeded: it and every earlier one (a QP completes
    /// its SENDs in order) reached the peer.
    pub(super) fn confirm(&mut self, seq: u64) {
        while self.unconfirmed.front().is_some_and(|(s, _)| *s <= seq) {
            self.unconfirmed.pop_front();
        }
    }

    /// The number the next message received whole must carry; counts it.
    pub(super) fn next_received(&mut self) -> u64 {
        let n = self.received;
        self.received += 1;
        n
    }
}

/// What a failed RDMA engine hands to the fallback.
pub(crate) struct Handover {
    /// Why the QP was given up.
    pub fault: QpFault,
    /// Messages received whole from the peer over RDMA (all delivered by now).
    pub received: u64,
    /// Messages whose completing SEND was posted.
    pub sent: u64,
    /// Messages posted and not confirmed, with their numbers, oldest first.
    pub unconfirmed: VecDeque<(u64, Outgoing)>,
    /// Messages never posted whole, in the order they were due.
    pub unsent: Vec<Outgoing>,
    /// Messages lent by rendezvous and not released, by number (the peer may not have READ
    /// them: it lists those it did not in its RESYNC).
    pub lent: std::collections::BTreeMap<u64, Outgoing>,
    /// Numbers of the peer's messages whose descriptor arrived but whose bytes were not all
    /// READ: the peer is to send them again.
    pub holes: Vec<u64>,
    /// The callers' channel.
    pub rx: mpsc::UnboundedReceiver<Outgoing>,
    /// The QP, CQ and buffers of posted WRs not yet flushed.
    pub remains: Remains,
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handover")
            .field("fault", &self.fault)
            .field("received", &self.received)
            .field("sent", &self.sent)
            .field("unconfirmed", &self.unconfirmed.len())
            .field("unsent", &self.unsent.len())
            .field("lent", &self.lent.len())
            .field("holes", &self.holes)
            .finish()
    }
}

/// The verbs objects of a failed QP, with the buffers its posted WRs still own. They are
/// neither reused nor freed until each WR's flush completion arrives ([`Remains::reap`]).
pub(crate) struct Remains {
    parts: RdmaParts,
    recv_posted: Posted,
    send_posted: PostedSends<SendMeta>,
    /// `awaiting_flush` is counted down as the flushes come.
    counters: std::sync::Arc<crate::link_stats::LinkCounters>,
    /// The device failed (`DeviceFatal`): no flush will come; the remains are parked with the
    /// device context instead of reaped ([`super::async_watch::park`]).
    device_dead: bool,
    /// Rendezvous state: lent memory (a peer may READ it until our QP is in ERR) and the
    /// buffers of READs posted (the device writes them until their flush): freed with the
    /// rest.
    _lender: super::lend::Lender,
    _reader: super::read::Reader,
}

/// How often [`Remains::reap`] polls for flush completions, and for how long in all before it
/// keeps the buffers until the link ends (a provider that never flushes WRs posted in ERR).
const REAP_EVERY: Duration = Duration::from_millis(5);
const REAP_FOR: Duration = Duration::from_secs(10);

impl Remains {
    /// WRs still outstanding.
    pub(crate) fn outstanding(&self) -> usize {
        self.recv_posted.len() + self.send_posted.len()
    }

    /// Takes the flush completions of the outstanding WRs, freeing each buffer as its WR
    /// completes; returns when none is left, after [`REAP_FOR`], or when `ended` resolves.
    /// Whatever is still outstanding then is dropped with the QP (a destroyed QP touches no
    /// buffer).
    pub(crate) async fn reap(mut self, ended: impl std::future::Future<Output = ()>) {
        if self.device_dead {
            tracing::debug!(
                outstanding = self.outstanding(),
                "failed QP parked until its device context closes"
            );
            let device = self.parts.device;
            super::async_watch::park(device, Box::new(self));
            return;
        }
        let t0 = Instant::now();
        tokio::pin!(ended);
        let mut wcs = [Wc::default(); 32];
        while self.outstanding() > 0 && t0.elapsed() < REAP_FOR {
            match self.parts.cq.poll(&mut wcs) {
                Ok(n) => {
                    for wc in &wcs[..n] {
                        self.take(wc);
                    }
                    if n > 0 {
                        continue;
                    }
                }
                Err(_) => break,
            }
            tokio::select! {
                _ = tokio::time::sleep(REAP_EVERY) => {}
                _ = &mut ended => break,
            }
        }
        tracing::debug!(outstanding = self.outstanding(), "failed QP released");
    }

    fn take(&mut self, wc: &Wc) {
        // A send completion also completes the earlier unsignaled SENDs still held (those
        // that succeeded silently before the QP failed).
        let done = match self.recv_posted.complete(wc) {
            Some(_) => 1,
            None => self.send_posted.complete(wc).count(),
        };
        self.counters
            .awaiting_flush
            .fetch_sub(done as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Polls of an empty CQ, 1 ms apart, that [`Engine::hand_over`] waits for the flushes of a
/// failed QP before it hands over (the rest are taken by [`Remains::reap`]).
const DRAIN_POLLS: u32 = 20;

impl Engine {
    /// The QP failed (`fault`): moves it to ERR, delivers what it received, and hands over.
    pub(super) async fn hand_over(
        mut self,
        rx: mpsc::UnboundedReceiver<Outgoing>,
        fault: QpFault,
    ) -> Handover {
        let in_err = self.parts.qp.to_err().is_ok();
        self.draining = true;
        // A failed device flushes nothing: its CQ is not waited on (what it had already
        // delivered was polled; the peer's count decides what goes again).
        let device_dead = fault.device_dead();
        // The drain WR (one send slot is kept for it): unsignaled SENDs that succeeded before
        // the QP failed never complete on their own, and its flush hands them back (before,
        // on rxe0, a failed QP's last unsignaled SENDs stayed held for good).
        if in_err && !device_dead {
            let meta = SendMeta {
                charged: 0,
                posted_at: Instant::now(),
                seq: None,
            };
            if let Err(why) = self.send_posted.post_drain(&self.parts.qp, meta) {
                tracing::debug!(%why, "drain WR refused on a failed QP");
            }
        }
        // Completions already in the CQ: successful receives are delivered (the peer counts
        // them as delivered once its SEND completed), successful SENDs confirmed, flushes
        // free their buffers. Chunks are copied as they come.
        for wc in std::mem::take(&mut self.seqs.polled) {
            self.drain_one(&wc);
        }
        let mut wcs = [Wc::default(); 32];
        let mut empty = 0;
        // Until every receive WR has completed (a flush comes after any success of the same
        // queue, so then nothing the peer counts as sent is left behind); send WRs need not
        // wait: the peer's count decides what goes again, and their buffers go to the reaper.
        let t0 = std::time::Instant::now();
        while !device_dead && empty < DRAIN_POLLS && !self.recv_posted.is_empty() {
            let n = match self.parts.cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(_) => break,
            };
            if n == 0 {
                empty += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
            for wc in &wcs[..n] {
                self.drain_one(wc);
            }
        }
        tracing::debug!(
            waited_us = t0.elapsed().as_micros() as u64,
            recv_left = self.recv_posted.len(),
            send_left = self.send_posted.len(),
            "failed QP drained"
        );
        let _ = self.copy_chunks(usize::MAX);
        // What the windows hold for SENDs never completed goes back (the device window is
        // shared with other links).
        self.release_windows();
        let mut unsent = std::mem::take(&mut self.seqs.unposted);
        unsent.extend(self.lender.waiting.drain(..));
        if let Some(m) = self.arrived.take() {
            self.outbox.push(m);
        }
        while let Some(n) = self.outbox.next(|_, _| true) {
            if n.last
                && let super::outbox::Source::Queued(id) = n.msg
                && let Some(m) = self.outbox.finish(id)
            {
                unsent.push(m.into_msg());
            }
        }
        let holes = self.reader.holes();
        let Engine {
            parts,
            recv_posted,
            send_posted,
            seqs,
            counters,
            lender,
            reader,
            ..
        } = self;
        counters.awaiting_flush.fetch_add(
            (recv_posted.len() + send_posted.len()) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        Handover {
            fault,
            received: seqs.received,
            sent: seqs.sent,
            unconfirmed: seqs.unconfirmed,
            unsent,
            lent: seqs.lent,
            holes,
            rx,
            remains: Remains {
                parts,
                recv_posted,
                send_posted,
                counters,
                device_dead,
                _lender: lender,
                _reader: reader,
            },
        }
    }

    /// One completion taken while draining a failed QP.
    fn drain_one(&mut self, wc: &Wc) {
        if wc.status == WcStatus::Success {
            match wc.opcode {
                WcOpcode::Recv => {
                    if let Err(why) = self.on_receive(wc) {
                        tracing::debug!(%why, "receive dropped while draining a failed QP");
                    }
                }
                // The last READ of a rendezvous body delivers it (it is then no hole).
                _ if wc.wr_id >> 56 == u64::from(super::READ_TAG) => {
                    if let Err(why) = self.on_read_done(wc.wr_id) {
                        tracing::debug!(%why, "READ dropped while draining a failed QP");
                    }
                }
                // A SEND's success confirms its message and those of the unsignaled SENDs
                // it covers.
                _ => {
                    let (mut last, mut charged) = (None, 0);
                    for d in self.send_posted.complete(wc) {
                        last = d.data.seq.or(last);
                        charged += d.data.charged;
                    }
                    if let Some(seq) = last {
                        self.seqs.confirm(seq);
                    }
                    self.release_drained(charged);
                }
            }
            return;
        }
        // A flush (or the first error): the WR's buffer is free now, and those of the
        // unsignaled SENDs before it (they completed silently). No message is confirmed: the
        // peer's count says which of them arrived.
        if self.recv_posted.complete(wc).is_none() {
            let charged = self.send_posted.complete(wc).map(|d| d.data.charged).sum();
            self.release_drained(charged);
        }
    }

    /// Gives back to the windows what SENDs taken off the failed QP's CQ held: the shared
    /// device window outlives this QP, and [`Engine::release_windows`] at the hand-over sums
    /// only the SENDs still held then (before, each SEND settled here kept its bytes charged
    /// to the device for the process's life: `selective_signaling.rs` checks the account is
    /// empty after a fallback).
    fn release_drained(&mut self, charged: u64) {
        if let Err(why) = self.release(charged, 0) {
            tracing::debug!(%why, "window release while draining a failed QP");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::header::Kind;

    fn msg(call_id: u64) -> Outgoing {
        Outgoing::new(
            Kind::Request,
            1,
            call_id,
            "/x",
            &crate::Metadata::new(),
            bytes::Bytes::new(),
        )
    }

    /// Regression: a message numbered and then refused by post_send (a dead device) counted
    /// as sent, so with nothing unconfirmed the link believed the peer had it and the resync
    /// closed the link ("the peer received 66 messages, but 67 were sent and the first 67
    /// confirmed"). Its number is given back; it goes again as unsent.
    #[test]
    fn a_message_whose_post_failed_is_not_counted_as_sent() {
        let mut seqs = Seqs::default();
        let a = seqs.next_sent();
        seqs.sent(Some(a), msg(1), true);
        seqs.confirm(a);
        let b = seqs.next_sent();
        seqs.sent(Some(b), msg(2), false);
        assert_eq!(seqs.sent, 1, "only the posted message is counted");
        assert!(seqs.unconfirmed.is_empty());
        assert_eq!(seqs.unposted.len(), 1);
        assert_eq!(seqs.next_sent(), 1, "the number is given again");
    }
}
