//! The gates composed, in their order ([module docs](super)).

use super::{Gate, cq_entry, credit, device_window, qp_window, read_depth, send_buf, sq_slot};
use crate::credit::{Credits, QueueBudget};
use crate::sched::Class;
use crate::window::{DeviceWindow, Window};

/// The counts gates 1–4 read, taken from a link's accounts at the start of a round. None of
/// them moves while the round grants chunks (slots, CQ entries and buffers are taken as the
/// chunks are posted, credits when the round ends), so one `Room` serves the whole round;
/// `taken` tells each gate how much of it the round's chunks hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// Free send-queue slots (WRs): [`QueueBudget::sq_free`].
    pub sq_slots: u32,
    /// Free CQ entries for send completions (CQEs): [`QueueBudget::send_cqes_free`].
    pub send_cqes: u32,
    /// Free registered send buffers (buffers).
    pub send_bufs: usize,
    /// Send credits (credits): [`Credits::send_credits`].
    pub credits: u32,
    /// Credits a bulk chunk leaves to the latency class:
    /// [`CreditConfig::latency_reserve`](crate::credit::CreditConfig::latency_reserve).
    pub latency_reserve: u32,
}

impl Room {
    /// The room of a link whose queues are `queues`, credits `credits`, with `send_bufs` free
    /// send buffers.
    #[inline]
    pub fn new(queues: &QueueBudget, credits: &Credits, send_bufs: usize) -> Self {
        Room {
            sq_slots: queues.sq_free(),
            send_cqes: queues.send_cqes_free(),
            send_bufs,
            credits: credits.send_credits(),
            latency_reserve: credits.config().latency_reserve(),
        }
    }
}

/// Gates 1–4 for one more chunk of a round that granted `taken` so far: send-queue slot, CQ
/// entry, send buffer, and a credit for a latency chunk (the least any chunk needs). Checked
/// before the scheduler is asked: when one refuses, the round ends.
///
/// # Errors
/// The first gate that refuses.
#[inline]
pub fn admit_round(room: &Room, taken: u32) -> Result<(), Gate> {
    sq_slot(room.sq_slots, taken)?;
    cq_entry(room.send_cqes, taken)?;
    send_buf(room.send_bufs, taken)?;
    credit(room.credits, taken, 0)
}

/// What [`admit_chunk`] admitted: pass it to [`Window::charge`] at once (before any other
/// post or completion on the QP or its device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "charge the windows with Window::charge"]
pub struct Admitted {
    pub(crate) bytes: u64,
    pub(crate) over_cap: bool,
}

impl Admitted {
    /// The chunk's wire bytes (unit: bytes).
    #[inline]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// It goes over a window's cap through the single-chunk escape.
    #[inline]
    pub fn over_cap(&self) -> bool {
        self.over_cap
    }
}

/// The gates that depend on the chunk the scheduler designated (`bytes` on the wire, of
/// `class`), for a round that granted `taken` before it and passed [`admit_round`] with the
/// same `taken`: the bulk part of the credit gate (a bulk chunk leaves the latency reserve; a
/// latency chunk's credit is [`admit_round`]'s), then the QP window `qp`, then the device
/// window `dev`. Pure: charge what it admits with [`Window::charge`].
///
/// # Errors
/// The first gate that refuses ([`Gate::Credit`], [`Gate::QpWindow`] or
/// [`Gate::DeviceWindow`]).
#[inline]
pub fn admit_chunk(
    room: &Room,
    taken: u32,
    class: Class,
    qp: &Window,
    dev: &DeviceWindow,
    bytes: u64,
) -> Result<Admitted, Gate> {
    if class == Class::Bulk {
        credit(room.credits, taken, room.latency_reserve)?;
    }
    let qp_over = qp_window(qp.in_flight(), qp.cap(), bytes)?;
    let dev_over = device_window(dev.in_flight(), dev.cap(), bytes)?;
    Ok(Admitted {
        bytes,
        over_cap: qp_over | dev_over,
    })
}

/// The gates of one RDMA READ of `bytes` (a piece of a rendezvous body, module docs
/// "READs"), in order: a send-queue slot and a CQ entry (`room`, read now), fewer than
/// `max_reads` READs outstanding, then the QP window `qp` and the device window `dev`. Pure:
/// charge what it admits with [`Window::charge`].
///
/// # Errors
/// The first gate that refuses.
#[inline]
pub fn admit_read(
    room: &Room,
    outstanding: u32,
    max_reads: u32,
    qp: &Window,
    dev: &DeviceWindow,
    bytes: u64,
) -> Result<Admitted, Gate> {
    sq_slot(room.sq_slots, 0)?;
    cq_entry(room.send_cqes, 0)?;
    read_depth(outstanding, max_reads)?;
    let qp_over = qp_window(qp.in_flight(), qp.cap(), bytes)?;
    let dev_over = device_window(dev.in_flight(), dev.cap(), bytes)?;
    Ok(Admitted {
        bytes,
        over_cap: qp_over | dev_over,
    })
}

/// Gates 1–3 for a `CREDIT_UPDATE` (it takes no credit and is not charged to the windows):
/// send-queue slot, CQ entry, send buffer, with `room` read after the round's chunks were
/// posted.
///
/// # Errors
/// The first gate that refuses.
#[inline]
pub fn admit_update(room: &Room) -> Result<(), Gate> {
    sq_slot(room.sq_slots, 0)?;
    cq_entry(room.send_cqes, 0)?;
    send_buf(room.send_bufs, 0)
}
