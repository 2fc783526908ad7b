//! CPU time of a process from `/proc/<pid>/stat` (Linux `proc(5)`): `utime` + `stime`, fields
//! 14 and 15, in clock ticks of `sysconf(_SC_CLK_TCK)`. The tick rate is read from the
//! auxiliary vector (`AT_CLKTCK` in `/proc/self/auxv`), which is where libc's `sysconf` gets
//! it, so no `unsafe` FFI is needed.

use std::time::Duration;

/// `AT_CLKTCK` of `<elf.h>`.
const AT_CLKTCK: u64 = 17;

/// Clock ticks per second; 100 (Linux's USER_HZ everywhere) when the auxv cannot be read.
pub fn clock_ticks_per_sec() -> u64 {
    std::fs::read("/proc/self/auxv")
        .ok()
        .and_then(|a| auxv_value(&a, AT_CLKTCK))
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

/// The value of `key` in an auxv of native-endian 64-bit (type, value) pairs.
fn auxv_value(auxv: &[u8], key: u64) -> Option<u64> {
    auxv.chunks_exact(16)
        .map(|p| {
            let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]));
            (word(&p[..8]), word(&p[8..]))
        })
        .take_while(|&(t, _)| t != 0)
        .find(|&(t, _)| t == key)
        .map(|(_, v)| v)
}

/// utime + stime of `pid` (`None`: this process) in clock ticks. Errors: the process is gone
/// or the file is not in the `proc(5)` format.
pub fn cpu_ticks(pid: Option<u32>) -> std::io::Result<u64> {
    let path = pid.map_or_else(
        || "/proc/self/stat".to_string(),
        |p| format!("/proc/{p}/stat"),
    );
    let stat = std::fs::read_to_string(path)?;
    parse_stat(&stat).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "unexpected /proc/<pid>/stat format",
        )
    })
}

/// utime + stime of a `/proc/<pid>/stat` line. The command name (field 2) is in parentheses and
/// may hold spaces or `)`, so fields are counted from the last `)`: state is field 3.
fn parse_stat(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11); // fields 3..=13
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

/// CPU ticks to a duration.
pub fn ticks_to_duration(ticks: u64, per_sec: u64) -> Duration {
    Duration::from_micros(ticks.saturating_mul(1_000_000) / per_sec.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_command_names() {
        let line = "1234 (a b) c)) S 1 2 3 4 5 6 7 8 9 10 111 222 0 0 20 0 1 0 5 6 7";
        assert_eq!(parse_stat(line), Some(333));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1 2"), None);
    }

    #[test]
    fn reads_this_process() {
        let per_sec = clock_ticks_per_sec();
        assert!((1..=10_000).contains(&per_sec));
        assert!(cpu_ticks(None).is_ok());
        assert!(cpu_ticks(Some(std::process::id())).is_ok());
        assert_eq!(ticks_to_duration(250, 100), Duration::from_millis(2500));
    }

    #[test]
    fn auxv_lookup() {
        let mut a = Vec::new();
        for (t, v) in [(6u64, 4096u64), (17, 100), (0, 0), (17, 5)] {
            a.extend_from_slice(&t.to_ne_bytes());
            a.extend_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(auxv_value(&a, 17), Some(100));
        assert_eq!(auxv_value(&a, 99), None);
    }
}
