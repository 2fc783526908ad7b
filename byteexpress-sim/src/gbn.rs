//! RDMA RC reliability: go-back-N (InfiniBand Architecture Specification vol. 1, 9.7: the
//! responder accepts only the expected PSN, answers a PSN sequence error with one NAK, and the
//! requester resends from the NAK's PSN; a local ACK timeout resends from the oldest unacked
//! PSN). ACKs are sent for the last packet of each message (coalesced, as NICs do).

use crate::msgq::{MsgQueue, Seg};

/// The sending side of one RC flow.
#[derive(Debug, Clone, Default)]
pub struct GbnSender {
    /// Messages posted and not acknowledged.
    pub q: MsgQueue,
    /// Next PSN to send.
    pub next: u64,
    /// Oldest PSN not acknowledged.
    pub una: u64,
    /// Packets resent (after a NAK or timeout).
    pub resent: u64,
    /// Highest PSN sent + 1 (to count resends).
    high: u64,
}

impl GbnSender {
    /// Something is left to send.
    #[inline]
    pub fn has_data(&self) -> bool {
        self.next < self.q.end()
    }

    /// Packets sent and not acknowledged.
    #[inline]
    pub fn outstanding(&self) -> bool {
        self.una < self.next
    }

    /// Takes the next packet to send: its PSN and segment.
    #[inline]
    pub fn take(&mut self, mtu: u32) -> (u64, Seg) {
        let psn = self.next;
        self.next += 1;
        if psn < self.high {
            self.resent += 1;
        } else {
            self.high = psn + 1;
        }
        (psn, self.q.seg(psn, mtu))
    }

    /// ACK: every PSN below `upto` arrived; `done` gets each message completed. Returns
    /// whether it acknowledged something new.
    pub fn on_ack(&mut self, upto: u64, done: impl FnMut(u64)) -> bool {
        if upto <= self.una {
            return false;
        }
        self.una = upto;
        self.next = self.next.max(upto);
        self.q.release_below(upto, done);
        true
    }

    /// NAK: resend from `psn` (everything below it arrived).
    pub fn on_nak(&mut self, psn: u64, done: impl FnMut(u64)) {
        self.on_ack(psn, done);
        if psn >= self.una && psn < self.next {
            self.next = psn;
        }
    }

    /// Local ACK timeout: resend from the oldest unacknowledged PSN. Returns whether there was
    /// anything to resend.
    pub fn on_timeout(&mut self) -> bool {
        if self.outstanding() {
            self.next = self.una;
            true
        } else {
            false
        }
    }
}

/// What a responder does with an arriving data packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxAction {
    /// In order: accepted (deliver the message if it was its last packet; ACK then).
    Accept,
    /// A PSN already received: dropped.
    Duplicate,
    /// A PSN beyond the expected one: dropped; send a NAK for the expected PSN when `nak`.
    OutOfOrder {
        /// Send a NAK (the first since the sequence error).
        nak: bool,
    },
}

/// The receiving side of one RC flow.
#[derive(Debug, Clone, Default)]
pub struct GbnReceiver {
    /// Next PSN expected.
    pub expected: u64,
    nak_sent: bool,
}

impl GbnReceiver {
    /// Data packet `psn` arrived.
    #[inline]
    pub fn on_data(&mut self, psn: u64) -> RxAction {
        if psn == self.expected {
            self.expected += 1;
            self.nak_sent = false;
            RxAction::Accept
        } else if psn < self.expected {
            RxAction::Duplicate
        } else {
            let nak = !self.nak_sent;
            self.nak_sent = true;
            RxAction::OutOfOrder { nak }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_packet_is_nakked_once_and_everything_after_it_resent() {
        let mut tx = GbnSender::default();
        tx.q.push(5 * 100, 1, 100);
        let mut rx = GbnReceiver::default();
        let sent: Vec<u64> = (0..5).map(|_| tx.take(100).0).collect();
        assert_eq!(sent, vec![0, 1, 2, 3, 4]);
        assert_eq!(rx.on_data(0), RxAction::Accept);
        // PSN 1 lost
        assert_eq!(rx.on_data(2), RxAction::OutOfOrder { nak: true });
        assert_eq!(rx.on_data(3), RxAction::OutOfOrder { nak: false });
        tx.on_nak(rx.expected, |_| {});
        assert_eq!(tx.next, 1);
        let resent: Vec<u64> =
            std::iter::from_fn(|| tx.has_data().then(|| tx.take(100).0)).collect();
        assert_eq!(resent, vec![1, 2, 3, 4]);
        assert_eq!(tx.resent, 4);
        for p in resent {
            assert_eq!(rx.on_data(p), RxAction::Accept);
        }
        let mut done = vec![];
        assert!(tx.on_ack(rx.expected, |t| done.push(t)));
        assert_eq!(done, vec![1]);
        assert!(!tx.outstanding());
    }
}
