//! A sender's queue of messages cut into MTU packets, numbered by one packet sequence (PSN
//! for RC, segment number for TCP), so any packet can be rebuilt for a resend.

use std::collections::VecDeque;

/// One message: packets `first .. first + npkts`, `bytes` of payload, `token` for the
/// application (reported when it is delivered or acknowledged).
#[derive(Debug, Clone, Copy)]
pub struct Msg {
    /// First sequence number.
    pub first: u64,
    /// Packets (at least 1).
    pub npkts: u64,
    /// Payload bytes.
    pub bytes: u64,
    /// Application token.
    pub token: u64,
}

/// Messages not yet acknowledged, in sequence order.
#[derive(Debug, Clone, Default)]
pub struct MsgQueue {
    msgs: VecDeque<Msg>,
    /// One past the last sequence number queued.
    end: u64,
}

/// One packet of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    /// Payload bytes.
    pub payload: u32,
    /// Last packet of its message.
    pub last: bool,
    /// The message's token.
    pub token: u64,
}

impl MsgQueue {
    /// Queues a message of `bytes` (0 counts as 1 byte: a message is at least one packet) cut
    /// at `mtu`.
    pub fn push(&mut self, bytes: u64, token: u64, mtu: u32) {
        let bytes = bytes.max(1);
        let npkts = bytes.div_ceil(u64::from(mtu));
        self.msgs.push_back(Msg {
            first: self.end,
            npkts,
            bytes,
            token,
        });
        self.end += npkts;
    }

    /// One past the last sequence number queued.
    #[inline]
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The packet `seq` (which must be queued and not released).
    pub fn seg(&self, seq: u64, mtu: u32) -> Seg {
        let i = self.msgs.partition_point(|m| m.first + m.npkts <= seq);
        let m = &self.msgs[i];
        let k = seq - m.first;
        let mtu = u64::from(mtu);
        let payload = if k + 1 == m.npkts {
            m.bytes - k * mtu
        } else {
            mtu
        };
        Seg {
            payload: payload as u32,
            last: k + 1 == m.npkts,
            token: m.token,
        }
    }

    /// Drops the messages entirely below `seq`, calling `done` with each token in order.
    pub fn release_below(&mut self, seq: u64, mut done: impl FnMut(u64)) {
        while let Some(m) = self.msgs.front() {
            if m.first + m.npkts > seq {
                break;
            }
            done(m.token);
            self.msgs.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_are_rebuilt_from_any_sequence_number() {
        let mut q = MsgQueue::default();
        q.push(10_000, 7, 4096);
        q.push(100, 8, 4096);
        assert_eq!(q.end(), 4);
        assert_eq!(
            q.seg(1, 4096),
            Seg {
                payload: 4096,
                last: false,
                token: 7
            }
        );
        assert_eq!(
            q.seg(2, 4096),
            Seg {
                payload: 1808,
                last: true,
                token: 7
            }
        );
        assert_eq!(
            q.seg(3, 4096),
            Seg {
                payload: 100,
                last: true,
                token: 8
            }
        );
        let mut done = vec![];
        q.release_below(3, |t| done.push(t));
        assert_eq!(done, vec![7]);
        assert_eq!(q.seg(3, 4096).token, 8);
    }
}
