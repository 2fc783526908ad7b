//! PFC (IEEE 802.1Qbb) thresholds of an ingress queue under the dynamic-threshold policy.
//!
//! An ingress queue (the bytes in the shared buffer that arrived on one port) may hold
//! `α × (B − used)` bytes (Choudhury & Hahne 1998, applied to ingress accounting as shared-buffer
//! switches do for lossless classes). Above it the switch sends XOFF to the port's upstream
//! sender; XON once the queue falls `gap` bytes below the threshold of the moment (issue 26:
//! XON 2 MTU below XOFF), or is empty.

/// The dynamic threshold, bytes: `alpha × (buffer − used)` (0 when the buffer is full).
#[inline]
pub fn threshold(alpha: f64, buffer: u64, used: u64) -> f64 {
    alpha * buffer.saturating_sub(used) as f64
}

/// XOFF is due: the ingress queue holds more than the threshold.
#[inline]
pub fn xoff_due(ingress_bytes: u64, threshold: f64) -> bool {
    ingress_bytes as f64 > threshold
}

/// XON is due: the ingress queue is empty or `gap` bytes below the threshold.
#[inline]
pub fn xon_due(ingress_bytes: u64, threshold: f64, gap: u64) -> bool {
    ingress_bytes == 0 || (ingress_bytes as f64) + (gap as f64) <= threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xoff_above_the_dynamic_threshold_and_xon_two_mtu_below() {
        let thr = threshold(0.125, 32_000_000, 16_000_000);
        assert_eq!(thr, 2_000_000.0);
        assert!(!xoff_due(2_000_000, thr));
        assert!(xoff_due(2_000_001, thr));
        assert!(!xon_due(2_000_000 - 8191, thr, 8192));
        assert!(xon_due(2_000_000 - 8192, thr, 8192));
        assert!(xon_due(0, 0.0, 8192));
    }
}
