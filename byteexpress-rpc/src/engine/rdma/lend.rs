//! The sending side of a rendezvous ([`crate::wire::rendezvous`]): a message larger than
//! `Config::rendezvous_threshold` is copied once into registered memory of the link's PD, lent
//! to the peer for READ over exactly its bytes (a memory window bound in QP order where the
//! device bounds windows by their range, else an MR of its own), and announced by one
//! descriptor SEND. The loan ends at the peer's RELEASE: a SEND_WITH_INV that invalidated the
//! window, or (per-message MR) the deregistration here. A peer that never releases holds the
//! memory of the messages sent to it until its link ends, as it could by not reading TCP.

use std::collections::{HashMap, VecDeque};

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
}

/// One message lent to the peer.
#[derive(Debug)]
struct Loan {
    /// Its number among the messages of this direction (kept in `Seqs::lent` until released).
    seq: u64,
    rkey: u32,
    /// The window the rkey belongs to (bound over the message's bytes), if lent by window.
    mw: Option<Mw>,
    /// The per-message MR, if lent by MR; dropped (deregistered) at the release.
    _mr: Option<Mr>,
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
    /// Windows invalidated by a RELEASE, free to bind again.
    free_mws: Vec<Mw>,
    next_wr: u64,
}

impl Lender {
    pub(crate) fn new(cfg: LendConfig) -> Self {
        Lender {
            cfg,
            waiting: VecDeque::new(),
            loans: HashMap::new(),
            next_token: 1,
            free_mws: Vec::new(),
            next_wr: 0,
        }
    }

    /// Takes `m` for a rendezvous when it is one (an application message above the
    /// threshold): queued to be lent, `None` returned; else `Some(m)`.
    pub(super) fn divert(&mut self, m: Outgoing) -> Option<Outgoing> {
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
        while !self.lender.waiting.is_empty() {
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
                .and_then(|(buf, len)| self.lend_key(&buf, len).map(|k| (buf, len, k)));
            let (buf, len, key) = match prepared {
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
                Key::Window(mw) => match self.bind(&mw, &buf, len) {
                    Ok(()) => (mw.rkey(), Some(mw), None),
                    Err(e) => {
                        let _ = self.release(wire, 0);
                        return Err(e);
                    }
                },
            };
            let Some(pb) = self.credits.try_send_data_batch(1) else {
                let _ = self.release(wire, 0);
                return Err(EngineError::CreditVanished);
            };
            let token = self.lender.next_token;
            self.lender.next_token += 1;
            let desc = Descriptor {
                addr: buf.addr(),
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
            .and_then(|b| self.post(b, wire, Some(seq), WrOp::Send));
            if let Err(e) = sent {
                self.seqs.sent(Some(seq), m, false);
                return Err(e);
            }
            self.seqs.lent(seq, m);
            self.lender.loans.insert(
                token,
                Loan {
                    seq,
                    rkey,
                    mw,
                    _mr: mr,
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

    /// What will grant the peer REMOTE_READ over the `len` bytes of `buf`: a window to bind
    /// (a free one, or a new one) or an MR of exactly those bytes.
    fn lend_key(&mut self, buf: &LargeBuf, len: usize) -> Result<Key, LendError> {
        if !self.lender.cfg.windows {
            let mr = buf
                .lend(0, len, Access::REMOTE_READ)
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
                .map(Key::Window)
                .map_err(LendError::Window),
        }
    }

    /// Binds `mw` over the `len` bytes of `buf`, REMOTE_READ only, posted before the
    /// descriptor SEND so that it executes first (QP order).
    fn bind(&mut self, mw: &Mw, buf: &LargeBuf, len: usize) -> Result<(), EngineError> {
        self.queues.try_post_send().map_err(EngineError::Queues)?;
        self.lender.next_wr += 1;
        let wr = SendWr {
            wr_id: (u64::from(LEND_TAG) << 56) | (self.lender.next_wr & ((1 << 56) - 1)),
            op: WrOp::BindMw(MwBind {
                mw,
                mr: buf.mr(),
                addr: buf.addr(),
                len: len as u64,
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
        LinkCounters::bump(&self.counters.messages_released);
        if let Some(mw) = loan.mw {
            if wc.invalidated_rkey != Some(loan.rkey) {
                return Err(EngineError::Garbled(WireError(format!(
                    "RELEASE of loan {} did not invalidate its window",
                    h.call_id
                ))));
            }
            self.lender.free_mws.push(mw);
        }
        Ok(())
    }
}

/// What grants the peer its READ of one loan.
enum Key {
    Mr(Mr),
    Window(Mw),
}

/// A buffer of the lend pool holding `m`'s metadata + body; with its length.
fn lend_copy(pool: &LargePool, m: &Outgoing) -> Result<(LargeBuf, usize), LendError> {
    let len = m.meta.len() + m.body.len();
    let mut buf = pool.alloc(len).map_err(LendError::Memory)?;
    buf.fill(&[&m.meta, &m.body]).map_err(LendError::Memory)?;
    Ok((buf, len))
}
