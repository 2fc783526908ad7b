//! The messages queued behind a flow's head: a FIFO ring of power-of-two capacity.
//!
//! Why not `VecDeque`: its index wraps with a compare and a conditional move on every push
//! and pop, where here the ends are free-running counters masked by the power-of-two
//! capacity (a pop is a compare, a mask and an increment); and its entries here would be
//! [`Pending`](super::flow::Pending)s of 24 bytes, where a message behind the head has sent
//! nothing yet, so [`Queued`] needs only its id and length (16 bytes, two words to move).

use std::fmt;

use super::MsgId;

/// A message behind its flow's head: none of it granted yet.
#[derive(Debug, Clone, Copy)]
pub(super) struct Queued {
    /// Its id, from `enqueue`.
    pub(super) id: MsgId,
    /// Message length (bytes).
    pub(super) len: u64,
}

/// FIFO of [`Queued`] messages. Grows on demand (doubling) and keeps its capacity.
#[derive(Default)]
pub(super) struct Ring {
    /// Storage: length 0 or a power of two, message `i` (counted as `front` and `back` count)
    /// at `i & (length - 1)`. Slots of no message between `front` and `back` are stale.
    buf: Box<[Queued]>,
    /// Messages taken out so far (messages, wrapping): the first is at `front & mask`.
    front: usize,
    /// Messages put in so far (messages, wrapping); `back - front <= buf.len()`.
    back: usize,
}

impl Ring {
    /// Appends a message.
    #[inline]
    pub(super) fn push_back(&mut self, msg: Queued) {
        // Not full: `back - front < buf.len()`, which also tells the compiler that the masked
        // index is in bounds.
        if self.back.wrapping_sub(self.front) < self.buf.len() {
            let mask = self.buf.len() - 1;
            self.buf[self.back & mask] = msg;
            self.back = self.back.wrapping_add(1);
        } else {
            self.grow_push(msg);
        }
    }

    /// Takes the first message, if any.
    #[inline]
    pub(super) fn pop_front(&mut self) -> Option<Queued> {
        if self.front == self.back {
            return None;
        }
        let msg = self.buf[self.front & self.buf.len().wrapping_sub(1)];
        self.front = self.front.wrapping_add(1);
        Some(msg)
    }

    /// The messages, first to last.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Queued> {
        let mask = self.buf.len().wrapping_sub(1);
        (0..self.back.wrapping_sub(self.front))
            .map(move |i| &self.buf[self.front.wrapping_add(i) & mask])
    }

    /// Doubles the capacity (4 at first), the messages moved to the start in order, then
    /// appends `msg`. Rare: a warm ring keeps its capacity.
    #[cold]
    #[inline(never)]
    fn grow_push(&mut self, msg: Queued) {
        let cap = (self.buf.len() * 2).max(4);
        let stale = Queued {
            id: MsgId(0),
            len: 0,
        };
        let mut buf = vec![stale; cap].into_boxed_slice();
        for (to, from) in buf.iter_mut().zip(self.iter()) {
            *to = *from;
        }
        let len = self.back.wrapping_sub(self.front);
        buf[len] = msg;
        self.buf = buf;
        self.front = 0;
        self.back = len + 1;
    }
}

impl fmt::Debug for Ring {
    /// The messages, first to last (as a `VecDeque` shows them; stale slots left out).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}
