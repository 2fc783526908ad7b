//! The receiving side of a rendezvous ([`crate::wire::rendezvous`]): a descriptor SEND names
//! the peer's lent bytes; they are RDMA READ into a buffer of this side's read pool in pieces
//! of at most [`ReadConfig::piece`] bytes, each admitted by the READ gates
//! (`byteexpress_flow::gate::admit_read`: SQ slot, CQ entry, outstanding READs, the QP and
//! device windows, charged like SENDs), descriptors served in arrival order. When the last
//! piece completes, the message reaches the application as a slice of that buffer (zero copy)
//! and a RELEASE goes back: a SEND_WITH_INV of the window's rkey when the descriptor says so.
//!
//! The buffer is charged to the memory budget when the descriptor arrives; a message the
//! budget (or the read pool) cannot take is never read: its call gets RESOURCE_EXHAUSTED and
//! the RELEASE goes at once.

use std::collections::VecDeque;

use foldhash::{HashMap, HashMapExt};
use std::time::Instant;

use byteexpress_flow::gate::{self, Room};
use byteexpress_mem::{LargeBuf, LargePool};
use byteexpress_verbs::{SendWr, WrOp};
use bytes::Bytes;

use super::{Engine, READ_TAG};
use crate::budget::Charge;
use crate::error::EngineError;
use crate::link_stats::LinkCounters;
use crate::message::{Incoming, Outgoing};
use crate::wire::header::{Header, Kind};
use crate::wire::rendezvous::{Descriptor, FLAG_RENDEZVOUS};

/// How a link READs.
#[derive(Debug)]
pub(crate) struct ReadConfig {
    /// Where bodies are read into (LOCAL_WRITE, local only).
    pub pool: LargePool,
    /// Largest READ WR in bytes: `DeviceAttr::max_msg_sz`, at most [`READ_PIECE`].
    pub piece: u64,
    /// READs outstanding at most (`DeviceAttr::max_reads_outstanding`).
    pub max_reads: u32,
}

/// The smallest READ piece (bytes) a small window cuts bodies into.
const MIN_READ_PIECE: u64 = 64 << 10;

/// Bit 32 of a RELEASE's `timeout_us`: the SEND is a SEND_WITH_INV of the rkey in bits 0–31.
pub(crate) const RELEASE_INVALIDATES: u64 = 1 << 32;

/// Bytes per READ WR at most, large enough that a WR's own cost is lost in its bytes; a piece
/// is further held to half the QP's window (at least [`MIN_READ_PIECE`]), so READs and SENDs
/// share the window rather than a piece going alone and holding every SEND back.
pub(crate) const READ_PIECE: u64 = 1 << 20;

/// One message being read.
#[derive(Debug)]
struct Pending {
    /// Its header, [`FLAG_RENDEZVOUS`] cleared.
    header: Header,
    desc: Descriptor,
    /// Its number in the peer's direction (reported as a hole if the QP fails first).
    seq: u64,
    /// Metadata + body bytes.
    len: u64,
    /// Offset in `target` of the first byte: the lent bytes' page offset where the buffer has
    /// room for it, so each READ copies in step with its source (DESIGN.md 6.24); else 0.
    start: usize,
    /// Bytes whose READ was posted, and completed.
    posted: u64,
    done: u64,
    target: LargeBuf,
    _charge: Option<Charge>,
    /// A CANCEL of its call came while it was being read: it is released, not delivered.
    cancelled: bool,
}

/// The reading side's state on one QP.
#[derive(Debug)]
pub(crate) struct Reader {
    pub(super) cfg: ReadConfig,
    pending: HashMap<u64, Pending>,
    /// Ids of pending messages with bytes left to post, in arrival order.
    queue: VecDeque<u64>,
    next_id: u64,
    /// READ WRs posted: wr_id → (message id, bytes, when posted).
    in_flight: HashMap<u64, (u64, u64, Instant)>,
    next_wr: u64,
}

impl Reader {
    pub(crate) fn new(cfg: ReadConfig) -> Self {
        Reader {
            cfg,
            pending: HashMap::new(),
            queue: VecDeque::new(),
            next_id: 0,
            in_flight: HashMap::new(),
            next_wr: 0,
        }
    }

    /// Numbers (in the peer's direction) of the messages whose descriptor arrived and whose
    /// bytes were not all read: after a QP failure the peer sends them again over TCP.
    pub(crate) fn holes(&self) -> Vec<u64> {
        let mut h: Vec<u64> = self.pending.values().map(|p| p.seq).collect();
        h.sort_unstable();
        h
    }

    /// The peer cancelled call `key`: a message of it still being read is dropped when read
    /// (a CANCEL overtakes the REQUEST it cancels while the REQUEST's body is READ).
    pub(crate) fn cancel(&mut self, key: (u32, u64)) {
        for p in self.pending.values_mut() {
            if (p.header.conn_id, p.header.call_id) == key {
                p.cancelled = true;
            }
        }
    }

    /// Window bytes held by READs posted and not completed.
    pub(crate) fn charged(&self) -> u64 {
        self.in_flight.values().map(|&(_, b, _)| b).sum()
    }
}

impl Engine {
    /// A descriptor SEND arrived (`h` its header, number `seq`): checks the announced size
    /// against `max_message`, takes a buffer of the read pool and charges the budget its whole
    /// capacity (at least a 2 MiB region however small the message), and queues its READs. A
    /// message over `max_message`, or refused for memory, is never read: its call fails
    /// RESOURCE_EXHAUSTED (only that call) and the loan is released at once.
    pub(super) fn on_descriptor(
        &mut self,
        mut h: Header,
        desc: Descriptor,
        seq: u64,
    ) -> Result<(), EngineError> {
        h.flags &= !FLAG_RENDEZVOUS;
        let len = u64::from(h.meta_len).saturating_add(h.body_len);
        let max = self.parts.max_message as u64;
        if h.message_len() > max {
            let why = crate::Status::new(
                crate::Code::ResourceExhausted,
                format!(
                    "message of {} bytes refused: more than the receiver's max_message of \
                     {max} bytes",
                    h.message_len()
                ),
            );
            self.dispatch.refused(&self.link, &h, why);
            self.queue_release(&h, &desc);
            return Ok(());
        }
        let budget = self.dispatch.budget().clone();
        let taken = usize::try_from(len.max(1))
            .ok()
            .and_then(|n| self.reader.cfg.pool.alloc(n).ok())
            .and_then(|t| budget.try_take(t.capacity()).map(|c| (t, c)));
        let Some((target, charge)) = taken else {
            let why = budget.refusal(h.message_len());
            self.dispatch.refused(&self.link, &h, why);
            self.queue_release(&h, &desc);
            return Ok(());
        };
        let start = target.offset_in_step(desc.addr, 0, len as usize);
        let id = self.reader.next_id;
        self.reader.next_id += 1;
        self.reader.pending.insert(
            id,
            Pending {
                header: h,
                desc,
                seq,
                len,
                start,
                posted: 0,
                done: 0,
                target,
                _charge: Some(charge),
                cancelled: false,
            },
        );
        if len == 0 {
            return self.finish_read(id);
        }
        self.reader.queue.push_back(id);
        Ok(())
    }

    /// Posts READ pieces, oldest message first, while the READ gates admit them. True when
    /// one was posted.
    pub(super) fn post_reads(&mut self) -> Result<bool, EngineError> {
        let mut posted = false;
        while let Some(&id) = self.reader.queue.front() {
            let p = &self.reader.pending[&id];
            // At most half the QP's window, so READs and SENDs share it (a piece larger than
            // the window would go alone, and hold every SEND back meanwhile).
            let share = (self.parts.window.cap() / 2).max(MIN_READ_PIECE);
            let piece = (p.len - p.posted).min(self.reader.cfg.piece).min(share);
            let room = Room::new(
                &self.queues,
                &self.credits,
                self.parts.send_pool.available(),
            );
            let outstanding = self.reader.in_flight.len() as u32;
            {
                let mut dev = self.parts.device_window.lock();
                match gate::admit_read(
                    &room,
                    outstanding,
                    self.reader.cfg.max_reads,
                    &self.parts.window,
                    &dev,
                    piece,
                ) {
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
            if let Err(e) = self.queues.try_post_send() {
                let _ = self.release(piece, 0);
                return Err(EngineError::Queues(e));
            }
            let p = self
                .reader
                .pending
                .get_mut(&id)
                .expect("queued ids are pending");
            let off = p.posted;
            let sge = p
                .target
                .sge(p.start + off as usize, piece as u32)
                .expect("pieces lie inside the target, which holds len bytes");
            self.reader.next_wr += 1;
            let wr_id = (u64::from(READ_TAG) << 56) | (self.reader.next_wr & ((1 << 56) - 1));
            let wr = SendWr {
                wr_id,
                op: WrOp::Read {
                    remote_addr: p.desc.addr.wrapping_add(off),
                    rkey: p.desc.rkey,
                },
                sg_list: &[sge],
                signaled: true,
                inline: false,
            };
            if let Err(e) = self.parts.qp.post_send(&wr) {
                let _ = self.release(piece, 0);
                self.qp_failed
                    .get_or_insert(super::failover::QpFault::PostSend(e));
                return Err(EngineError::QpFailed("post_send (READ)"));
            }
            p.posted += piece;
            if p.posted == p.len {
                self.reader.queue.pop_front();
            }
            self.reader
                .in_flight
                .insert(wr_id, (id, piece, Instant::now()));
            LinkCounters::bump(&self.counters.reads_posted);
            posted = true;
        }
        Ok(posted)
    }

    /// A READ completed successfully (`wr_id`): its bytes leave the windows; the message is
    /// delivered when it was its last. An unknown wr_id is this side's bug.
    pub(super) fn on_read_done(&mut self, wr_id: u64) -> Result<(), EngineError> {
        let Some((id, bytes, at)) = self.reader.in_flight.remove(&wr_id) else {
            return Err(EngineError::UnknownWr(wr_id));
        };
        let rtt = if self.parts.window.adaptive_config().is_some() {
            at.elapsed().as_micros() as u64
        } else {
            0
        };
        self.release(bytes, rtt)?;
        let p = self
            .reader
            .pending
            .get_mut(&id)
            .expect("in-flight READs are pending");
        p.done += bytes;
        if p.done == p.len {
            self.finish_read(id)?;
        }
        Ok(())
    }

    /// Every byte of message `id` is here: delivers it from its buffer and releases the loan.
    fn finish_read(&mut self, id: u64) -> Result<(), EngineError> {
        let mut p = self.reader.pending.remove(&id).expect("pending");
        let (start, end) = (p.start, p.start + p.len as usize);
        p.target.set_len(end);
        let bytes: Bytes = p.target.freeze();
        let body_at = start + p.header.meta_len as usize;
        let msg = Incoming {
            header: p.header,
            meta: bytes.slice(start..body_at),
            body: bytes.slice(body_at..end),
        };
        self.queue_release(&p.header, &p.desc);
        LinkCounters::bump(&self.counters.messages_read);
        if p.cancelled {
            return Ok(());
        }
        self.deliver(msg)
    }

    /// Queues the RELEASE of the loan `desc` names (a SEND_WITH_INV of its window's rkey when
    /// it is one), among the link's small messages.
    fn queue_release(&mut self, h: &Header, desc: &Descriptor) {
        let mut header = Header::new(Kind::Release);
        header.conn_id = h.conn_id;
        header.call_id = desc.token;
        if desc.window() {
            header.timeout_us = RELEASE_INVALIDATES | u64::from(desc.rkey);
        }
        self.outbox.push(Outgoing {
            header,
            meta: Vec::new(),
            body: Bytes::new(),
        });
    }
}
