//! The device-level account shared by the QP windows of one device.

use super::{WindowError, bdp_bytes};

/// Bytes in flight over all QPs of one device, with a static cap (unit: bytes).
///
/// QP [`Window`](super::Window)s charge into it on every post and release it on every
/// completion; it is never changed directly. One per device, owned by whatever drives that
/// device's QPs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceWindow {
    cap: u64,
    in_flight: u64,
}

impl DeviceWindow {
    /// A device account capped at `cap` bytes in flight.
    ///
    /// # Errors
    /// [`WindowError::ZeroCap`] when `cap` is 0.
    pub fn new(cap: u64) -> Result<Self, WindowError> {
        if cap == 0 {
            return Err(WindowError::ZeroCap);
        }
        Ok(Self { cap, in_flight: 0 })
    }

    /// A device account capped at the bandwidth-delay product: `bytes_per_sec` (bytes/s) ×
    /// `rtt_us` (µs), see [`bdp_bytes`].
    ///
    /// # Errors
    /// [`WindowError::ZeroCap`] when either input is 0.
    pub fn from_bdp(bytes_per_sec: u64, rtt_us: u64) -> Result<Self, WindowError> {
        Self::new(bdp_bytes(bytes_per_sec, rtt_us))
    }

    /// An account that never limits (cap `u64::MAX` bytes), for a QP used alone.
    pub fn unlimited() -> Self {
        Self {
            cap: u64::MAX,
            in_flight: 0,
        }
    }

    /// The cap (unit: bytes).
    #[inline]
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Bytes posted on any QP of this device and not yet completed (unit: bytes).
    #[inline]
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Whether a post of `bytes` passes this account's cap (admission rule, module docs).
    #[inline]
    pub fn admits(&self, bytes: u64) -> bool {
        admits(self.in_flight, self.cap, bytes)
    }

    /// Sets the bytes in flight after an admitted post (the sum the admission computed).
    #[inline]
    pub(super) fn set_in_flight(&mut self, bytes: u64) {
        self.in_flight = bytes;
    }

    #[inline]
    pub(super) fn release(&mut self, bytes: u64) {
        self.in_flight -= bytes;
    }
}

/// The admission rule for one account: fits under the cap, or the account is empty.
#[inline]
pub(super) fn admits(in_flight: u64, cap: u64, bytes: u64) -> bool {
    admit(in_flight, cap, bytes).is_some()
}

/// The admission rule for one account, deciding the post too: `None` when refused, else the
/// bytes in flight after the post (no overflow: it fits under the cap, or the account was
/// empty) and whether that is over the cap (single-chunk escape).
#[inline]
pub(crate) fn admit(in_flight: u64, cap: u64, bytes: u64) -> Option<(u64, bool)> {
    if in_flight == 0 {
        return Some((bytes, bytes > cap));
    }
    match in_flight.checked_add(bytes) {
        Some(sum) if sum <= cap => Some((sum, false)),
        _ => None,
    }
}
