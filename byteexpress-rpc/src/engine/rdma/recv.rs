//! The receive side of the engine: credits, re-posting, reassembly, delivery.

use byteexpress_flow::credit::{MsgKind, Piggyback};
use byteexpress_mem::PoolBuf;
use byteexpress_verbs::Wc;
use bytes::Bytes;

use super::reassembly::ReassemblyError;
use super::{Engine, post_recv};
use crate::config::SchedMode;
use crate::engine::tcp::peer_error;
use crate::error::EngineError;
use crate::link_stats::LinkCounters;
use crate::message::Incoming;
use crate::wire::header::{FLAG_SLOT_RETURN, Header, Kind};
use crate::wire::rendezvous::{Descriptor, FLAG_RENDEZVOUS};

impl Engine {
    pub(super) fn on_receive(&mut self, wc: &Wc) -> Result<(), EngineError> {
        let Some((buf, ())) = self.recv_posted.complete(wc) else {
            return Err(EngineError::UnknownWr(wc.wr_id));
        };
        let h = Header::decode(buf.as_slice()).map_err(EngineError::Garbled)?;
        self.counters
            .metrics
            .bytes_received
            .increment(u64::from(wc.byte_len));
        let kind = if h.kind == Kind::CreditUpdate {
            MsgKind::CreditUpdate
        } else {
            MsgKind::Data
        };
        let mut seq = 0;
        if h.kind != Kind::CreditUpdate && !h.more() {
            // This SEND completes a message: its number must be the next of the direction.
            let want = self.seqs.next_received();
            if h.seq != want as u16 {
                return Err(EngineError::OutOfOrder {
                    got: h.seq,
                    want: want as u16,
                });
            }
            seq = want;
        }
        let pb = Piggyback {
            credits: u32::from(h.credits),
            slot_return: h.flags & FLAG_SLOT_RETURN != 0,
        };
        self.credits
            .on_receive(kind, pb)
            .map_err(EngineError::PeerCredits)?;
        if h.kind == Kind::Release {
            // The peer read a message we lent it.
            self.repost(buf, kind)?;
            return self.on_release(&h, wc);
        }
        if h.flags & FLAG_RENDEZVOUS != 0 {
            // A descriptor: the message's bytes are to be READ from the peer.
            let desc = Descriptor::decode(&buf.as_slice()[h.encoded_len()..])
                .map_err(EngineError::Garbled)?;
            self.repost(buf, kind)?;
            return self.on_descriptor(h, desc, seq);
        }
        if h.more() || h.kind == Kind::Continuation {
            // A chunk: copied after the single-chunk messages polled with it.
            self.chunks.push_back((buf, h, kind));
            if self.parts.sched == SchedMode::Fifo {
                // No latency class: every chunk is copied as it is polled, in arrival order.
                self.copy_chunks(usize::MAX)?;
            }
            return Ok(());
        }
        if h.kind == Kind::Cancel {
            // It may overtake the REQUEST it cancels while that one's body is READ.
            self.reader.cancel((h.conn_id, h.call_id));
        }
        if matches!(h.kind, Kind::Cancel | Kind::Error) {
            // A cancel or an error may refer to a chunked message: keep their order.
            self.copy_chunks(usize::MAX)?;
        }
        let msg = self.keep_or_copy(buf, kind)?;
        self.deliver(Incoming::parse(msg).map_err(EngineError::Garbled)?)
    }

    /// Copies up to `limit` received chunks into their messages, oldest first, re-posts their
    /// buffers and delivers each message completed; the rest wait for the next round. Chunks
    /// are taken off the CQ with everything else, but copied only after the single-chunk
    /// messages polled with them were delivered (and their handlers or callers had a turn),
    /// and one per round, so a small call waits at the receiver behind at most one chunk copy
    /// (the receive side of the latency class), not behind every chunk that arrived before it.
    pub(super) fn copy_chunks(&mut self, limit: usize) -> Result<(), EngineError> {
        for _ in 0..limit {
            let Some((buf, h, kind)) = self.chunks.pop_front() else {
                break;
            };
            let done = self
                .reassembly
                .on_chunk(&h, &buf.as_slice()[h.encoded_len()..]);
            self.repost(buf, kind)?;
            for first in self.reassembly.take_refused() {
                let why = self.dispatch.budget().refusal(first.message_len());
                self.dispatch.refused(&self.link, &first, why);
            }
            match done {
                Ok(Some(msg)) => {
                    LinkCounters::bump(&self.counters.messages_reassembled);
                    self.counters.metrics.messages_reassembled.increment(1);
                    self.deliver(msg)?;
                }
                Ok(None) => {}
                Err(e @ ReassemblyError::TooLarge { .. }) => {
                    return Err(EngineError::TooLarge(e));
                }
                Err(e) => return Err(EngineError::Reassembly(e)),
            }
        }
        Ok(())
    }

    pub(super) fn deliver(&mut self, msg: Incoming) -> Result<(), EngineError> {
        match msg.header.kind {
            Kind::CreditUpdate => Ok(()),
            Kind::Error => Err(peer_error(&msg)),
            _ => {
                self.dispatch.incoming(&self.link, msg);
                self.delivered = true;
                Ok(())
            }
        }
    }

    /// Keeps `grant + 1` receives posted after a single-chunk message landed in `buf`. While
    /// more than one grant of free receive buffers remains, a fresh one is posted and the
    /// message stays where it landed (zero copy); below that, the application is holding on to
    /// received bodies, so the message is copied out and `buf` re-posted at once (counted in
    /// `LinkStats::copied_out`). The headroom of one grant means an application that keeps its
    /// bodies can never stop credits from flowing back to the peer.
    fn keep_or_copy(&mut self, buf: PoolBuf, kind: MsgKind) -> Result<Bytes, EngineError> {
        if self.parts.recv_pool.available() > self.parts.grant as usize
            && let Ok(fresh) = self.parts.recv_pool.alloc()
        {
            self.repost(fresh, kind)?;
            return Ok(buf.freeze());
        }
        LinkCounters::bump(&self.counters.copied_out);
        let copy = Bytes::copy_from_slice(buf.as_slice());
        self.repost(buf, kind)?;
        Ok(copy)
    }

    /// Posts `buf` as a receive in place of one of `kind` consumed, and counts it for the
    /// credits owed back to the peer. During a test stall ([`crate::test_hooks`]) the buffer
    /// is held instead, until [`Engine::release_held`].
    fn repost(&mut self, buf: PoolBuf, kind: MsgKind) -> Result<(), EngineError> {
        if self.draining {
            // The QP failed: nothing more is posted on it; the buffer goes back to the pool.
            return Ok(());
        }
        #[cfg(feature = "test-hooks")]
        if let Some(until) = self.link.faults().stalled_until() {
            self.link.faults().count_held();
            self.held.push((buf, kind));
            self.held_until = Some(until);
            return Ok(());
        }
        self.post_and_count(buf, kind)
    }

    /// Re-posts the buffers a test stall held, once it is over; true when it did.
    pub(super) fn release_held(&mut self) -> Result<bool, EngineError> {
        match self.held_until {
            Some(until) if until <= std::time::Instant::now() => {}
            _ => return Ok(false),
        }
        self.held_until = None;
        for (buf, kind) in std::mem::take(&mut self.held) {
            self.post_and_count(buf, kind)?;
        }
        Ok(true)
    }

    fn post_and_count(&mut self, buf: PoolBuf, kind: MsgKind) -> Result<(), EngineError> {
        self.queues.try_post_recv().map_err(EngineError::Queues)?;
        if let Err(e) = post_recv(&self.parts.qp, buf, &mut self.recv_posted) {
            self.qp_failed
                .get_or_insert(super::failover::QpFault::PostRecv(e));
            return Err(EngineError::QpFailed("post_recv"));
        }
        self.credits.on_reposted(kind).map_err(EngineError::Credits)
    }
}
