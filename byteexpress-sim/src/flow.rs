//! A flow: one direction of one RC QP or TCP connection, with its sender's state (at `src`)
//! and its receiver's state (at `dst`).

use crate::dcqcn::ReactionPoint;
use crate::event::HostId;
use crate::gbn::{GbnReceiver, GbnSender};
use crate::tcp::{TcpReceiver, TcpSender};

/// The transport of a flow.
#[derive(Debug, Clone)]
pub enum Transport {
    /// RDMA RC: go-back-N, DCQCN reaction point at the sender (when enabled), notification
    /// point at the receiver.
    Rc {
        /// Sender.
        tx: GbnSender,
        /// Receiver.
        rx: GbnReceiver,
        /// DCQCN reaction point (`None`: no congestion control, line rate).
        rp: Option<ReactionPoint>,
        /// Last CNP sent by the receiver for this flow (ns).
        np_last: Option<u64>,
    },
    /// TCP.
    Tcp {
        /// Sender.
        tx: TcpSender,
        /// Receiver.
        rx: TcpReceiver,
    },
}

/// One flow.
#[derive(Debug, Clone)]
pub struct Flow {
    /// Sending host.
    pub src: HostId,
    /// Receiving host.
    pub dst: HostId,
    /// Transport state.
    pub t: Transport,
    /// The rate limiter's next send time (ns).
    pub next_tx_ns: u64,
    /// In its host's list of flows with something to send.
    pub active: bool,
    /// Retransmission deadline (ns), `u64::MAX` when disarmed.
    pub rto_deadline: u64,
    /// An `Ev::Rto` is pending for this flow.
    pub rto_pending: bool,
    /// Payload bytes accepted in order at the receiver.
    pub delivered_bytes: u64,
    /// Retransmission timeouts fired.
    pub timeouts: u64,
}

impl Flow {
    /// A flow from `src` to `dst` over `t`.
    pub fn new(src: HostId, dst: HostId, t: Transport) -> Self {
        Flow {
            src,
            dst,
            t,
            next_tx_ns: 0,
            active: false,
            rto_deadline: u64::MAX,
            rto_pending: false,
            delivered_bytes: 0,
            timeouts: 0,
        }
    }

    /// Packets resent so far (go-back-N or TCP).
    pub fn resent(&self) -> u64 {
        match &self.t {
            Transport::Rc { tx, .. } => tx.resent,
            Transport::Tcp { tx, .. } => tx.resent,
        }
    }

    /// CNPs its sender reacted to.
    pub fn cnps(&self) -> u64 {
        match &self.t {
            Transport::Rc { rp: Some(rp), .. } => rp.cnps,
            _ => 0,
        }
    }

    /// The DCQCN rate now (bits/s), if it has a reaction point.
    pub fn rate_bps(&self) -> Option<f64> {
        match &self.t {
            Transport::Rc { rp: Some(rp), .. } => Some(rp.rate()),
            _ => None,
        }
    }
}
