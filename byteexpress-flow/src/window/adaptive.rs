//! The adaptive, delay-based window: parameters and the AIMD controller.

use super::WindowError;

/// Parameters of the adaptive window (algorithm: [module docs](super)).
///
/// Built with [`AdaptiveConfig::new`] and refined with the `with_*` methods, each validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdaptiveConfig {
    min: u64,
    max: u64,
    initial: u64,
    target_delay_us: u64,
    additive_increase: u64,
    beta_permille: u32,
    max_decrease_permille: u32,
}

impl AdaptiveConfig {
    /// Default additive increase: 64 KiB per RTT (one default chunk, unit: bytes).
    pub const DEFAULT_ADDITIVE_INCREASE: u64 = 64 * 1024;
    /// Default decrease gain β: 500 ‰, so an RTT of twice the target cuts 25 %.
    pub const DEFAULT_BETA_PERMILLE: u32 = 500;
    /// Default largest cut per decrease: 500 ‰ (at most halve once per RTT, as Swift's
    /// `max_mdf`).
    pub const DEFAULT_MAX_DECREASE_PERMILLE: u32 = 500;

    /// A window clamped to `[min, max]` bytes, steering completion RTT towards
    /// `target_delay_us` (µs). Starts at `max` (a link starts at line rate, and the first
    /// completions above target pull it down); other parameters take their defaults.
    ///
    /// # Errors
    /// [`WindowError::ZeroCap`] when `min` is 0, [`WindowError::BadRange`] when `min > max`,
    /// [`WindowError::ZeroTargetDelay`] when `target_delay_us` is 0.
    pub fn new(min: u64, max: u64, target_delay_us: u64) -> Result<Self, WindowError> {
        if min == 0 {
            return Err(WindowError::ZeroCap);
        }
        if min > max {
            return Err(WindowError::BadRange { min, max });
        }
        if target_delay_us == 0 {
            return Err(WindowError::ZeroTargetDelay);
        }
        Ok(Self {
            min,
            max,
            initial: max,
            target_delay_us,
            additive_increase: Self::DEFAULT_ADDITIVE_INCREASE,
            beta_permille: Self::DEFAULT_BETA_PERMILLE,
            max_decrease_permille: Self::DEFAULT_MAX_DECREASE_PERMILLE,
        })
    }

    /// Sets the initial window (bytes).
    ///
    /// # Errors
    /// [`WindowError::InitialOutOfRange`] when outside `[min, max]`.
    pub fn with_initial(mut self, initial: u64) -> Result<Self, WindowError> {
        if initial < self.min || initial > self.max {
            return Err(WindowError::InitialOutOfRange {
                initial,
                min: self.min,
                max: self.max,
            });
        }
        self.initial = initial;
        Ok(self)
    }

    /// Sets the additive increase applied per window's worth of completed bytes while the
    /// delay is below target (unit: bytes per RTT).
    ///
    /// # Errors
    /// [`WindowError::ZeroIncrease`] when 0.
    pub fn with_additive_increase(mut self, bytes: u64) -> Result<Self, WindowError> {
        if bytes == 0 {
            return Err(WindowError::ZeroIncrease);
        }
        self.additive_increase = bytes;
        Ok(self)
    }

    /// Sets the decrease gain β (‰): the cut is `β × (rtt − target) / rtt`.
    ///
    /// # Errors
    /// [`WindowError::PermilleOutOfRange`] outside `1..=1000`.
    pub fn with_beta_permille(mut self, beta: u32) -> Result<Self, WindowError> {
        self.beta_permille = permille(beta)?;
        Ok(self)
    }

    /// Sets the largest cut of one decrease (‰ of the window).
    ///
    /// # Errors
    /// [`WindowError::PermilleOutOfRange`] outside `1..=1000`.
    pub fn with_max_decrease_permille(mut self, max: u32) -> Result<Self, WindowError> {
        self.max_decrease_permille = permille(max)?;
        Ok(self)
    }

    /// Lower clamp (bytes).
    pub fn min(&self) -> u64 {
        self.min
    }

    /// Upper clamp (bytes).
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Initial window (bytes).
    pub fn initial(&self) -> u64 {
        self.initial
    }

    /// Target completion delay (µs).
    pub fn target_delay_us(&self) -> u64 {
        self.target_delay_us
    }

    /// Additive increase (bytes per RTT).
    pub fn additive_increase(&self) -> u64 {
        self.additive_increase
    }

    /// Decrease gain β (‰).
    pub fn beta_permille(&self) -> u32 {
        self.beta_permille
    }

    /// Largest cut of one decrease (‰).
    pub fn max_decrease_permille(&self) -> u32 {
        self.max_decrease_permille
    }
}

fn permille(v: u32) -> Result<u32, WindowError> {
    if (1..=1000).contains(&v) {
        Ok(v)
    } else {
        Err(WindowError::PermilleOutOfRange(v))
    }
}

/// What one completion did to the window's cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Adjust {
    /// Cap unchanged (static window, delay at target, increase not yet due, decrease already
    /// applied within this RTT, or already at the clamp).
    Hold,
    /// Additive increase applied.
    Increased,
    /// Multiplicative decrease applied.
    Decreased,
}

/// AIMD controller state.
#[derive(Debug, Clone)]
pub(super) struct Aimd {
    cfg: AdaptiveConfig,
    /// Current window (bytes), in `[min, max]`.
    cwnd: u64,
    /// Bytes completed below target since the last change (bytes).
    acked: u64,
    /// Time of the last decrease (µs), if any.
    last_decrease_us: Option<u64>,
}

impl Aimd {
    pub(super) fn new(cfg: AdaptiveConfig) -> Self {
        Self {
            cfg,
            cwnd: cfg.initial,
            acked: 0,
            last_decrease_us: None,
        }
    }

    #[inline]
    pub(super) fn cwnd(&self) -> u64 {
        self.cwnd
    }

    pub(super) fn config(&self) -> &AdaptiveConfig {
        &self.cfg
    }

    #[inline]
    pub(super) fn on_complete(&mut self, bytes: u64, rtt_us: u64, now_us: u64) -> Adjust {
        let target = self.cfg.target_delay_us;
        if rtt_us < target {
            self.acked = self.acked.saturating_add(bytes);
            if self.acked < self.cwnd || self.cwnd == self.cfg.max {
                return Adjust::Hold;
            }
            self.acked = 0;
            self.cwnd = self
                .cwnd
                .saturating_add(self.cfg.additive_increase)
                .min(self.cfg.max);
            Adjust::Increased
        } else if rtt_us > target {
            let due = self
                .last_decrease_us
                .is_none_or(|t| now_us.saturating_sub(t) >= rtt_us);
            if !due || self.cwnd == self.cfg.min {
                return Adjust::Hold;
            }
            let gain = u128::from(self.cfg.beta_permille) * u128::from(rtt_us - target)
                / u128::from(rtt_us);
            let cut_permille = gain.min(u128::from(self.cfg.max_decrease_permille));
            // cut <= cwnd because cut_permille <= 1000; at least one byte.
            let cut = (u128::from(self.cwnd) * cut_permille / 1000) as u64;
            self.cwnd = (self.cwnd - cut.max(1)).max(self.cfg.min);
            self.acked = 0;
            self.last_decrease_us = Some(now_us);
            Adjust::Decreased
        } else {
            Adjust::Hold
        }
    }
}
