//! DCQCN (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015):
//! the reaction point's rate state machine at an RDMA sender, and the notification point's
//! CNP pacing at the receiver. Constants: [`DcqcnConfig`] (what was checked is said there).
//!
//! Reaction point, per flow, rates in bits/s:
//! - on a CNP: `R_T ← R_C`, `R_C ← R_C (1 − α/2)`, `α ← (1 − g) α + g`; the timer, byte
//!   counter and both stage counts restart;
//! - every `alpha_interval` without a CNP: `α ← (1 − g) α` (computed when next needed: a run
//!   of k intervals is `(1 − g)^k`, the same as k timer firings);
//! - a rate-increase event each `increase_timer` (timer stage T += 1) and each
//!   `byte_counter` bytes sent (byte stage BC += 1): fast recovery `R_C ← (R_T + R_C)/2`
//!   while `max(T, BC) < F`; hyper increase `R_T += i R_HAI` (i = `min(T, BC) − F`) when
//!   `min(T, BC) > F`; otherwise additive increase `R_T += R_AI`, then `R_C ← (R_T + R_C)/2`.
//!   `R_T` is capped at the line rate; a flow back at line rate stops its timer.
//!
//! Initial state: line rate, α = 1 (the paper's initial value).

use crate::config::DcqcnConfig;

/// Reaction point of one flow.
#[derive(Debug, Clone)]
pub struct ReactionPoint {
    /// Current rate R_C, bits/s.
    rc: f64,
    /// Target rate R_T, bits/s.
    rt: f64,
    /// α as of `alpha_ts`.
    alpha: f64,
    alpha_ts: u64,
    line: f64,
    t_stage: u32,
    bc_stage: u32,
    bytes: u64,
    /// Generation of the pending rate-increase timer (a CNP starts a new one).
    generation: u32,
    /// Below line rate: the timer runs.
    limited: bool,
    /// CNPs reacted to.
    pub cnps: u64,
}

impl ReactionPoint {
    /// A flow at `line_bps`, α = 1.
    pub fn new(line_bps: f64) -> Self {
        ReactionPoint {
            rc: line_bps,
            rt: line_bps,
            alpha: 1.0,
            alpha_ts: 0,
            line: line_bps,
            t_stage: 0,
            bc_stage: 0,
            bytes: 0,
            generation: 0,
            limited: false,
            cnps: 0,
        }
    }

    /// Current rate R_C, bits/s.
    #[inline]
    pub fn rate(&self) -> f64 {
        self.rc
    }

    /// Target rate R_T, bits/s.
    pub fn target(&self) -> f64 {
        self.rt
    }

    /// α at `now` (ns), with the decays due since the last update applied.
    pub fn alpha(&mut self, now: u64, cfg: &DcqcnConfig) -> f64 {
        let k = (now.saturating_sub(self.alpha_ts)) / cfg.alpha_interval_ns.max(1);
        if k > 0 {
            self.alpha *= (1.0 - cfg.g).powi(k.min(i32::MAX as u64) as i32);
            self.alpha_ts += k * cfg.alpha_interval_ns;
        }
        self.alpha
    }

    /// A CNP arrived at `now` (ns): cut the rate. Returns the generation of the new
    /// rate-increase timer, to fire `increase_timer_ns` later.
    pub fn on_cnp(&mut self, now: u64, cfg: &DcqcnConfig) -> u32 {
        let a = self.alpha(now, cfg);
        self.rt = self.rc;
        self.rc = (self.rc * (1.0 - a / 2.0)).max(cfg.min_rate_bps);
        self.alpha = (1.0 - cfg.g) * a + cfg.g;
        self.alpha_ts = now;
        self.t_stage = 0;
        self.bc_stage = 0;
        self.bytes = 0;
        self.limited = true;
        self.cnps += 1;
        self.generation = self.generation.wrapping_add(1);
        self.generation
    }

    /// The rate-increase timer of generation `generation` fired. Returns whether to re-arm it (same
    /// generation): false for a stale timer or once back at line rate.
    pub fn on_timer(&mut self, generation: u32, cfg: &DcqcnConfig) -> bool {
        if generation != self.generation || !self.limited {
            return false;
        }
        self.t_stage += 1;
        self.increase(cfg);
        self.limited
    }

    /// `bytes` were sent: the byte counter may add an increase event.
    #[inline]
    pub fn on_sent(&mut self, bytes: u64, cfg: &DcqcnConfig) {
        if !self.limited {
            return;
        }
        self.bytes += bytes;
        while self.bytes >= cfg.byte_counter_bytes && self.limited {
            self.bytes -= cfg.byte_counter_bytes;
            self.bc_stage += 1;
            self.increase(cfg);
        }
    }

    fn increase(&mut self, cfg: &DcqcnConfig) {
        let f = cfg.fast_recovery_stages;
        let (lo, hi) = (
            self.t_stage.min(self.bc_stage),
            self.t_stage.max(self.bc_stage),
        );
        if hi < f {
            // fast recovery: R_T unchanged
        } else if lo > f {
            self.rt += f64::from(lo - f) * cfg.rate_hai_bps;
        } else {
            self.rt += cfg.rate_ai_bps;
        }
        self.rt = self.rt.min(self.line);
        self.rc = (self.rt + self.rc) / 2.0;
        if self.line - self.rc < 1.0 {
            self.rc = self.line;
            self.rt = self.line;
            self.limited = false;
        }
    }
}

/// Notification point of one flow: whether a CE-marked packet arriving at `now` (ns) makes a
/// CNP, at most one per `interval_ns` (the paper's N = 50 µs); updates `last`.
#[inline]
pub fn np_cnp_due(last: &mut Option<u64>, now: u64, interval_ns: u64) -> bool {
    match *last {
        Some(t) if now.saturating_sub(t) < interval_ns => false,
        _ => {
            *last = Some(now);
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_cnp_halves_the_rate_as_alpha_starts_at_one() {
        let cfg = DcqcnConfig::default();
        let mut rp = ReactionPoint::new(100e9);
        rp.on_cnp(0, &cfg);
        assert_eq!(rp.rate(), 50e9);
        assert_eq!(rp.target(), 100e9);
    }

    #[test]
    fn five_timer_stages_of_fast_recovery_then_additive_increase() {
        let cfg = DcqcnConfig::default();
        let mut rp = ReactionPoint::new(100e9);
        let g = rp.on_cnp(0, &cfg);
        for _ in 0..4 {
            assert!(rp.on_timer(g, &cfg));
        }
        // 4 fast-recovery steps: R_C = R_T - (R_T - R_C0)/16, R_T untouched.
        assert!((rp.rate() - (100e9 - 50e9 / 16.0)).abs() < 1.0);
        assert_eq!(rp.target(), 100e9);
        let mut rp = ReactionPoint::new(100e9);
        let g = rp.on_cnp(0, &cfg);
        rp.on_cnp(1, &cfg); // a second cut: R_T now below line rate
        let g2 = g + 1;
        let rt = rp.target();
        for _ in 0..5 {
            rp.on_timer(g2, &cfg);
        }
        // stage 5 is additive (max(T, BC) = F, min < F)
        assert!((rp.target() - (rt + 40e6)).abs() < 1.0);
        assert!(!rp.on_timer(g, &cfg), "a stale timer is ignored");
    }

    #[test]
    fn alpha_decays_once_per_interval_without_cnp() {
        let cfg = DcqcnConfig::default();
        let mut rp = ReactionPoint::new(100e9);
        rp.on_cnp(0, &cfg);
        let a0 = rp.alpha(0, &cfg);
        let a = rp.alpha(3 * 55_000 + 10, &cfg);
        assert!((a - a0 * (1.0 - 1.0 / 256.0f64).powi(3)).abs() < 1e-12);
    }

    #[test]
    fn cnps_are_paced_to_one_per_interval() {
        let mut last = None;
        assert!(np_cnp_due(&mut last, 0, 50_000));
        assert!(!np_cnp_due(&mut last, 49_999, 50_000));
        assert!(np_cnp_due(&mut last, 50_000, 50_000));
    }
}
