//! TCP senders for arm 1: NewReno (RFC 5681 slow start and congestion avoidance, RFC 6582 fast
//! recovery) over a drop-tail switch, or DCTCP (Alizadeh et al., SIGCOMM 2010; RFC 8257) over
//! ECN step marking. Sequence numbers count MTU segments; the receiver ACKs every segment
//! (no delayed ACK), echoing CE and the segment's send time (timestamps, RFC 7323) for RTT
//! samples. RTO as RFC 6298 with a floor (issue 26: 200 ms, Linux `TCP_RTO_MIN`).

use std::collections::{BTreeMap, BTreeSet};

use crate::config::TcpConfig;
use crate::msgq::{MsgQueue, Seg};

/// What an ACK asks of the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AckOutcome {
    /// New data was acknowledged (re-arm the RTO).
    pub progress: bool,
}

/// The sending side of one TCP connection.
#[derive(Debug, Clone)]
pub struct TcpSender {
    /// Data queued and not acknowledged.
    pub q: MsgQueue,
    /// Oldest unacknowledged segment.
    pub una: u64,
    /// Next new segment.
    pub nxt: u64,
    /// Highest segment sent + 1.
    high: u64,
    /// Congestion window, segments.
    pub cwnd: f64,
    ssthresh: f64,
    dupacks: u32,
    in_recovery: bool,
    recover: u64,
    /// A segment to resend before new ones.
    retx: Option<u64>,
    srtt: Option<f64>,
    rttvar: f64,
    /// Current RTO, ns (with backoff).
    pub rto_ns: u64,
    // DCTCP
    alpha: f64,
    win_end: u64,
    acked_in_win: u64,
    marked_in_win: u64,
    cwr_end: u64,
    /// Timeouts taken.
    pub timeouts: u64,
    /// Segments resent.
    pub resent: u64,
}

impl TcpSender {
    /// A connection whose handshake measured `base_rtt_ns` (so the first RTO is the floor).
    pub fn new(cfg: &TcpConfig, base_rtt_ns: u64) -> Self {
        let mut s = TcpSender {
            q: MsgQueue::default(),
            una: 0,
            nxt: 0,
            high: 0,
            cwnd: f64::from(cfg.init_cwnd),
            ssthresh: f64::INFINITY,
            dupacks: 0,
            in_recovery: false,
            recover: 0,
            retx: None,
            srtt: None,
            rttvar: 0.0,
            rto_ns: cfg.rto_min_ns,
            alpha: 1.0,
            win_end: 0,
            acked_in_win: 0,
            marked_in_win: 0,
            cwr_end: 0,
            timeouts: 0,
            resent: 0,
        };
        s.sample_rtt(base_rtt_ns as f64, cfg);
        s
    }

    /// Segments in flight.
    #[inline]
    fn flight(&self) -> u64 {
        self.nxt - self.una
    }

    /// A segment may go now (a resend, or new data within the window).
    #[inline]
    pub fn can_send(&self) -> bool {
        self.retx.is_some() || (self.nxt < self.q.end() && (self.flight() as f64) < self.cwnd)
    }

    /// Something is unacknowledged.
    #[inline]
    pub fn outstanding(&self) -> bool {
        self.una < self.nxt
    }

    /// Takes the segment to send now (call only when [`TcpSender::can_send`]).
    #[inline]
    pub fn take(&mut self, mtu: u32) -> (u64, Seg) {
        let seq = match self.retx.take() {
            Some(s) => s,
            None => {
                let s = self.nxt;
                self.nxt += 1;
                s
            }
        };
        if seq < self.high {
            self.resent += 1;
        } else {
            self.high = seq + 1;
        }
        (seq, self.q.seg(seq, mtu))
    }

    fn sample_rtt(&mut self, r: f64, cfg: &TcpConfig) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2.0;
            }
            Some(s) => {
                self.rttvar = 0.75 * self.rttvar + 0.25 * (s - r).abs();
                self.srtt = Some(0.875 * s + 0.125 * r);
            }
        }
        let rto = self.srtt.unwrap_or(r) + 4.0 * self.rttvar;
        self.rto_ns = (rto as u64).max(cfg.rto_min_ns);
    }

    /// A cumulative ACK of every segment below `ack`, `ece` echoing CE, `rtt_ns` measured by
    /// its echoed timestamp.
    pub fn on_ack(&mut self, ack: u64, ece: bool, rtt_ns: u64, cfg: &TcpConfig) -> AckOutcome {
        let mut out = AckOutcome::default();
        let newly = ack.saturating_sub(self.una);
        if cfg.dctcp {
            self.dctcp_account(ack, newly.max(1), ece, cfg);
        }
        if newly > 0 {
            out.progress = true;
            self.sample_rtt(rtt_ns as f64, cfg);
            self.una = ack;
            self.nxt = self.nxt.max(ack);
            self.q.release_below(ack, |_| {});
            self.dupacks = 0;
            if self.in_recovery {
                if ack > self.recover {
                    self.cwnd = self.ssthresh;
                    self.in_recovery = false;
                } else {
                    // partial ACK: resend the next hole, deflate (RFC 6582 3.2 step 5)
                    self.retx = Some(ack);
                    self.cwnd = (self.cwnd - newly as f64 + 1.0).max(1.0);
                }
            } else if self.cwnd < self.ssthresh {
                self.cwnd += newly as f64;
            } else {
                self.cwnd += newly as f64 / self.cwnd;
            }
        } else if ack == self.una && self.outstanding() {
            self.dupacks += 1;
            if self.dupacks == 3 && !self.in_recovery {
                self.ssthresh = (self.flight() as f64 / 2.0).max(2.0);
                self.cwnd = self.ssthresh + 3.0;
                self.recover = self.nxt.saturating_sub(1);
                self.in_recovery = true;
                self.retx = Some(self.una);
            } else if self.in_recovery {
                self.cwnd += 1.0;
            }
        }
        out
    }

    fn dctcp_account(&mut self, ack: u64, newly: u64, ece: bool, cfg: &TcpConfig) {
        self.acked_in_win += newly;
        if ece {
            self.marked_in_win += newly;
            if ack > self.cwr_end || self.cwr_end == 0 {
                self.cwnd = (self.cwnd * (1.0 - self.alpha / 2.0)).max(2.0);
                self.ssthresh = self.cwnd;
                self.cwr_end = self.nxt.max(1);
            }
        }
        if ack >= self.win_end {
            let f = self.marked_in_win as f64 / self.acked_in_win.max(1) as f64;
            self.alpha = (1.0 - cfg.dctcp_g) * self.alpha + cfg.dctcp_g * f;
            self.win_end = self.nxt.max(ack + 1);
            self.acked_in_win = 0;
            self.marked_in_win = 0;
        }
    }

    /// The RTO fired with data outstanding: window to one segment, resend from `una`, double
    /// the RTO (RFC 6298 5.5–5.6, up to 60 s).
    pub fn on_timeout(&mut self) {
        if !self.outstanding() {
            return;
        }
        self.timeouts += 1;
        self.ssthresh = (self.flight() as f64 / 2.0).max(2.0);
        self.cwnd = 1.0;
        self.recover = self.nxt.saturating_sub(1);
        self.nxt = self.una;
        self.retx = None;
        self.in_recovery = false;
        self.dupacks = 0;
        self.rto_ns = (self.rto_ns * 2).min(60_000_000_000);
    }
}

/// The receiving side of one TCP connection.
#[derive(Debug, Clone, Default)]
pub struct TcpReceiver {
    /// Next segment expected.
    pub nxt: u64,
    ooo: BTreeSet<u64>,
    /// Last segments of messages received out of order: seq → token.
    lasts: BTreeMap<u64, u64>,
}

impl TcpReceiver {
    /// Segment `seq` arrived (`last` of message `token`): returns the cumulative ACK; `deliver`
    /// gets each message completed in order.
    pub fn on_data(
        &mut self,
        seq: u64,
        last: bool,
        token: u64,
        mut deliver: impl FnMut(u64),
    ) -> u64 {
        if seq < self.nxt || self.ooo.contains(&seq) {
            return self.nxt;
        }
        if last {
            self.lasts.insert(seq, token);
        }
        if seq == self.nxt {
            self.nxt += 1;
            while self.ooo.remove(&self.nxt) {
                self.nxt += 1;
            }
            while let Some((&s, &t)) = self.lasts.first_key_value() {
                if s >= self.nxt {
                    break;
                }
                self.lasts.pop_first();
                deliver(t);
            }
        } else {
            self.ooo.insert(seq);
        }
        self.nxt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn newreno() -> TcpConfig {
        TcpConfig {
            dctcp: false,
            ..TcpConfig::default()
        }
    }

    #[test]
    fn three_dupacks_resend_the_hole_and_halve_the_window() {
        let cfg = newreno();
        let mut s = TcpSender::new(&cfg, 10_000);
        s.q.push(100 * 4096, 1, 4096);
        for _ in 0..10 {
            s.take(4096);
        }
        assert!(!s.can_send(), "IW 10 used up");
        s.on_ack(1, false, 10_000, &cfg); // seg 0 acked, seg 1 lost
        let cw = s.cwnd;
        for _ in 0..3 {
            s.on_ack(1, false, 10_000, &cfg);
        }
        assert!(s.can_send());
        assert_eq!(s.take(4096).0, 1, "the hole first");
        assert!(s.cwnd < cw);
    }

    #[test]
    fn timeout_never_fires_below_the_floor_and_backs_off() {
        let cfg = newreno();
        let mut s = TcpSender::new(&cfg, 10_000);
        assert_eq!(s.rto_ns, 200_000_000);
        s.q.push(4096, 1, 4096);
        s.take(4096);
        s.on_timeout();
        assert_eq!(s.rto_ns, 400_000_000);
        assert_eq!(s.cwnd, 1.0);
        assert_eq!(s.take(4096).0, 0);
    }

    #[test]
    fn dctcp_cuts_by_alpha_over_two_once_per_window() {
        let cfg = TcpConfig::default();
        let mut s = TcpSender::new(&cfg, 10_000);
        s.q.push(1000 * 4096, 1, 4096);
        for _ in 0..10 {
            s.take(4096);
        }
        s.on_ack(1, true, 10_000, &cfg);
        let after_first = s.cwnd;
        assert!(after_first < 10.0);
        s.on_ack(2, true, 10_000, &cfg);
        assert!(s.cwnd >= after_first, "no second cut in the same window");
    }

    #[test]
    fn receiver_delivers_messages_in_order_after_a_hole_fills() {
        let mut r = TcpReceiver::default();
        let mut got = vec![];
        assert_eq!(r.on_data(1, true, 5, |t| got.push(t)), 0);
        assert!(got.is_empty());
        assert_eq!(r.on_data(0, false, 0, |t| got.push(t)), 2);
        assert_eq!(got, vec![5]);
    }
}
