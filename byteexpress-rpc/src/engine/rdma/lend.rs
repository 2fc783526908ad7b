//! The sending side of a rendezvous ([`crate::wire::rendezvous`]): a message larger than
//! `Config::rendezvous_threshold` is copied once into registered memory of the link's PD, lent
//! to the peer for READ over exactly its bytes (a memory window bound in QP order where the
//! device bounds windows by their range, else an MR of its own), and announced by one
//! descriptor SEND. The loan ends at the peer's RELEASE: a SEND_WITH_INV that invalidated the
//! window, or (per-message MR) the deregistration here. A peer that never releases holds the
//! memory of the messages sent to it until its link ends, as it could by not reading TCP.

use std::collections::VecDeque;

use foldhash::{HashMap, HashMapExt};

use byteexpress_flow::gate::{self, Room};
use byteexpress_flow::sched::Class;
use byteexpress_mem::{LargeBuf, LargePool};
use byteexpress_verbs::{Access, Mr, Mw, MwBind, Pd, SendWr, Wc, WrOp};

use super::{Engine, LEND_TAG, chunk_buf};
use crate::error::EngineError;
use crate::link_stats::LinkCounters;
use crate::message::Outgoing;
use crate::wire::WireError;
use crate::wire::header::{HEADER_LEN, Header};
use crate::wire::rendezvous::{DESC_WINDOW, DESCRIPTOR_LEN, Descriptor, FLAG_RENDEZVOUS};

/// What a link lends, and how.
#[derive(Debug)]
pub(crate) struct LendConfig {
    /// Messages whose wire length (header + metadata + body) exceeds this go by rendezvous;
    /// `None`: never (`Config::rendezvous_threshold` = 0, or chunks too small for a
    /// descriptor).
    pub threshold: Option<usize>,
    /// Memory lent for READ: readable-class regions of the link's PD.
    pub pool: LargePool,
    /// Lend through memory windows (`DeviceAttr::mw_range_checked`); else a per-message MR.
    pub windows: bool,
    /// The link's PD (windows are allocated in it).
    pub pd: Pd,
    /// Bytes lent and not released at most (`Config::memory_budget`): beyond it, messages
    /// wait for the peer's RELEASEs (one message always goes when nothing is lent), so a peer
    /// that never releases holds at most this much of our memory.
    pub max_lent: u64,
}

/// One message lent to the peer.
#[derive(Debug)]
struct Loan {
    /// Its number among the messages of this direction (kept in `Seqs::lent` until released).
    seq: u64,
    rkey: u32,
    /// The window the rkey belongs to (bound over the message's bytes), if lent by window,
    /// with the binds it has had.
    mw: Option<(Mw, u32)>,
    /// The per-message MR, if lent by MR; dropped (deregistered) at the release.
    _mr: Option<Mr>,
    /// Bytes lent.
    len: u64,
    // Last: the memory outlives the MR and the window.
    _buf: LargeBuf,
}

/// The lending side's state on one QP.
#[derive(Debug)]
pub(crate) struct Lender {
    pub(super) cfg: LendConfig,
    /// Messages waiting for the gates, oldest first.
    pub(super) waiting: VecDeque<Outgoing>,
    loans: HashMap<u64, Loan>,
    next_token: u64,
    /// Windows invalidated by a RELEASE, free to bind again, with the binds each had.
    free_mws: Vec<(Mw, u32)>,
    /// Bytes lent and not released.
    lent_bytes: u64,
    next_wr: u64,
}

/// Binds a window serves before it is deallocated: a bind changes only the rkey's low 8 bits,
/// so the 256th would give a released loan's rkey back to the same window.
const MW_BINDS: u32 = 255;

impl Lender {
    pub(crate) fn new(cfg: LendConfig) -> Self {
        Lender {
            cfg,
            waiting: VecDeque::new(),
            loans: HashMap::new(),
            next_token: 1,
            free_mws: Vec::new(),
            lent_bytes: 0,
            next_wr: 0,
        }
    }

    /// Takes `m` for a rendezvous when it is one (an application message above the
    /// threshold): queued to be lent, `None` returned; else `Some(m)`.
    pub(super) fn divert(&mut self, m: Outgoing) -> Option<Outgoing> {
        if m.header.kind == crate::wire::header::Kind::Cancel {
            // A call cancelled before its message was lent: the message never goes.
            let key = (m.header.conn_id, m.header.call_id);
            self.waiting
                .retain(|w| (w.header.conn_id, w.header.call_id) != key);
        }
        match self.cfg.threshold {
            Some(t) if m.wire_len() > t && m.header.kind.has_body() => {
                self.waiting.push_back(m);
                None
            }
            _ => Some(m),
        }
    }
}

/// Why lending one message failed; it then goes as chunks instead.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LendError {
    #[error("registered memory for the loan")]
    Memory(#[source] byteexpress_mem::MemError),
    #[error("memory window")]
    Window(#[source] byteexpress_verbs::Error),
}

impl Engine {
    /// Lends the waiting messages while the gates admit their WRs: a bind (by window) and the
    /// descriptor SEND, which passes the SEND gates (two SQ slots and CQ entries by window,
    /// one by MR; a send buffer; a credit; its 64 bytes in the windows). True when one went.
    pub(super) fn post_lends(&mut self) -> Result<bool, EngineError> {
        let mut posted = false;
        while let Some(next) = self.lender.waiting.front() {
            let len = (next.meta.len() + next.body.len()) as u64;
            let lent = self.lender.lent_bytes;
            if lent > 0 && lent.saturating_add(len) > self.lender.cfg.max_lent {
                // Wait for RELEASEs (completions of the peer's READs).
                break;
            }
            let wrs = if self.lender.cfg.windows { 2 } else { 1 };
            let room = Room::new(
                &self.queues,
                &self.credits,
                self.parts.send_pool.available(),
            );
            // Gates 1-4 as for one chunk, the bind's SQ slot and CQ entry besides (a bind
            // takes no buffer and no credit).
            let local = gate::sq_slot(room.sq_slots, wrs - 1)
                .and_then(|()| gate::cq_entry(room.send_cqes, wrs - 1))
                .and_then(|()| gate::admit_round(&room, 0));
            if let Err(g) = local {
                self.counters.refused(g);
                break;
            }
            let header_len = self
                .lender
                .waiting
                .front()
                .map_or(HEADER_LEN, |m| m.final_header().encoded_len());
            let wire = (header_len + DESCRIPTOR_LEN) as u64;
            {
                let mut dev = self.parts.device_window.lock();
                match gate::admit_chunk(&room, 0, Class::Latency, &self.parts.window, &dev, wire) {
                    Ok(a) => {
                        if self.parts.window.charge(&mut dev, a).over_cap {
                            LinkCounters::bump(&self.counters.window_escapes);
                        }
                    }
                    Err(g) => {
                        drop(dev);
                        self.counters.refused(g);
                        break;
                    }
                }
            }
            let m = self.lender.waiting.pop_front().expect("not empty");
            let prepared = lend_copy(&self.lender.cfg.pool, &m)
                .and_then(|(buf, at)| self.lend_key(&buf, at).map(|k| (buf, at, k)));
            let (buf, at, key) = match prepared {
                Ok(p) => p,
                Err(e) => {
                    tracing::debug!(error = %e, "rendezvous refused: the message goes as chunks");
                    self.release(wire, 0)?;
                    self.outbox.push(m);
                    continue;
                }
            };
            let (rkey, mw, mr) = match key {
                Key::Mr(mr) => (mr.rkey(), None, Some(mr)),
                Key::Window((mw, binds)) => match self.bind(&mw, &buf, at) {
                    Ok(()) => (mw.rkey(), Some((mw, binds + 1)), None),
                    Err(e) => {
                        // The link falls back: the message goes over TCP.
                        let _ = self.release(wire, 0);
                        self.seqs.unposted.push(m);
                        return Err(e);
                    }
                },
            };
            let Some(pb) = self.credits.try_send_data_batch(1) else {
                let _ = self.release(wire, 0);
                self.seqs.unposted.push(m);
                return Err(EngineError::CreditVanished);
            };
            let token = self.lender.next_token;
            self.lender.next_token += 1;
            let desc = Descriptor {
                addr: buf.addr() + at.start as u64,
                rkey,
                flags: if mw.is_some() { DESC_WINDOW } else { 0 },
                token,
            };
            let seq = self.seqs.next_sent();
            let mut header = m.final_header();
            header.flags |= FLAG_RENDEZVOUS;
            header.seq = seq as u16;
            let sent = chunk_buf(&self.parts, header, pb, |b| {
                b.extend_from_slice(&desc.encode())
            })
            .and_then(|b| self.post(b, wire, Some(seq), WrOp::Send, true));
            if let Err(e) = sent {
                let _ = self.release(wire, 0);
                self.seqs.sent(Some(seq), m, false);
                return Err(e);
            }
            self.seqs.lent(seq, m);
            let len = at.len as u64;
            self.lender.lent_bytes += len;
            self.lender.loans.insert(
                token,
                Loan {
                    seq,
                    rkey,
                    mw,
                    _mr: mr,
                    len,
                    _buf: buf,
                },
            );
            LinkCounters::bump(&self.counters.messages_lent);
            LinkCounters::bump(&self.counters.chunks_sent);
            self.counters.metrics.chunks_sent.increment(1);
            self.counters.metrics.bytes_sent.increment(wire);
            posted = true;
        }
        Ok(posted)
    }

    /// What will grant the peer REMOTE_READ over the bytes `at` of `buf`: a window to bind
    /// (a free one, or a new one) or an MR of exactly those bytes.
    fn lend_key(&mut self, buf: &LargeBuf, at: Placed) -> Result<Key, LendError> {
        if !self.lender.cfg.windows {
            let mr = buf
                .lend(at.start, at.len, Access::REMOTE_READ)
                .map_err(LendError::Memory)?;
            return Ok(Key::Mr(mr));
        }
        match self.lender.free_mws.pop() {
            Some(mw) => Ok(Key::Window(mw)),
            None => self
                .lender
                .cfg
                .pd
                .alloc_mw()
                .map(|mw| Key::Window((mw, 0)))
                .map_err(LendError::Window),
        }
    }

    /// Binds `mw` over the bytes `at` of `buf`, REMOTE_READ only, posted before the
    /// descriptor SEND so that it executes first (QP order).
    fn bind(&mut self, mw: &Mw, buf: &LargeBuf, at: Placed) -> Result<(), EngineError> {
        self.queues.try_post_send().map_err(EngineError::Queues)?;
        self.lender.next_wr += 1;
        let wr = SendWr {
            wr_id: (u64::from(LEND_TAG) << 56) | (self.lender.next_wr & ((1 << 56) - 1)),
            op: WrOp::BindMw(MwBind {
                mw,
                mr: buf.mr(),
                addr: buf.addr() + at.start as u64,
                len: at.len as u64,
                access: Access::REMOTE_READ,
            }),
            sg_list: &[],
            signaled: true,
            inline: false,
        };
        if let Err(e) = self.parts.qp.post_send(&wr) {
            self.qp_failed
                .get_or_insert(super::failover::QpFault::PostSend(e));
            return Err(EngineError::QpFailed("post_send (bind)"));
        }
        Ok(())
    }

    /// The peer's RELEASE (`h`, received in `wc`) of loan `h.call_id`: the loan ends; a window
    /// must have been invalidated by that SEND_WITH_INV. A RELEASE naming no loan, or one that
    /// left its window bound, is a protocol error of the link.
    pub(super) fn on_release(&mut self, h: &Header, wc: &Wc) -> Result<(), EngineError> {
        let Some(loan) = self.lender.loans.remove(&h.call_id) else {
            return Err(EngineError::Garbled(WireError(format!(
                "RELEASE of loan {}, which is not lent",
                h.call_id
            ))));
        };
        self.seqs.released(loan.seq);
        self.lender.lent_bytes -= loan.len;
        LinkCounters::bump(&self.counters.messages_released);
        if let Some((mw, binds)) = loan.mw {
            if wc.invalidated_rkey != Some(loan.rkey) {
                return Err(EngineError::Garbled(WireError(format!(
                    "RELEASE of loan {} did not invalidate its window",
                    h.call_id
                ))));
            }
            if binds < MW_BINDS {
                self.lender.free_mws.push((mw, binds));
            }
        }
        Ok(())
    }
}

/// What grants the peer its READ of one loan.
enum Key {
    Mr(Mr),
    /// A window and the binds it had.
    Window((Mw, u32)),
}

/// Where in its buffer a loan's bytes lie.
#[derive(Debug, Clone, Copy)]
struct Placed {
    /// Offset of the first lent byte (below `byteexpress_mem::IN_STEP`).
    start: usize,
    /// Bytes lent: metadata + body.
    len: usize,
}

/// A buffer of the lend pool holding `m`'s metadata + body, placed so that the body's copy
/// keeps the page offset of the application's bytes where the region has room for it
/// (`LargeBuf::offset_in_step`: a large copy out of step runs at a third of memcpy's speed
/// here, DESIGN.md 6.24); the reader READs into the same offset of its own buffer.
fn lend_copy(pool: &LargePool, m: &Outgoing) -> Result<(LargeBuf, Placed), LendError> {
    let len = m.meta.len() + m.body.len();
    let mut buf = pool.alloc(len).map_err(LendError::Memory)?;
    let start = buf.offset_in_step(m.body.as_ptr() as u64, m.meta.len(), len);
    buf.fill_at(start, &[&m.meta, &m.body])
        .map_err(LendError::Memory)?;
    Ok((buf, Placed { start, len }))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::Metadata;
    use crate::wire::header::Kind;

    fn lender() -> Lender {
        let ctx = byteexpress_verbs::soft_device()
            .expect("the soft device is always listed")
            .open()
            .expect("open");
        let pd = ctx.alloc_pd().expect("pd");
        Lender::new(LendConfig {
            threshold: Some(1000),
            pool: LargePool::new(&pd, Access(0), true, 0),
            windows: false,
            pd,
            max_lent: 1 << 20,
        })
    }

    fn msg(kind: Kind, call_id: u64, body: usize) -> Outgoing {
        Outgoing::new(
            kind,
            1,
            call_id,
            "/m",
            &Metadata::new(),
            Bytes::from(vec![0; body]),
        )
    }

    /// Regression: a CANCEL queued behind the REQUEST it cancels, while that one waited to
    /// be lent, went out first (descriptors are posted after the round's SENDs); the server
    /// dropped the CANCEL of a call it did not know and then ran the handler anyway.
    #[test]
    fn a_cancel_drops_its_message_still_waiting_to_be_lent_and_only_that_one() {
        let mut l = lender();
        assert!(l.divert(msg(Kind::Request, 7, 5000)).is_none(), "lent");
        assert!(l.divert(msg(Kind::Request, 8, 5000)).is_none(), "lent");
        assert!(
            l.divert(msg(Kind::Request, 9, 10)).is_some(),
            "small: a SEND"
        );
        let cancel = l.divert(msg(Kind::Cancel, 7, 0));
        assert!(cancel.is_some(), "the CANCEL itself still goes");
        let left: Vec<u64> = l.waiting.iter().map(|m| m.header.call_id).collect();
        assert_eq!(left, [8]);
    }
}
