//! The event queue: a binary heap ordered by (time, insertion number), so events at the same
//! nanosecond run in the order they were scheduled and a run is deterministic.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Host index (a NIC; also its switch port). Unit: index.
pub type HostId = u16;
/// Flow index: one direction of one QP or TCP connection. Unit: index.
pub type FlowId = u32;

/// What happens at an instant.
#[derive(Debug, Clone, Copy)]
pub enum Ev {
    /// A host NIC finished serializing its packet.
    NicTxDone(HostId),
    /// A host NIC's rate limiter lets a flow send again: try to send.
    NicWake(HostId),
    /// A packet's last bit reached the switch (the packet: an index into the world's
    /// in-flight packets, so events stay small).
    SwArrive(u32),
    /// A switch egress port finished serializing its packet.
    SwTxDone(HostId),
    /// A packet's last bit reached its destination host (index as `SwArrive`).
    HostArrive(u32),
    /// A PFC frame reached a host: XOFF (`true`) or XON.
    Pause(HostId, bool),
    /// DCQCN rate-increase timer of a flow, with its generation (stale ones are ignored).
    DcqcnTimer(FlowId, u32),
    /// Retransmission timer (RC or TCP) of a flow (one pending per flow; it re-schedules
    /// itself when the deadline moved).
    Rto(FlowId),
    /// A worker's compute phase ended: it starts its next step.
    ComputeDone(u32),
}

#[derive(Debug)]
struct Entry {
    time: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    /// Reversed: the heap's top is the earliest (time, seq).
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

/// Pending events, earliest first; ties broken by scheduling order.
#[derive(Debug, Default)]
pub struct EventQueue {
    heap: BinaryHeap<Entry>,
    seq: u64,
    popped: u64,
}

impl EventQueue {
    /// Schedules `ev` at `time` (ns).
    #[inline]
    pub fn push(&mut self, time: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Entry {
            time,
            seq: self.seq,
            ev,
        });
    }

    /// The earliest event and its time (ns), if any.
    #[inline]
    pub fn pop(&mut self) -> Option<(u64, Ev)> {
        self.heap.pop().map(|e| {
            self.popped += 1;
            (e.time, e.ev)
        })
    }

    /// Events processed so far.
    pub fn processed(&self) -> u64 {
        self.popped
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// No event pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_time_events_pop_in_scheduling_order() {
        let mut q = EventQueue::default();
        q.push(5, Ev::NicWake(2));
        q.push(3, Ev::NicWake(9));
        q.push(5, Ev::NicWake(1));
        let order: Vec<_> = std::iter::from_fn(|| q.pop())
            .map(|(t, e)| match e {
                Ev::NicWake(h) => (t, h),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(order, vec![(3, 9), (5, 2), (5, 1)]);
    }
}
