//! Packets on the simulated wire.

use crate::event::{FlowId, HostId};

/// What a packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Payload of a flow (RDMA SEND / READ response, or a TCP segment). Data class: PFC and
    /// ECN apply.
    Data,
    /// RC ACK: every PSN below `seq` arrived in order.
    Ack,
    /// RC NAK (PSN sequence error): resend from `seq` (go-back-N).
    Nak,
    /// DCQCN congestion notification to the flow's sender.
    Cnp,
    /// RDMA READ request: the responder sends `aux` bytes back on the flow, token `seq`.
    ReadReq,
    /// TCP ACK: cumulative `seq`, `ece` echoing a CE mark, `aux` the echoed send time.
    TcpAck,
}

/// One packet. Control packets (all but [`Kind::Data`]) travel in a high-priority class that
/// PFC does not pause (as CNPs are deployed), and are `header_bytes` long.
#[derive(Debug, Clone, Copy)]
pub struct Packet {
    /// The flow it belongs to (a control packet: the data flow it is about).
    pub flow: FlowId,
    /// Sending host (its switch ingress port).
    pub src: HostId,
    /// Destination host (its switch egress port).
    pub dst: HostId,
    /// What it is.
    pub kind: Kind,
    /// Bytes on the wire.
    pub wire: u32,
    /// PSN / TCP sequence (packets) / ACK number / READ token (low 32 bits of `aux` for data).
    pub seq: u64,
    /// Data: the message token when this is a message's last packet (else 0); ReadReq:
    /// bytes; TcpAck: echoed send time (ns).
    pub aux: u64,
    /// Data: last packet of its message.
    pub last: bool,
    /// ECN CE mark (set by the switch).
    pub ce: bool,
    /// TCP ACK: ECN-echo.
    pub ece: bool,
    /// Data: send time (ns), echoed by TCP ACKs.
    pub sent_at: u64,
}

impl Packet {
    /// A control packet of `kind` about `flow`, from `src` to `dst`.
    #[inline]
    pub fn control(
        kind: Kind,
        flow: FlowId,
        src: HostId,
        dst: HostId,
        wire: u32,
        seq: u64,
    ) -> Self {
        Packet {
            flow,
            src,
            dst,
            kind,
            wire,
            seq,
            aux: 0,
            last: false,
            ce: false,
            ece: false,
            sent_at: 0,
        }
    }

    /// Data class (PFC-paused, ECN-marked).
    #[inline]
    pub fn is_data(&self) -> bool {
        self.kind == Kind::Data
    }
}
