//! The `grpc-timeout` header (gRPC over HTTP/2 spec, `doc/PROTOCOL-HTTP2.md`):
//! `TimeoutValue TimeoutUnit`, where the value is 1 to 8 ASCII digits and the unit one of
//! `H` (hours), `M` (minutes), `S` (seconds), `m` (milliseconds), `u` (microseconds),
//! `n` (nanoseconds).

use std::time::Duration;

/// Largest value the spec allows: 8 digits.
const MAX_VALUE: u64 = 99_999_999;

/// Parses a `grpc-timeout` value. `None` when it is malformed (empty, more than 8 digits, a
/// non-digit, or an unknown unit); callers then ignore the header, as tonic's server does.
pub fn parse(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Formats `d` as a `grpc-timeout` value: the finest unit whose value fits in 8 digits,
/// rounding up so the peer never sees a shorter deadline than ours (a zero duration becomes
/// `0n`). Durations above 99,999,999 hours are capped there.
pub fn format(d: Duration) -> String {
    let nanos = d.as_nanos();
    let units: [(u128, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    for (scale, unit) in units {
        let v = nanos.div_ceil(scale);
        if v <= u128::from(MAX_VALUE) {
            return format!("{v}{unit}");
        }
    }
    format!("{MAX_VALUE}H")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse(b"3H"), Some(Duration::from_secs(3 * 3600)));
        assert_eq!(parse(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse(b"7S"), Some(Duration::from_secs(7)));
        assert_eq!(parse(b"250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse(b"99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(parse(b"50000000n"), Some(Duration::from_millis(50)));
        assert_eq!(parse(b"0m"), Some(Duration::ZERO));
    }

    #[test]
    fn rejects_malformed_values() {
        for bad in [
            &b""[..],
            b"m",
            b"123456789m",
            b"12x",
            b"-1S",
            b"1.5S",
            b"1s",
            b" 1S",
            b"\xff",
            b"10",
        ] {
            assert_eq!(parse(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn formats_with_the_finest_unit_that_fits_and_rounds_up() {
        assert_eq!(format(Duration::from_millis(50)), "50000000n");
        assert_eq!(format(Duration::from_secs(1)), "1000000u");
        assert_eq!(format(Duration::from_secs(100)), "100000m");
        assert_eq!(format(Duration::from_nanos(100_000_000_001)), "100001m");
        assert_eq!(format(Duration::ZERO), "0n");
        assert_eq!(format(Duration::MAX), "99999999H");
    }

    #[test]
    fn round_trips_never_shorten() {
        for ms in [1u64, 7, 999, 123_456, 86_400_000, 5_000_000_000] {
            let d = Duration::from_millis(ms);
            let back = parse(format(d).as_bytes()).expect("own format parses");
            assert!(back >= d, "{d:?} -> {back:?}");
        }
    }
}
