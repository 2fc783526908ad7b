//! Byte sizes on the command line (`4MiB`, `64KiB,1MiB`) and the largest message the wire
//! carries today, for `bx ps bench --push-bytes` and `bx ps serve --max-message`.

/// The largest message the wire header's 32-bit lengths carry: 4 GiB − 1 bytes (the upper
/// bound of `Config::max_message`).
pub const WIRE_LIMIT: u64 = u32::MAX as u64;

/// Parses a positive byte count: digits, optionally followed by `B`, `KiB`, `MiB` or `GiB`
/// (powers of 1024; case-insensitive, `K`/`M`/`G` accepted too). Errors: empty, not a number,
/// an unknown suffix, zero, or a value that overflows `u64`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "{s:?} is not a size (digits, then B, KiB, MiB or GiB)"
        ));
    }
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?} (B, KiB, MiB or GiB)"
            ));
        }
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is too large a size"))?;
    let bytes = n
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large a size"))?;
    if bytes == 0 {
        return Err(format!("{s:?}: a size must be positive"));
    }
    Ok(bytes)
}

/// `bytes` the way a user writes it: `4MiB`, `64KiB`, `1GiB`, or plain bytes (`1000B`) when
/// it is no whole number of KiB.
pub fn show_size(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes_in_any_case() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("17B"), Ok(17));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("64mib"), Ok(64 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size(" 3 KiB "), Ok(3 << 10));
    }

    #[test]
    fn zero_overflow_and_garbage_sizes_are_refused_with_an_error() {
        for bad in [
            "",
            "0",
            "0MiB",
            "MiB",
            "-1",
            "4.5MiB",
            "4MB",
            "4 MiBs",
            "x",
            "18446744073709551616",
            "17179869184GiB",
        ] {
            let e = parse_size(bad).expect_err(bad);
            assert!(e.contains(&format!("{bad:?}")), "{bad:?}: {e}");
        }
    }

    #[test]
    fn sizes_show_in_the_largest_whole_unit() {
        assert_eq!(show_size(4 << 20), "4MiB");
        assert_eq!(show_size(64 << 10), "64KiB");
        assert_eq!(show_size(1536 << 10), "1536KiB");
        assert_eq!(show_size(1 << 30), "1GiB");
        assert_eq!(show_size(1000), "1000B");
    }
}
