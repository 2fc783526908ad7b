//! Per-connection, per-class queues and the DRR round of each class.
//!
//! The round of a class is an intrusive FIFO of connection slots: the [`Round`] holds the
//! head and tail slot indices and each [`Flow`] the index of the next slot in its round, so
//! joining, rotating and leaving the round are a few index writes with no allocation and no
//! search (only `close` walks the round). A connection's DRR quantum is added once per turn,
//! when it becomes the head of its round.

use super::MsgId;
use super::ring::{Queued, Ring};

/// "No slot": the end of a round, or an empty round.
pub(super) const NIL: u32 = u32::MAX;

/// The head message of a flow, partly sent. `len == 0` marks "none" (messages have at least
/// 1 byte).
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    /// Its id, from `enqueue`.
    pub(super) id: MsgId,
    /// Message length (bytes).
    pub(super) len: u64,
    /// Bytes already granted (bytes).
    pub(super) sent: u64,
}

impl Default for Pending {
    /// None: `len == 0`.
    fn default() -> Self {
        Self {
            id: MsgId(0),
            len: 0,
            sent: 0,
        }
    }
}

/// One connection's queue in one class: its head message inline (what DRR looks at on every
/// grant, one load from the slab entry), the messages behind it in a [`Ring`]. It is in its
/// class's round exactly when it is non-empty.
#[derive(Debug)]
pub(super) struct Flow {
    /// The head message; `len == 0` when the queue is empty.
    pub(super) head: Pending,
    /// The messages behind the head, in FIFO order.
    pub(super) rest: Ring,
    /// DRR deficit (bytes); 0 outside the round.
    pub(super) deficit: u64,
    /// Next slot in the round ([`NIL`] at the tail or outside the round).
    pub(super) next: u32,
}

impl Default for Flow {
    fn default() -> Self {
        Self {
            head: Pending::default(),
            rest: Ring::default(),
            deficit: 0,
            next: NIL,
        }
    }
}

impl Flow {
    /// Whether nothing is queued.
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.head.len == 0
    }

    /// Appends a message; `true` when the queue was empty (the flow joins its round).
    #[inline]
    pub(super) fn push(&mut self, msg: Pending) -> bool {
        if self.head.len == 0 {
            self.head = msg;
            true
        } else {
            self.rest.push_back(Queued {
                id: msg.id,
                len: msg.len,
            });
            false
        }
    }

    /// Drops the head message (fully granted); `true` when the queue is now empty.
    #[inline]
    pub(super) fn pop(&mut self) -> bool {
        match self.rest.pop_front() {
            Some(next) => {
                self.head = Pending {
                    id: next.id,
                    len: next.len,
                    sent: 0,
                };
                false
            }
            None => {
                self.head.len = 0;
                true
            }
        }
    }

    /// Unsent bytes of each queued message (bytes), head first.
    pub(super) fn unsent(&self) -> impl Iterator<Item = u64> {
        let head = (!self.is_empty()).then(|| self.head.len - self.head.sent);
        head.into_iter().chain(self.rest.iter().map(|q| q.len))
    }
}

/// A connection slot. `generation` tells reuses apart: `open` hands out the slot's current
/// generation and `close` bumps it, so exactly the [`ConnId`](super::ConnId) of the latest
/// `open` of an open slot matches (a closed slot's generation was never handed out).
#[derive(Debug, Default)]
pub(super) struct Slot {
    pub(super) generation: u32,
    pub(super) flows: [Flow; 2],
}

/// The DRR round of one class: backlogged connection slots in turn order, as an intrusive
/// list through [`Flow::next`]. The head is the connection whose turn it is; its quantum for
/// this turn was added when it became the head.
#[derive(Debug)]
pub(super) struct Round {
    pub(super) head: u32,
    pub(super) tail: u32,
}

impl Default for Round {
    fn default() -> Self {
        Self {
            head: NIL,
            tail: NIL,
        }
    }
}

impl Round {
    /// Whether no connection of this class has anything queued.
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.head == NIL
    }

    /// Ends the head's turn, moving it to the back; the new head starts its turn.
    #[inline]
    pub(super) fn rotate(&mut self, slots: &mut [Slot], c: usize, quantum: u64) {
        let head = self.head;
        if head != self.tail {
            let next = std::mem::replace(&mut slots[head as usize].flows[c].next, NIL);
            slots[self.tail as usize].flows[c].next = head;
            self.tail = head;
            self.head = next;
        }
        slots[self.head as usize].flows[c].deficit += quantum;
    }

    /// Removes the head (its queue emptied; the caller resets its deficit); the next slot,
    /// if any, starts its turn.
    #[inline]
    pub(super) fn leave_head(&mut self, slots: &mut [Slot], c: usize, quantum: u64) {
        let next = std::mem::replace(&mut slots[self.head as usize].flows[c].next, NIL);
        self.pass_turn(slots, c, next, quantum);
    }

    /// The head left (its `next` link, already taken and reset to [`NIL`], was `next`); `next`
    /// starts its turn.
    #[inline]
    pub(super) fn pass_turn(&mut self, slots: &mut [Slot], c: usize, next: u32, quantum: u64) {
        self.head = next;
        if next == NIL {
            self.tail = NIL;
        } else {
            slots[next as usize].flows[c].deficit += quantum;
        }
    }

    /// Connections in the round: O(connections in the round).
    pub(super) fn len(&self, slots: &[Slot], c: usize) -> usize {
        self.members(slots, c).count()
    }

    /// The slots in this round, head first (walks the list).
    pub(super) fn members<'a>(
        &self,
        slots: &'a [Slot],
        c: usize,
    ) -> impl Iterator<Item = u32> + 'a {
        let mut at = self.head;
        std::iter::from_fn(move || {
            let slot = at;
            (slot != NIL).then(|| {
                at = slots[slot as usize].flows[c].next;
                slot
            })
        })
    }

    /// Removes `slot` wherever it is (connection closed): O(connections in the round).
    pub(super) fn remove(&mut self, slots: &mut [Slot], c: usize, slot: u32, quantum: u64) {
        if self.head == slot {
            self.leave_head(slots, c, quantum);
            return;
        }
        let mut prev = self.head;
        while prev != NIL {
            let next = slots[prev as usize].flows[c].next;
            if next == slot {
                let after = std::mem::replace(&mut slots[slot as usize].flows[c].next, NIL);
                slots[prev as usize].flows[c].next = after;
                if self.tail == slot {
                    self.tail = prev;
                }
                return;
            }
            prev = next;
        }
    }
}
