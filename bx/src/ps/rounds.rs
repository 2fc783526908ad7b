//! `bx ps bench --rounds N`: the transports run interleaved N times (round 0 of each, then
//! round 1, ...), so that a machine's drift touches every row alike; this module takes each
//! row's medians over its rounds and its ratio of calls/s to `floor/tcp`'s.

use super::bench::Row;
use super::report::syscalls;

/// One transport's medians over its rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Median {
    /// The row's label (`floor/tcp`, `bx/rdma(soft0)`, ...).
    pub transport: String,
    /// Rounds it ran in.
    pub rounds: usize,
    /// Median calls per second.
    pub calls_per_sec: f64,
    /// Median p50 latency, µs.
    pub p50_us: f64,
    /// Median p99 latency, µs.
    pub p99_us: f64,
    /// Median client CPU per call, µs.
    pub client_cpu_us: f64,
    /// Median server CPU per call, µs; `None` when no round measured it.
    pub server_cpu_us: Option<f64>,
    /// Median client syscalls per call; `None` without perf.
    pub client_syscalls: Option<f64>,
    /// Median server syscalls per call; `None` without perf.
    pub server_syscalls: Option<f64>,
    /// Median calls/s over `floor/tcp`'s median; `None` without a floor row.
    pub vs_floor: Option<f64>,
}

/// The median of `v` (the mean of the middle two for an even count); `None` for none.
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Each transport's medians over `rows`, in the order the transports first ran.
pub fn medians(rows: &[Row]) -> Vec<Median> {
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.transport.as_str()) {
            names.push(&r.transport);
        }
    }
    let mut out: Vec<Median> = names
        .iter()
        .map(|name| {
            let of: Vec<&Row> = rows.iter().filter(|r| r.transport == *name).collect();
            let m = |f: &dyn Fn(&Row) -> f64| median(of.iter().map(|r| f(r)).collect());
            let opt =
                |f: &dyn Fn(&Row) -> Option<f64>| median(of.iter().filter_map(|r| f(r)).collect());
            Median {
                transport: name.to_string(),
                rounds: of.len(),
                calls_per_sec: m(&|r| r.calls_per_sec).unwrap_or(0.0),
                p50_us: m(&|r| r.p50_us as f64).unwrap_or(0.0),
                p99_us: m(&|r| r.p99_us as f64).unwrap_or(0.0),
                client_cpu_us: m(&|r| r.client_cpu_us).unwrap_or(0.0),
                server_cpu_us: opt(&|r| r.server_cpu_us),
                client_syscalls: opt(&|r| r.client_syscalls),
                server_syscalls: opt(&|r| r.server_syscalls),
                vs_floor: None,
            }
        })
        .collect();
    let floor = out
        .iter()
        .find(|m| m.transport == "floor/tcp")
        .map(|m| m.calls_per_sec);
    if let Some(f) = floor.filter(|&f| f > 0.0) {
        for m in &mut out {
            m.vs_floor = Some(m.calls_per_sec / f);
        }
    }
    out
}

/// The medians as an aligned text table (`-` where a value was not measured, `n/a` for
/// syscalls without perf).
pub fn table(medians: &[Median]) -> String {
    let mut s = format!(
        "{:<20} {:>6} {:>10} {:>9} {:>8} {:>8} {:>14} {:>14} {:>10} {:>10}\n",
        "median of rounds",
        "rounds",
        "calls/s",
        "vs floor",
        "p50 µs",
        "p99 µs",
        "client CPU µs",
        "server CPU µs",
        "client sys",
        "server sys"
    );
    for m in medians {
        s += &format!(
            "{:<20} {:>6} {:>10.0} {:>9} {:>8.0} {:>8.0} {:>14.2} {:>14} {:>10} {:>10}\n",
            m.transport,
            m.rounds,
            m.calls_per_sec,
            m.vs_floor
                .map_or_else(|| "-".to_string(), |v| format!("{v:.2}x")),
            m.p50_us,
            m.p99_us,
            m.client_cpu_us,
            m.server_cpu_us
                .map_or_else(|| "-".to_string(), |v| format!("{v:.2}")),
            syscalls(m.client_syscalls),
            syscalls(m.server_syscalls)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(t: &str, round: u32, cps: f64, sys: Option<f64>) -> Row {
        Row {
            transport: t.into(),
            calls: 1,
            mean_us: 1.0,
            p50_us: round as u64 + 10,
            p99_us: 100,
            p95_us: 50,
            p999_us: 200,
            calls_per_sec: cps,
            client_cpu_us: cps / 100.0,
            server_cpu_us: None,
            client_syscalls: sys,
            server_syscalls: None,
            round,
            cdf: vec![],
            fleet: None,
            push_bytes: None,
            mib_per_sec: None,
            idle: None,
        }
    }

    #[test]
    fn medians_are_per_transport_over_rounds_with_ratios_to_the_floor() {
        let rows = vec![
            row("floor/tcp", 0, 100.0, Some(1.0)),
            row("bx/tcp", 0, 10.0, None),
            row("floor/tcp", 1, 300.0, Some(3.0)),
            row("bx/tcp", 1, 90.0, None),
            row("floor/tcp", 2, 200.0, Some(2.0)),
            row("bx/tcp", 2, 50.0, None),
        ];
        let m = medians(&rows);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].transport, "floor/tcp");
        assert_eq!((m[0].rounds, m[0].calls_per_sec), (3, 200.0));
        assert_eq!(m[0].client_syscalls, Some(2.0));
        assert_eq!(m[0].p50_us, 11.0);
        assert_eq!(m[0].vs_floor, Some(1.0));
        assert_eq!(m[1].calls_per_sec, 50.0);
        assert_eq!(m[1].vs_floor, Some(0.25));
        assert_eq!(m[1].client_syscalls, None);
        let t = table(&m);
        assert!(t.lines().nth(2).unwrap().contains("0.25x"), "{t}");
        assert!(
            t.lines()
                .nth(2)
                .unwrap()
                .trim_end()
                .ends_with("n/a        n/a"),
            "{t}"
        );
        // no floor row: no ratios
        assert!(medians(&rows[1..2]).iter().all(|m| m.vs_floor.is_none()));
        assert_eq!(median(vec![4.0, 1.0]), Some(2.5));
    }
}
