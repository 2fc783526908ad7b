//! One pure function per gate: the rule, over the counts it reads. `taken` is the chunks the
//! caller's round already granted and has not posted yet (they hold their share of every
//! count): each gate admits one more beside them.

use super::Gate;
use crate::window::admit;

/// Gate 1, [`Gate::SqSlot`]: admits when more than `taken` send-queue slots are free
/// (`sq_free` = `max_send_wr` less the SENDs posted and not completed, unit: WRs; beyond it
/// `ibv_post_send(3)` fails).
///
/// # Errors
/// [`Gate::SqSlot`] when refused.
#[inline]
pub const fn sq_slot(sq_free: u32, taken: u32) -> Result<(), Gate> {
    if sq_free > taken {
        Ok(())
    } else {
        Err(Gate::SqSlot)
    }
}

/// Gate 2, [`Gate::CqEntry`]: admits when more than `taken` CQ entries are free for send
/// completions (`send_cqes_free` = the CQ's size less the entries reserved for posted
/// receives and those owed by outstanding sends, unit: CQEs; a CQ owing more completions than
/// it holds overruns, `ibv_create_cq(3)`).
///
/// # Errors
/// [`Gate::CqEntry`] when refused.
#[inline]
pub const fn cq_entry(send_cqes_free: u32, taken: u32) -> Result<(), Gate> {
    if send_cqes_free > taken {
        Ok(())
    } else {
        Err(Gate::CqEntry)
    }
}

/// Gate 3, [`Gate::SendBuf`]: admits when more than `taken` registered send buffers are free
/// (unit: buffers; a SEND's payload is copied into one, which its WR owns until completion).
///
/// # Errors
/// [`Gate::SendBuf`] when refused.
#[inline]
pub const fn send_buf(free: usize, taken: u32) -> Result<(), Gate> {
    if free > taken as usize {
        Ok(())
    } else {
        Err(Gate::SendBuf)
    }
}

/// Gate 4, [`Gate::Credit`]: admits when more than `taken + reserve` send credits are left
/// (unit: credits). `reserve` is 0 for a latency chunk and
/// [`CreditConfig::latency_reserve`](crate::credit::CreditConfig::latency_reserve) for a bulk
/// chunk, so bulk leaves the reserve to small messages (the same rule as
/// [`Credits::can_send_more`](crate::credit::Credits::can_send_more) and
/// [`Credits::can_send_bulk_more`](crate::credit::Credits::can_send_bulk_more)).
///
/// # Errors
/// [`Gate::Credit`] when refused.
#[inline]
pub const fn credit(send_credits: u32, taken: u32, reserve: u32) -> Result<(), Gate> {
    if send_credits as u64 > taken as u64 + reserve as u64 {
        Ok(())
    } else {
        Err(Gate::Credit)
    }
}

/// Gate 5, [`Gate::QpWindow`]: admits a post of `bytes` when `in_flight + bytes <= cap` or
/// nothing is in flight (the single-chunk escape, [`crate::window`]); units: bytes. Returns
/// whether the post goes over the cap (through the escape).
///
/// # Errors
/// [`Gate::QpWindow`] when refused.
#[inline]
pub fn qp_window(in_flight: u64, cap: u64, bytes: u64) -> Result<bool, Gate> {
    match admit(in_flight, cap, bytes) {
        Some((_, over_cap)) => Ok(over_cap),
        None => Err(Gate::QpWindow),
    }
}

/// Gate 6, [`Gate::DeviceWindow`]: the rule of [`qp_window`] on the device's account (bytes
/// in flight over all QPs of the device, and its cap).
///
/// # Errors
/// [`Gate::DeviceWindow`] when refused.
#[inline]
pub fn device_window(in_flight: u64, cap: u64, bytes: u64) -> Result<bool, Gate> {
    match admit(in_flight, cap, bytes) {
        Some((_, over_cap)) => Ok(over_cap),
        None => Err(Gate::DeviceWindow),
    }
}

/// Gate [`Gate::ReadDepth`]: admits one more RDMA READ while fewer than `max` (the device's
/// `max_qp_init_rd_atom`, at least 1) are outstanding; units: READ WRs.
///
/// # Errors
/// [`Gate::ReadDepth`] when refused.
#[inline]
pub const fn read_depth(outstanding: u32, max: u32) -> Result<(), Gate> {
    if outstanding < max {
        Ok(())
    } else {
        Err(Gate::ReadDepth)
    }
}
