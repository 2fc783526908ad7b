//! The one switch: a shared buffer, per-port egress FIFOs, dynamic-threshold admission,
//! PFC per ingress queue and ECN on enqueue. Pure state; the world moves packets in and out.

use std::collections::VecDeque;

use rand::Rng;

use crate::config::NetConfig;
use crate::ecn;
use crate::event::HostId;
use crate::packet::Packet;
use crate::pfc;

/// One egress port.
#[derive(Debug, Default)]
pub struct Port {
    /// Packets waiting to be sent, oldest first.
    pub q: VecDeque<Packet>,
    /// Bytes waiting (unit: bytes).
    pub bytes: u64,
    /// A packet is being serialized.
    pub busy: bool,
    /// Largest `bytes` seen (unit: bytes).
    pub max_bytes: u64,
}

/// Counters of the switch.
#[derive(Debug, Default, Clone, Copy)]
pub struct SwitchStats {
    /// Data packets dropped (egress threshold, port cap, or full buffer).
    pub drops: u64,
    /// Data packets marked CE.
    pub marks: u64,
    /// XOFF frames sent.
    pub xoff_frames: u64,
    /// XON frames sent.
    pub xon_frames: u64,
    /// Largest buffer occupancy (bytes).
    pub max_used: u64,
}

/// What became of an arriving packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// It was queued (else dropped).
    pub queued: bool,
    /// Its egress port was idle: start sending.
    pub start: bool,
    /// Send XOFF to this host (its ingress queue crossed the threshold).
    pub xoff: Option<HostId>,
}

/// The switch. Port `i` faces host `i`.
#[derive(Debug)]
pub struct Switch {
    /// Egress ports.
    pub ports: Vec<Port>,
    /// Data bytes in the buffer per ingress port.
    ingress: Vec<u64>,
    /// XOFF sent to that port's host and no XON since.
    paused: Vec<bool>,
    /// Bytes in the buffer.
    used: u64,
    /// Bytes left to the dynamic threshold once every port's PFC headroom is set aside.
    pool: u64,
    /// Counters.
    pub stats: SwitchStats,
}

impl Switch {
    /// A switch with `ports` ports, empty; with PFC, `cfg.pfc_headroom_bytes` per port is
    /// set aside from the dynamic threshold's pool.
    pub fn new(ports: usize, cfg: &NetConfig) -> Self {
        let reserved = if cfg.pfc {
            cfg.pfc_headroom_bytes.saturating_mul(ports as u64)
        } else {
            0
        };
        Switch {
            pool: cfg.buffer_bytes.saturating_sub(reserved),
            ports: (0..ports).map(|_| Port::default()).collect(),
            ingress: vec![0; ports],
            paused: vec![false; ports],
            used: 0,
            stats: SwitchStats::default(),
        }
    }

    /// Bytes in the shared buffer.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Admits (or drops) `pkt` arriving on port `pkt.src` for port `pkt.dst`, marking CE by
    /// `cfg.ecn`. Data packets: with PFC, dropped only when the buffer is full, and XOFF is due
    /// when the ingress queue passes the dynamic threshold over the pool (the buffer less the
    /// ports' headroom); without PFC, dropped when the
    /// egress queue would pass the dynamic threshold (Choudhury & Hahne) or the port cap.
    /// Control packets are always queued.
    pub fn arrive<R: Rng>(&mut self, mut pkt: Packet, cfg: &NetConfig, rng: &mut R) -> Admitted {
        let e = pkt.dst as usize;
        let i = pkt.src as usize;
        let w = u64::from(pkt.wire);
        let mut xoff = None;
        if pkt.is_data() {
            let qb = self.ports[e].bytes;
            let full = self.used + w > cfg.buffer_bytes;
            let capped = cfg.port_buffer_bytes > 0 && qb + w > cfg.port_buffer_bytes;
            let over_dt = !cfg.pfc
                && (qb + w) as f64 > pfc::threshold(cfg.dt_alpha, cfg.buffer_bytes, self.used);
            if full || capped || over_dt {
                self.stats.drops += 1;
                return Admitted {
                    queued: false,
                    start: false,
                    xoff: None,
                };
            }
            if ecn::mark(&cfg.ecn, qb, rng) {
                pkt.ce = true;
                self.stats.marks += 1;
            }
            self.ingress[i] += w;
            if cfg.pfc && !self.paused[i] {
                let thr = pfc::threshold(cfg.dt_alpha, self.pool, self.used + w);
                if pfc::xoff_due(self.ingress[i], thr) {
                    self.paused[i] = true;
                    self.stats.xoff_frames += 1;
                    xoff = Some(pkt.src);
                }
            }
        }
        self.used += w;
        self.stats.max_used = self.stats.max_used.max(self.used);
        let port = &mut self.ports[e];
        port.q.push_back(pkt);
        port.bytes += w;
        port.max_bytes = port.max_bytes.max(port.bytes);
        Admitted {
            queued: true,
            start: !port.busy,
            xoff,
        }
    }

    /// Takes the next packet of egress port `e` to send (marking the port busy), with the
    /// host to send XON to when its ingress queue fell below the XON level. `None` (port idle)
    /// when empty.
    pub fn depart(&mut self, e: HostId, cfg: &NetConfig) -> Option<(Packet, Option<HostId>)> {
        let port = &mut self.ports[e as usize];
        let Some(pkt) = port.q.pop_front() else {
            port.busy = false;
            return None;
        };
        port.busy = true;
        let w = u64::from(pkt.wire);
        port.bytes -= w;
        self.used -= w;
        let mut xon = None;
        if pkt.is_data() {
            let i = pkt.src as usize;
            self.ingress[i] -= w;
            if self.paused[i] {
                let thr = pfc::threshold(cfg.dt_alpha, self.pool, self.used);
                if pfc::xon_due(self.ingress[i], thr, cfg.pfc_xon_gap_bytes) {
                    self.paused[i] = false;
                    self.stats.xon_frames += 1;
                    xon = Some(pkt.src);
                }
            }
        }
        Some((pkt, xon))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EcnMode;
    use crate::packet::Kind;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    fn data(src: HostId, dst: HostId, wire: u32) -> Packet {
        let mut p = Packet::control(Kind::Data, 0, src, dst, wire, 0);
        p.kind = Kind::Data;
        p
    }

    #[test]
    fn lossy_switch_drops_at_the_dynamic_threshold_of_the_egress_queue() {
        let cfg = NetConfig {
            pfc: false,
            buffer_bytes: 90_000,
            dt_alpha: 0.125,
            ecn: EcnMode::Off,
            ..NetConfig::default()
        };
        let mut sw = Switch::new(3, &cfg);
        let mut rng = SmallRng::seed_from_u64(1);
        // q + w <= α (B − used): q ≤ 10_000 with 1000-byte packets, α/(1+α) × B = 10_000.
        let queued = (0..50)
            .filter(|_| sw.arrive(data(0, 2, 1000), &cfg, &mut rng).queued)
            .count();
        assert_eq!(queued, 10);
        assert_eq!(sw.stats.drops, 40);
    }

    #[test]
    fn lossless_switch_sends_xoff_then_xon_as_the_ingress_queue_drains() {
        let cfg = NetConfig {
            pfc: true,
            buffer_bytes: 90_000,
            dt_alpha: 0.125,
            pfc_xon_gap_bytes: 2000,
            pfc_headroom_bytes: 0,
            ecn: EcnMode::Off,
            ..NetConfig::default()
        };
        let mut sw = Switch::new(3, &cfg);
        let mut rng = SmallRng::seed_from_u64(1);
        let mut xoffs = 0;
        for _ in 0..20 {
            let a = sw.arrive(data(1, 2, 1000), &cfg, &mut rng);
            assert!(a.queued, "lossless: nothing dropped below a full buffer");
            xoffs += usize::from(a.xoff == Some(1));
        }
        assert_eq!(xoffs, 1);
        let mut xon_at = None;
        for k in 0..20 {
            if let Some((_, Some(1))) = sw.depart(2, &cfg) {
                xon_at = Some(k);
                break;
            }
        }
        // XON once the 20 KB ingress queue is 2 KB below α(B − used).
        let k = xon_at.expect("an XON");
        let left = 20_000 - 1000 * (k as u64 + 1);
        assert!((left + 2000) as f64 <= 0.125 * (90_000 - left) as f64);
    }
}
