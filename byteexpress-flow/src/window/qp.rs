//! The per-QP window.

use super::adaptive::Aimd;
use super::device::{admit, admits};
use super::{AdaptiveConfig, Adjust, DeviceWindow, Limit, WindowError, WindowStats, bdp_bytes};
use crate::gate::Admitted;

/// Proof of an admitted post: what was charged (bytes) and whether it went through the
/// single-chunk escape. Report the same bytes in [`Window::on_complete`] when the post's
/// completion arrives (completions may be merged: any split of the posted bytes is valid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "the ticket's bytes must be reported to on_complete"]
pub struct Ticket {
    /// Bytes charged to the QP and device accounts.
    pub bytes: u64,
    /// Admitted over a cap because that account was empty (single-chunk escape).
    pub over_cap: bool,
}

/// A refused post: the first account whose cap it would exceed. Nothing was charged; retry
/// after a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocked {
    /// The limiting account ([`Limit::Qp`] is reported when both limit).
    pub limit: Limit,
    /// Bytes in flight on that account (unit: bytes).
    pub in_flight: u64,
    /// That account's cap at the time (unit: bytes).
    pub cap: u64,
}

/// Bytes in flight on one QP, capped statically or adaptively; posts also charge the
/// device's [`DeviceWindow`]. Rules: [module docs](super).
#[derive(Clone)]
pub struct Window {
    /// The cap now (bytes): the static cap, or the adaptive controller's window, copied
    /// after each completion so admission reads one field.
    cap: u64,
    /// The adaptive controller; `None` for a static window.
    aimd: Option<Aimd>,
    in_flight: u64,
    stats: WindowStats,
}

impl Window {
    /// A static window capped at `cap` bytes.
    ///
    /// # Errors
    /// [`WindowError::ZeroCap`] when `cap` is 0.
    pub fn fixed(cap: u64) -> Result<Self, WindowError> {
        if cap == 0 {
            return Err(WindowError::ZeroCap);
        }
        Ok(Self::with_mode(cap, None))
    }

    /// A static window sized to the bandwidth-delay product: `bytes_per_sec` (bytes/s) ×
    /// `rtt_us` (µs), see [`bdp_bytes`].
    ///
    /// # Errors
    /// [`WindowError::ZeroCap`] when either input is 0.
    pub fn from_bdp(bytes_per_sec: u64, rtt_us: u64) -> Result<Self, WindowError> {
        Self::fixed(bdp_bytes(bytes_per_sec, rtt_us))
    }

    /// An adaptive, delay-based window (AIMD on completion RTT), starting at
    /// `cfg.initial()`.
    pub fn adaptive(cfg: AdaptiveConfig) -> Self {
        Self::with_mode(cfg.initial(), Some(Aimd::new(cfg)))
    }

    fn with_mode(cap: u64, aimd: Option<Aimd>) -> Self {
        Self {
            cap,
            aimd,
            in_flight: 0,
            stats: WindowStats::default(),
        }
    }

    /// The current cap (unit: bytes): the static cap, or the adaptive window in `[min, max]`.
    #[inline]
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// The adaptive parameters, `None` for a static window.
    pub fn adaptive_config(&self) -> Option<&AdaptiveConfig> {
        self.aimd.as_ref().map(Aimd::config)
    }

    /// Bytes posted on this QP and not yet completed (unit: bytes).
    #[inline]
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Room under the QP cap (unit: bytes); 0 when full or over (after a decrease or escape).
    pub fn available(&self) -> u64 {
        self.cap().saturating_sub(self.in_flight)
    }

    /// Counters since creation.
    pub fn stats(&self) -> WindowStats {
        // Bytes posted are those completed plus those in flight: derived, not counted on
        // every post.
        WindowStats {
            posted_bytes: self.stats.completed_bytes.wrapping_add(self.in_flight),
            ..self.stats
        }
    }

    /// Whether [`Window::try_post`] of `bytes` would be admitted now (both caps). Pure.
    #[inline]
    pub fn can_post(&self, dev: &DeviceWindow, bytes: u64) -> bool {
        admits(self.in_flight, self.cap, bytes) && dev.admits(bytes)
    }

    /// Posts `bytes` if both this QP's cap and `dev`'s cap admit it (or the account is empty:
    /// single-chunk escape), charging both.
    ///
    /// # Errors
    /// [`Blocked`] naming the limiting account; nothing is charged. Keep the message queued
    /// and retry after the next [`Window::on_complete`] (on any QP of the device, if the
    /// device limited).
    #[inline]
    pub fn try_post(&mut self, dev: &mut DeviceWindow, bytes: u64) -> Result<Ticket, Blocked> {
        let cap = self.cap;
        let Some((qp_sum, qp_over)) = admit(self.in_flight, cap, bytes) else {
            self.stats.blocked += 1;
            return Err(Blocked {
                limit: Limit::Qp,
                in_flight: self.in_flight,
                cap,
            });
        };
        let Some((dev_sum, dev_over)) = admit(dev.in_flight(), dev.cap(), bytes) else {
            self.stats.blocked += 1;
            return Err(Blocked {
                limit: Limit::Device,
                in_flight: dev.in_flight(),
                cap: dev.cap(),
            });
        };
        let over_cap = qp_over | dev_over;
        self.in_flight = qp_sum;
        dev.set_in_flight(dev_sum);
        self.stats.posted += 1;
        self.stats.escapes += u64::from(over_cap);
        Ok(Ticket { bytes, over_cap })
    }

    /// Charges this QP's account and `dev` with a post that the gates admitted
    /// ([`crate::gate::admit_chunk`] on this window and `dev`, with nothing posted or
    /// completed on either since): the same as a [`Window::try_post`] that admits it.
    #[inline]
    pub fn charge(&mut self, dev: &mut DeviceWindow, admitted: Admitted) -> Ticket {
        let Admitted { bytes, over_cap } = admitted;
        self.in_flight += bytes;
        dev.set_in_flight(dev.in_flight() + bytes);
        self.stats.posted += 1;
        self.stats.escapes += u64::from(over_cap);
        Ticket { bytes, over_cap }
    }

    /// Records the completion of `bytes` posted on this QP (a CQE, possibly covering several
    /// posts), whose post → completion time was `rtt_us` (µs), observed at `now_us` (µs,
    /// monotonic). Releases both accounts and, in adaptive mode, adjusts the cap.
    ///
    /// # Errors
    /// [`WindowError::Overcomplete`] when `bytes` exceeds what is in flight on this QP or on
    /// `dev` (caller bug); nothing changes then.
    #[inline]
    pub fn on_complete(
        &mut self,
        dev: &mut DeviceWindow,
        bytes: u64,
        rtt_us: u64,
        now_us: u64,
    ) -> Result<Adjust, WindowError> {
        if bytes > self.in_flight {
            return Err(WindowError::Overcomplete {
                limit: Limit::Qp,
                bytes,
                in_flight: self.in_flight,
            });
        }
        if bytes > dev.in_flight() {
            return Err(WindowError::Overcomplete {
                limit: Limit::Device,
                bytes,
                in_flight: dev.in_flight(),
            });
        }
        self.in_flight -= bytes;
        dev.release(bytes);
        self.stats.completed_bytes = self.stats.completed_bytes.wrapping_add(bytes);
        let Some(aimd) = &mut self.aimd else {
            return Ok(Adjust::Hold);
        };
        // The controller changes its window only when it reports a change.
        let adjust = aimd.on_complete(bytes, rtt_us, now_us);
        match adjust {
            Adjust::Increased => self.stats.increases += 1,
            Adjust::Decreased => self.stats.decreases += 1,
            Adjust::Hold => return Ok(adjust),
        }
        self.cap = aimd.cwnd();
        Ok(adjust)
    }
}

impl std::fmt::Debug for Window {
    /// The fields, with the counters as [`Window::stats`] gives them (one is derived).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("cap", &self.cap)
            .field("aimd", &self.aimd)
            .field("in_flight", &self.in_flight)
            .field("stats", &self.stats())
            .finish()
    }
}
