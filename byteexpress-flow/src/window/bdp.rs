//! Bandwidth-delay product.

/// Bandwidth-delay product: `bytes_per_sec × rtt_us / 1_000_000`, rounded up (unit: bytes).
/// Returns 0 only when either input is 0; saturates at `u64::MAX`.
///
/// Example: 100 Gbit/s (12.5 × 10⁹ bytes/s) × 10 µs = 125 000 bytes.
pub fn bdp_bytes(bytes_per_sec: u64, rtt_us: u64) -> u64 {
    let product = u128::from(bytes_per_sec) * u128::from(rtt_us);
    u64::try_from(product.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}
