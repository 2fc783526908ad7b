//! The admission gates of a SEND, with names, in one order: pure functions over the counters
//! the transport passes in.
//!
//! A data SEND (one chunk) is posted only when six resources admit it. Each is a [`Gate`];
//! they are checked in this order, and the first that refuses is the one named and counted:
//!
//! | # | gate | admits when | freed by |
//! |---|---|---|---|
//! | 1 | [`Gate::SqSlot`] | a send-queue slot is free beside those the round took (`max_send_wr`, `ibv_post_send(3)`) | our send completion |
//! | 2 | [`Gate::CqEntry`] | a CQ entry is free for its completion, beside the entries reserved for posted receives (`ibv_create_cq(3)`) | our send completion |
//! | 3 | [`Gate::SendBuf`] | a registered send buffer is free | our send completion |
//! | 4 | [`Gate::Credit`] | the receiver granted a buffer for it ([`credit`](crate::credit) rule 1), and a bulk chunk leaves the latency reserve | the peer's returned credits |
//! | 5 | [`Gate::QpWindow`] | its wire bytes fit the QP's window (or the window is empty) | our send completion |
//! | 6 | [`Gate::DeviceWindow`] | they fit the device's window, shared by every QP of the device (or it is empty) | any send completion on the device |
//!
//! # Why this order
//! The order follows openucx's RC transport (`src/uct/ib/rc/base/rc_ep.h`), whose send
//! operations check the CQ and the QP's send queue (`UCT_RC_CHECK_RES`) before the peer's
//! flow-control window (`UCT_RC_CHECK_FC`), count each refusal under its own name, and take
//! nothing until every check passed. Here:
//!
//! - **Local before remote.** Gates 1–3 are freed by this side's own completions (the next CQ
//!   poll); the credit (4) by the peer. Checked first, they make a credit refusal mean what
//!   `bx_credit_stalls_total` says, receiver backpressure, and never a CQ not yet polled.
//! - **SQ slot before CQ entry.** With the standard sizing (`cq_size = sq_depth + rq_depth`)
//!   the CQ never limits before the send queue does; checked second, the CQ gate refuses only
//!   where the device gave a smaller CQ, so its counter names exactly that.
//! - **Send buffer after the queue.** A buffer returns with the same completion as its slot;
//!   its gate refuses only when the pool is smaller than the queue allows.
//! - **Chunk-independent gates first.** Gates 1–4 need nothing of the chunk but its class
//!   (and only a bulk chunk's credit depends on that): [`admit_round`] checks them before the
//!   scheduler is asked, so a round that cannot post asks nothing of the scheduler. The
//!   windows need the chunk's wire bytes, so [`admit_chunk`] checks them, and a bulk chunk's
//!   latency reserve, inside the scheduler's gate.
//! - **The windows last, the device's after the QP's.** They are the only gates whose
//!   admission is charged at once ([`crate::window::Window::charge`]), and no gate after them
//!   can refuse, so nothing is ever charged and then given back. The device account is shared
//!   with the device's other QPs (behind a lock in a transport): it is read only when
//!   everything of this QP admitted, and a chunk the QP's own window holds back is not
//!   counted against the device.
//!
//! # Counting
//! A refusal is the gate that stopped a round or a chunk; it is counted once, in
//! [`Refusals`] (or the transport's own counters, indexed by [`Gate::index`]). A refused chunk
//! stays queued and is designated again (see [`crate::sched`]), so a refusal is a wait, not
//! a loss.
//!
//! # Taking what was admitted
//! The gates are pure: they read counts and take nothing. After admission the transport takes
//! the window bytes at once ([`crate::window::Window::charge`] with the [`Admitted`] of
//! [`admit_chunk`]), the round's credits together at its end
//! ([`crate::credit::Credits::try_send_data_batch`]), and a slot, CQ entry and buffer per
//! SEND as it posts it ([`crate::credit::QueueBudget::try_post_send`]). `taken`, the chunks
//! the round granted so far, is what each gate leaves for them.
//!
//! # READs (rendezvous)
//! The receiver of a rendezvous message RDMA READs its body in pieces. A READ takes a send-queue
//! slot and a CQ entry like a SEND, no send buffer and no credit (nothing lands in the peer's
//! receive queue), one of the device's outstanding READs ([`Gate::ReadDepth`]), and its bytes
//! in both windows like a SEND's: [`admit_read`] checks gates 1, 2, `ReadDepth`, 5 and 6, in
//! that order. So READs and SENDs share the QP's and the device's windows: a link receiving a
//! large message by READ and sending chunks has one window for both.
//!
//! A `CREDIT_UPDATE` is a SEND too but consumes no credit and is not charged to the windows:
//! [`admit_update`] checks gates 1–3.

mod checks;
mod compose;
mod refusals;

pub use checks::{cq_entry, credit, device_window, qp_window, read_depth, send_buf, sq_slot};
pub use compose::{Admitted, Room, admit_chunk, admit_read, admit_round, admit_update};
pub use refusals::Refusals;

/// One admission gate of a SEND (module docs: the order, and why).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Gate {
    /// 1. A free slot in the QP's send queue.
    SqSlot,
    /// 2. A free CQ entry for the send's completion.
    CqEntry,
    /// 3. A free registered send buffer.
    SendBuf,
    /// 4. A send credit (receiver buffer); for a bulk chunk, beyond the latency reserve.
    Credit,
    /// 5. Room in the QP's window (bytes in flight).
    QpWindow,
    /// 6. Room in the device's window (bytes in flight over the device's QPs).
    DeviceWindow,
    /// An RDMA READ of a rendezvous body (not a SEND): fewer READs outstanding on the QP than
    /// the device allows (`max_qp_init_rd_atom`). [`admit_read`] checks it third, after the
    /// SQ slot and CQ entry and before the windows.
    ReadDepth,
}

impl Gate {
    /// Every gate, in the order they are checked.
    pub const ALL: [Gate; 7] = [
        Gate::SqSlot,
        Gate::CqEntry,
        Gate::SendBuf,
        Gate::Credit,
        Gate::QpWindow,
        Gate::DeviceWindow,
        Gate::ReadDepth,
    ];

    /// Its position in [`Gate::ALL`] (`0..7`), for a caller's per-gate table.
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Its name in metrics and logs (`sq_slot`, `cq_entry`, `send_buf`, `credit`,
    /// `qp_window`, `device_window`, `read_depth`).
    pub const fn name(self) -> &'static str {
        match self {
            Gate::SqSlot => "sq_slot",
            Gate::CqEntry => "cq_entry",
            Gate::SendBuf => "send_buf",
            Gate::Credit => "credit",
            Gate::QpWindow => "qp_window",
            Gate::DeviceWindow => "device_window",
            Gate::ReadDepth => "read_depth",
        }
    }
}

impl std::fmt::Display for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
