//! A host's NIC: one egress link, control packets first, data flows round robin under their
//! rate limiters, stopped by PFC XOFF (control packets go in a class PFC does not pause).

use std::collections::VecDeque;

use crate::event::FlowId;
use crate::packet::Packet;

/// One host's NIC state.
#[derive(Debug, Default)]
pub struct Nic {
    /// Serializing a packet.
    pub busy: bool,
    /// Paused by PFC (XOFF received, no XON yet).
    pub paused: bool,
    /// When the current pause began (ns).
    pub paused_since: u64,
    /// Time spent paused, ns (closed pauses).
    pub pause_ns: u64,
    /// XOFF frames received.
    pub pauses: u64,
    /// Control packets waiting (ACK, NAK, CNP, READ request, TCP ACK).
    pub ctrl: VecDeque<Packet>,
    /// Flows with something to send, in round-robin order.
    pub active: VecDeque<FlowId>,
    /// Earliest pending wake-up (ns), `u64::MAX` for none.
    pub wake_at: u64,
    /// Packets sent.
    pub tx_packets: u64,
}

impl Nic {
    /// An idle NIC.
    pub fn new() -> Self {
        Nic {
            wake_at: u64::MAX,
            ..Nic::default()
        }
    }

    /// Time paused up to `now` (ns), counting a pause still on.
    pub fn pause_ns_at(&self, now: u64) -> u64 {
        self.pause_ns
            + if self.paused {
                now - self.paused_since
            } else {
                0
            }
    }
}
