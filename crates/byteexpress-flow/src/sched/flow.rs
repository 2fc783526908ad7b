//! Per-connection, per-class queues and the DRR round of each class.

use std::collections::VecDeque;

use super::MsgId;

/// A queued message, partly sent.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    pub(super) id: MsgId,
    /// Message length (bytes).
    pub(super) len: u64,
    /// Bytes already granted (bytes).
    pub(super) sent: u64,
}

/// One connection's queue in one class.
#[derive(Debug, Default)]
pub(super) struct Flow {
    pub(super) queue: VecDeque<Pending>,
    /// DRR deficit (bytes).
    pub(super) deficit: u64,
    /// In its class's round (non-empty queue).
    pub(super) active: bool,
}

/// The DRR round of one class: active connection slots in turn order. The front is the
/// connection whose turn it is; `charged` says its quantum for this turn was added.
#[derive(Debug, Default)]
pub(super) struct Round {
    pub(super) order: VecDeque<u32>,
    pub(super) charged: bool,
    /// Unsent bytes queued in this class (bytes).
    pub(super) backlog: u64,
}

impl Round {
    /// Ends the front connection's turn, moving it to the back.
    #[inline]
    pub(super) fn rotate(&mut self) {
        if let Some(front) = self.order.pop_front() {
            self.order.push_back(front);
        }
        self.charged = false;
    }

    /// Removes the front connection (its queue emptied).
    #[inline]
    pub(super) fn leave_front(&mut self) {
        self.order.pop_front();
        self.charged = false;
    }

    /// Removes `slot` wherever it is (connection closed).
    pub(super) fn remove(&mut self, slot: u32) {
        if self.order.front() == Some(&slot) {
            self.charged = false;
        }
        self.order.retain(|&s| s != slot);
    }
}
