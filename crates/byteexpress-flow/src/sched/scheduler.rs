//! The QP scheduler: DRR per class, capped latency priority, chunking.

use super::flow::{Flow, Pending, Round};
use super::{Chunks, Class, ConnId, Dropped, Grant, MsgId, SchedConfig, SchedError};

/// A connection slot; `generation` tells reuses apart.
#[derive(Debug, Default)]
struct Slot {
    generation: u32,
    open: bool,
    flows: [Flow; 2],
}

/// Schedules the chunks of many logical connections onto one QP. Rules: [module
/// docs](super).
///
/// Allocation: queues grow on demand and keep their capacity, so a warm scheduler does not
/// allocate on the hot path (`enqueue` + `next`).
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
        let s = &mut self.slots[slot as usize];
        s.open = true;
        ConnId {
            slot,
            generation: s.generation,
        }
    }

    /// Closes a connection, dropping its queued messages (their unsent bytes are reported).
    /// Chunks already granted are the caller's.
    ///
    /// # Errors
    /// [`SchedError::UnknownConn`] when `conn` is not open.
    pub fn close(&mut self, conn: ConnId) -> Result<Dropped, SchedError> {
        let slot = slot_mut(&mut self.slots, conn)?;
        let mut dropped = Dropped::default();
        for class in Class::ALL {
            let flow = std::mem::take(&mut slot.flows[class.index()]);
            let bytes: u64 = flow.queue.iter().map(|p| p.len - p.sent).sum();
            dropped.messages += flow.queue.len() as u64;
            dropped.bytes += bytes;
            let round = &mut self.rounds[class.index()];
            round.backlog -= bytes;
            if flow.active {
                round.remove(conn.slot);
            }
        }
        slot.open = false;
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
        let flow = &mut slot_mut(&mut self.slots, conn)?.flows[class.index()];
        flow.queue.push_back(Pending { id, len, sent: 0 });
        let round = &mut self.rounds[class.index()];
        if !flow.active {
            flow.active = true;
            round.order.push_back(conn.slot);
        }
        round.backlog += len;
        self.next_msg += 1;
        Ok(id)
    }

    /// The next chunk to post, if `can_send(len)` (bytes) admits the chunk the rules
    /// designate; `None` when nothing is queued or the gate refused (then nothing changes and
    /// the same chunk is designated next time). A returned grant is dequeued: post it.
    ///
    /// `can_send` is called at most once; it may also perform the post (charge the window,
    /// take a credit) and answer whether it succeeded.
    pub fn next(&mut self, can_send: impl FnOnce(u32) -> bool) -> Option<Grant> {
        let latency = !self.rounds[0].order.is_empty();
        let bulk = !self.rounds[1].order.is_empty();
        let class = if latency && (!bulk || self.latency_streak < self.cfg.latency_burst()) {
            Class::Latency
        } else if bulk {
            Class::Bulk
        } else {
            return None;
        };
        let grant = self.drr_next(class, can_send)?;
        self.latency_streak = match class {
            Class::Latency if bulk => self.latency_streak + 1,
            _ => 0,
        };
        Some(grant)
    }

    /// DRR step in one non-empty class.
    #[inline]
    fn drr_next(&mut self, class: Class, can_send: impl FnOnce(u32) -> bool) -> Option<Grant> {
        let c = class.index();
        let quantum = u64::from(self.cfg.quantum());
        let max_chunk = self.cfg.max_chunk();
        // At most two iterations: a freshly charged connection holds a deficit of at least
        // quantum >= max_chunk, so its head chunk fits.
        loop {
            let round = &mut self.rounds[c];
            let slot = *round.order.front()?;
            let s = &mut self.slots[slot as usize];
            let generation = s.generation;
            let flow = &mut s.flows[c];
            if !round.charged {
                flow.deficit += quantum;
                round.charged = true;
            }
            let head = flow.queue.front_mut()?;
            let chunk = Chunks::at(head.len, head.sent, max_chunk);
            if u64::from(chunk.len) > flow.deficit {
                round.rotate();
                continue;
            }
            if !can_send(chunk.len) {
                return None;
            }
            let grant = Grant {
                conn: ConnId { slot, generation },
                class,
                msg: head.id,
                offset: chunk.offset,
                len: chunk.len,
                last: chunk.last,
            };
            head.sent += u64::from(chunk.len);
            flow.deficit -= u64::from(chunk.len);
            round.backlog -= u64::from(chunk.len);
            if chunk.last {
                flow.queue.pop_front();
                if flow.queue.is_empty() {
                    flow.deficit = 0;
                    flow.active = false;
                    round.leave_front();
                }
            }
            return Some(grant);
        }
    }

    /// Unsent bytes queued in `class` over all connections (unit: bytes).
    pub fn backlog(&self, class: Class) -> u64 {
        self.rounds[class.index()].backlog
    }

    /// Connections with queued messages in `class`.
    pub fn backlogged(&self, class: Class) -> usize {
        self.rounds[class.index()].order.len()
    }

    /// Whether nothing is queued in any class.
    pub fn is_empty(&self) -> bool {
        self.rounds.iter().all(|r| r.order.is_empty())
    }

    /// Unsent bytes queued on `conn` in `class` (unit: bytes); 0 for an unknown connection.
    pub fn queued_bytes(&self, conn: ConnId, class: Class) -> u64 {
        self.slot(conn).map_or(0, |s| {
            s.flows[class.index()]
                .queue
                .iter()
                .map(|p| p.len - p.sent)
                .sum()
        })
    }

    fn slot(&self, conn: ConnId) -> Option<&Slot> {
        self.slots
            .get(conn.slot as usize)
            .filter(|s| s.open && s.generation == conn.generation)
    }
}

/// The open slot `conn` names.
#[inline]
fn slot_mut(slots: &mut [Slot], conn: ConnId) -> Result<&mut Slot, SchedError> {
    slots
        .get_mut(conn.slot as usize)
        .filter(|s| s.open && s.generation == conn.generation)
        .ok_or(SchedError::UnknownConn(conn))
}
