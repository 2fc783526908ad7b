//! IB timer codes: RNR NAK delay (`min_rnr_timer`) and local ACK timeout (`timeout`).

use std::time::Duration;

/// RNR NAK timer codes 0..=31 in microseconds (IBA table 45; code 0 is the longest).
const RNR_US: [u64; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// Delay before an RNR retry for `min_rnr_timer` code `code` (codes above 31 saturate).
pub(crate) fn rnr_delay(code: u8) -> Duration {
    Duration::from_micros(RNR_US[(code as usize).min(31)])
}

/// Local ACK timeout 4.096 µs · 2^code; `None` for code 0 (infinite).
pub(crate) fn ack_timeout(code: u8) -> Option<Duration> {
    (code != 0).then(|| Duration::from_nanos(4096u64 << code.min(31)))
}

/// How long a silent peer is tolerated: timeout × (retry_cnt + 1); `None` = forever.
pub(crate) fn give_up_after(timeout: u8, retry_cnt: u8) -> Option<Duration> {
    ack_timeout(timeout).map(|t| t * (u32::from(retry_cnt.min(7)) + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_codes_match_the_spec() {
        assert_eq!(rnr_delay(12), Duration::from_micros(640));
        assert_eq!(rnr_delay(0), Duration::from_micros(655_360));
        assert_eq!(rnr_delay(200), Duration::from_micros(491_520));
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(14), Some(Duration::from_nanos(4096 << 14)));
        assert_eq!(
            give_up_after(10, 3),
            Some(Duration::from_nanos(4096 << 10) * 4)
        );
    }
}
