//! The QP scheduler: DRR per class, capped latency priority, chunking.

use super::flow::{NIL, Pending, Round, Slot};
use super::{Chunks, Class, ConnId, Dropped, Grant, MsgId, Offer, SchedConfig, SchedError};

/// Schedules the chunks of many logical connections onto one QP. Rules: [module
/// docs](super).
///
/// Cost: connections live in a slab addressed by [`ConnId::index`]; each class's round is an
/// intrusive list of slab indices, so `enqueue` and `next` do no search and no hashing, and
/// add a connection's quantum once per turn. Queues grow on demand and keep their capacity,
/// so a warm scheduler does not allocate on the hot path (`enqueue` + `next`).
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedConfig,
    slots: Vec<Slot>,
    free: Vec<u32>,
    rounds: [Round; 2],
    next_msg: u64,
    /// Latency grants since the last bulk grant, counted while bulk was backlogged.
    latency_streak: u32,
}

impl Scheduler {
    /// An empty scheduler.
    pub fn new(cfg: SchedConfig) -> Self {
        Self {
            cfg,
            slots: Vec::new(),
            free: Vec::new(),
            rounds: [Round::default(), Round::default()],
            next_msg: 0,
            latency_streak: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> SchedConfig {
        self.cfg
    }

    /// Opens a logical connection.
    pub fn open(&mut self) -> ConnId {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(Slot::default());
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 connections")
            }
        };
        ConnId {
            slot,
            generation: self.slots[slot as usize].generation,
        }
    }

    /// Closes a connection, dropping its queued messages (their unsent bytes are reported).
    /// Chunks already granted are the caller's.
    ///
    /// # Errors
    /// [`SchedError::UnknownConn`] when `conn` is not open.
    pub fn close(&mut self, conn: ConnId) -> Result<Dropped, SchedError> {
        slot_mut(&mut self.slots, conn)?;
        let quantum = u64::from(self.cfg.quantum());
        let mut dropped = Dropped::default();
        for class in Class::ALL {
            let c = class.index();
            let round = &mut self.rounds[c];
            if !self.slots[conn.slot as usize].flows[c].is_empty() {
                round.remove(&mut self.slots, c, conn.slot, quantum);
            }
            let flow = std::mem::take(&mut self.slots[conn.slot as usize].flows[c]);
            let bytes: u64 = flow.unsent().sum();
            dropped.messages += flow.unsent().count() as u64;
            dropped.bytes += bytes;
        }
        let slot = &mut self.slots[conn.slot as usize];
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(conn.slot);
        Ok(dropped)
    }

    /// Queues a message of `len` bytes (wire bytes) on `conn` in `class`. Messages of one
    /// connection and class are granted in FIFO order.
    ///
    /// # Errors
    /// [`SchedError::EmptyMessage`] when `len` is 0, [`SchedError::UnknownConn`] when `conn`
    /// is not open.
    #[inline]
    pub fn enqueue(&mut self, conn: ConnId, class: Class, len: u64) -> Result<MsgId, SchedError> {
        if len == 0 {
            return Err(SchedError::EmptyMessage);
        }
        let id = MsgId(self.next_msg);
        let c = class.index();
        let flow = &mut slot_mut(&mut self.slots, conn)?.flows[c];
        let round = &mut self.rounds[c];
        if flow.push(Pending { id, len, sent: 0 }) {
            // Joins the round (its deficit is 0 outside it); into an empty round it starts
            // its turn at once, through the borrow already held.
            debug_assert_eq!(flow.deficit, 0);
            if round.is_empty() {
                flow.deficit = self.cfg.quantum().into();
                round.head = conn.slot;
            } else {
                self.slots[round.tail as usize].flows[c].next = conn.slot;
            }
            round.tail = conn.slot;
        }
        self.next_msg += 1;
        Ok(id)
    }

    /// Queues a message as [`Scheduler::enqueue`] does, except that when nothing is queued
    /// (on any connection, in any class) and the message fits one chunk, it is offered to
    /// `can_send(len, class)` at once and, if admitted, granted whole without being queued:
    /// the bypass of an idle scheduler (as a Linux qdisc bypasses its empty queue). The
    /// result, and the scheduler's state after, are those of `enqueue` followed by
    /// [`Scheduler::next_by_class`] when the bypass applies, and of `enqueue` alone otherwise
    /// (then call `next` as usual). `can_send` is called at most once.
    ///
    /// # Errors
    /// As [`Scheduler::enqueue`]: [`SchedError::EmptyMessage`], [`SchedError::UnknownConn`];
    /// nothing changes then.
    #[inline]
    pub fn offer(
        &mut self,
        conn: ConnId,
        class: Class,
        len: u64,
        can_send: impl FnOnce(u32, Class) -> bool,
    ) -> Result<Offer, SchedError> {
        if self.is_empty() && len != 0 && len <= u64::from(self.cfg.max_chunk()) {
            slot_mut(&mut self.slots, conn)?;
            // Fits one chunk: len <= max_chunk, a u32.
            if can_send(len as u32, class) {
                let msg = MsgId(self.next_msg);
                self.next_msg += 1;
                // Nothing is queued: no bulk backlog, so no latency streak.
                self.latency_streak = 0;
                return Ok(Offer::Granted(Grant {
                    conn,
                    class,
                    msg,
                    offset: 0,
                    len: len as u32,
                    last: true,
                }));
            }
        }
        self.enqueue(conn, class, len).map(Offer::Queued)
    }

    /// The next chunk to post, if `can_send(len)` (bytes) admits the chunk the rules
    /// designate; `None` when nothing is queued or the gate refused (then nothing changes and
    /// the same chunk is designated next time). A returned grant is dequeued: post it.
    ///
    /// `can_send` is called at most once; it may also perform the post (charge the window,
    /// take a credit) and answer whether it succeeded.
    #[inline]
    pub fn next(&mut self, can_send: impl FnOnce(u32) -> bool) -> Option<Grant> {
        self.next_by_class(|len, _| can_send(len))
    }

    /// As [`Scheduler::next`], the gate also told the designated chunk's class, so it can
    /// apply a per-class limit (such as
    /// [`Credits::can_send_bulk`](crate::credit::Credits::can_send_bulk)).
    #[inline]
    pub fn next_by_class(&mut self, can_send: impl FnOnce(u32, Class) -> bool) -> Option<Grant> {
        // Each class with its own DRR step, so that the class (its round and flow offsets) is
        // a constant there.
        match self.peek_class()? {
            Class::Latency => {
                let bulk = !self.rounds[1].is_empty();
                let grant = self.drr_next(Class::Latency, |len| can_send(len, Class::Latency))?;
                // One more latency grant in a row beside a bulk backlog (below latency_burst
                // before, so no overflow), else no streak.
                self.latency_streak = if bulk { self.latency_streak + 1 } else { 0 };
                Some(grant)
            }
            Class::Bulk => {
                let grant = self.drr_next(Class::Bulk, |len| can_send(len, Class::Bulk))?;
                self.latency_streak = 0;
                Some(grant)
            }
        }
    }

    /// The class whose chunk [`Scheduler::next`] designates now, `None` when nothing is
    /// queued: latency while it has messages and has not used its burst beside a bulk
    /// backlog, else bulk.
    #[inline]
    pub fn peek_class(&self) -> Option<Class> {
        let latency = !self.rounds[0].is_empty();
        let bulk = !self.rounds[1].is_empty();
        if latency && (!bulk || self.latency_streak < self.cfg.latency_burst()) {
            Some(Class::Latency)
        } else if bulk {
            Some(Class::Bulk)
        } else {
            None
        }
    }

    /// DRR step in one non-empty class.
    #[inline]
    fn drr_next(&mut self, class: Class, can_send: impl FnOnce(u32) -> bool) -> Option<Grant> {
        let c = class.index();
        let quantum = u64::from(self.cfg.quantum());
        let max_chunk = self.cfg.max_chunk();
        let round = &mut self.rounds[c];
        // The head's quantum for this turn is already in its deficit. If its head chunk does
        // not fit, the next connection's turn starts with a deficit of at least
        // quantum >= max_chunk, so its head chunk fits: at most one rotation. A connection in
        // the round has a head message (len >= 1).
        let mut slot = round.head;
        let mut s = &mut self.slots[slot as usize];
        let mut chunk = Chunks::at(s.flows[c].head.len, s.flows[c].head.sent, max_chunk);
        if u64::from(chunk.len) > s.flows[c].deficit {
            round.rotate(&mut self.slots, c, quantum);
            slot = round.head;
            s = &mut self.slots[slot as usize];
            chunk = Chunks::at(s.flows[c].head.len, s.flows[c].head.sent, max_chunk);
        }
        if !can_send(chunk.len) {
            return None;
        }
        let flow = &mut s.flows[c];
        let grant = Grant {
            conn: ConnId {
                slot,
                generation: s.generation,
            },
            class,
            msg: flow.head.id,
            offset: chunk.offset,
            len: chunk.len,
            last: chunk.last,
        };
        let len = u64::from(chunk.len);
        flow.deficit -= len;
        if !chunk.last {
            flow.head.sent += len;
        } else if flow.pop() {
            // The message is done: its `sent` needs no update, as `pop` replaced the head (or
            // marked it none). The queue emptied: the connection leaves the round.
            flow.deficit = 0;
            let next = std::mem::replace(&mut flow.next, NIL);
            round.pass_turn(&mut self.slots, c, next, quantum);
        }
        Some(grant)
    }

    /// Unsent bytes queued in `class` over all connections (unit: bytes). Walks the queues
    /// (O(messages queued in `class`)): the hot path keeps no running total.
    pub fn backlog(&self, class: Class) -> u64 {
        let c = class.index();
        self.rounds[c]
            .members(&self.slots, c)
            .map(|slot| self.slots[slot as usize].flows[c].unsent().sum::<u64>())
            .sum()
    }

    /// Connections with queued messages in `class` (walks the round: O(that number)).
    pub fn backlogged(&self, class: Class) -> usize {
        self.rounds[class.index()].len(&self.slots, class.index())
    }

    /// Whether nothing is queued in any class.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.rounds[0].is_empty() && self.rounds[1].is_empty()
    }

    /// Whether nothing is queued on `conn`, in any class (true for an unknown connection). O(1):
    /// a connection's queues are kept, so an idle one can stay open at the cost of its slab
    /// entry, its DRR state being reset whenever its queues empty.
    #[inline]
    pub fn is_idle(&self, conn: ConnId) -> bool {
        self.slot(conn)
            .is_none_or(|s| s.flows.iter().all(|f| f.is_empty()))
    }

    /// Unsent bytes queued on `conn` in `class` (unit: bytes); 0 for an unknown connection.
    pub fn queued_bytes(&self, conn: ConnId, class: Class) -> u64 {
        self.slot(conn)
            .map_or(0, |s| s.flows[class.index()].unsent().sum())
    }

    fn slot(&self, conn: ConnId) -> Option<&Slot> {
        self.slots
            .get(conn.slot as usize)
            .filter(|s| s.generation == conn.generation)
    }
}

/// The open slot `conn` names.
#[inline]
fn slot_mut(slots: &mut [Slot], conn: ConnId) -> Result<&mut Slot, SchedError> {
    slots
        .get_mut(conn.slot as usize)
        .filter(|s| s.generation == conn.generation)
        .ok_or(SchedError::UnknownConn(conn))
}
