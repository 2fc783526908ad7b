//! What `bx ps bench` prints and writes: the rows as a text table, as JSON, and their latency
//! CDFs as an SVG plot.

use std::path::Path;

use hdrhistogram::Histogram;

use super::bench::{BenchArgs, Policy, Row};
use super::size::show_size;

/// Points of the latency CDF of `hist` (µs, fraction): every percent, then the tail.
pub(super) fn cdf(hist: &Histogram<u64>) -> Vec<(f64, f64)> {
    if hist.is_empty() {
        return Vec::new();
    }
    let tail = [0.995, 0.999, 0.9995, 0.9999, 1.0];
    (0..100)
        .map(|i| f64::from(i) / 100.0)
        .chain(tail)
        .map(|q| (hist.value_at_quantile(q) as f64, q))
        .collect()
}

/// Syscalls per call to one decimal, or `n/a` without perf.
pub(super) fn syscalls(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.2}"))
}

/// The rows as an aligned text table (syscalls per call `n/a` without perf); rows of a fleet add the columns `failed` and
/// `ejections`, dense push rows the columns `push` (bytes per call) and `MiB/s`, rows with an
/// idle phase (`--idle`) the columns `idle client %` and `idle server %` (of one core).
pub fn table(rows: &[Row]) -> String {
    let fleet = rows.iter().any(|r| r.fleet.is_some());
    let push = rows.iter().any(|r| r.push_bytes.is_some());
    let idle = rows.iter().any(|r| r.idle.is_some());
    let mut s = format!(
        "{:<20} {:>9} {:>9} {:>8} {:>8} {:>9} {:>10} {:>14} {:>14} {:>10} {:>10}",
        "transport",
        "calls",
        "mean µs",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "calls/s",
        "client CPU µs",
        "server CPU µs",
        "client sys",
        "server sys"
    );
    if fleet {
        s += &format!(
            " {:>8} {:>8} {:>8} {:>9}",
            "failed", "retried", "hedged", "ejections"
        );
    }
    if push {
        s += &format!(" {:>8} {:>9}", "push", "MiB/s");
    }
    if idle {
        s += &format!(" {:>15} {:>15}", "idle client %", "idle server %");
    }
    s += "\n";
    for r in rows {
        let server_cpu = r
            .server_cpu_us
            .map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
        s += &format!(
            "{:<20} {:>9} {:>9.1} {:>8} {:>8} {:>9} {:>10.0} {:>14.1} {:>14} {:>10} {:>10}",
            r.transport,
            r.calls,
            r.mean_us,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.calls_per_sec,
            r.client_cpu_us,
            server_cpu,
            syscalls(r.client_syscalls),
            syscalls(r.server_syscalls)
        );
        if fleet {
            let f = r.fleet.unwrap_or_default();
            s += &format!(
                " {:>8} {:>8} {:>8} {:>9}",
                f.failed,
                or_dash(f.retried),
                or_dash(f.hedged),
                or_dash(f.ejections)
            );
        }
        if push {
            s += &format!(
                " {:>8} {:>9}",
                r.push_bytes.map_or_else(|| "-".to_string(), show_size),
                r.mib_per_sec
                    .map_or_else(|| "-".to_string(), |v| format!("{v:.1}"))
            );
        }
        if idle {
            let pct = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
            s += &format!(
                " {:>15} {:>15}",
                pct(r.idle.map(|i| i.client_core_pct)),
                pct(r.idle.and_then(|i| i.server_core_pct))
            );
        }
        s += "\n";
    }
    s
}

/// `v`, or JSON's `null` for none.
fn or_null(v: Option<u64>) -> String {
    v.map_or_else(|| "null".to_string(), |v| v.to_string())
}

/// `v`, or `-` for none.
fn or_dash(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// The settings and every row as one JSON object: `{"settings": {...}, "rows": [...]}`, row
/// fields named as in [`Row`] (without the CDF), `server_cpu_us` null for a server the bench
/// did not start. A fleet bench adds the settings `servers`, `replicas`, `fault` (null
/// without), `fault_at_s` and `deadline_ms`, and the row fields of [`FleetCounts`](super::bench::FleetCounts)
/// (`ejections` null for h2). With `--push-bytes`, the settings add `push_bytes` (a list of
/// bytes) and every row its `push_bytes` and `mib_per_sec`. Every row has `round` and
/// `client_syscalls` / `server_syscalls` per call (null without perf); the settings
/// `config` (the preset, or null) and `rounds`. With `--idle`, every row of a single server adds `idle_s`,
/// `idle_client_core_pct` and `idle_server_core_pct` (% of one core; null as `server_cpu_us`).
pub fn json(args: &BenchArgs, rows: &[Row]) -> String {
    let transports: Vec<String> = args.transports().iter().map(|t| json_str(t)).collect();
    let fleet = match args.servers {
        None => String::new(),
        Some(n) => format!(
            ", \"servers\": {n}, \"replicas\": {}, \"fault\": {}, \"fault_at_s\": {}, \"deadline_ms\": {}, \"policy\": {}",
            args.replicas,
            args.fault
                .map_or_else(|| "null".to_string(), |f| json_str(f.name())),
            finite(args.fault_at().as_secs_f64()),
            args.deadline().unwrap_or_default().as_millis(),
            match (&args.service_config, args.policy) {
                (Some(p), _) => json_str(&p.display().to_string()),
                (None, Policy::None) => "null".to_string(),
                (None, Policy::Retries) => json_str("retries"),
                (None, Policy::Hedging) =>
                    json_str(&format!("hedging {} ms", args.hedging_delay_ms)),
            }
        ),
    };
    let push = if args.push_bytes.is_empty() {
        String::new()
    } else {
        let b: Vec<String> = args.push_bytes.iter().map(u64::to_string).collect();
        format!(", \"push_bytes\": [{}]", b.join(", "))
    };
    let settings = format!(
        "{{\"keys\": {}, \"dim\": {}, \"keys_per_call\": {}, \"skew\": {}, \"workers\": {}, \"in_flight\": {}, \"duration_s\": {}, \"warmup_s\": {}, \"push_ratio\": {}, \"transports\": [{}], \"server\": {}, \"config\": {}, \"rounds\": {}{fleet}{push}}}",
        args.keys,
        args.dim,
        args.keys_per_call,
        finite(args.skew),
        args.workers,
        args.in_flight,
        finite(args.duration),
        finite(args.warmup),
        finite(args.push_ratio),
        transports.join(", "),
        args.server
            .as_deref()
            .map_or_else(|| "null".to_string(), json_str),
        args.config.map_or_else(
            || "null".to_string(),
            |p| json_str(&format!("{p:?}").to_lowercase())
        ),
        args.rounds,
    );
    let objs: Vec<String> = rows
        .iter()
        .map(|r| {
            let fleet = r.fleet.map_or_else(String::new, |f| {
                format!(
                    ", \"failed\": {}, \"retried\": {}, \"hedged\": {}, \"ejections\": {}",
                    f.failed,
                    or_null(f.retried),
                    or_null(f.hedged),
                    or_null(f.ejections)
                )
            });
            let push = r.push_bytes.map_or_else(String::new, |b| {
                format!(
                    ", \"push_bytes\": {b}, \"mib_per_sec\": {:.3}",
                    finite(r.mib_per_sec.unwrap_or(0.0))
                )
            });
            let idle = r.idle.map_or_else(String::new, |i| {
                format!(
                    ", \"idle_s\": {:.3}, \"idle_client_core_pct\": {:.3}, \"idle_server_core_pct\": {}",
                    finite(i.seconds),
                    finite(i.client_core_pct),
                    i.server_core_pct
                        .map_or_else(|| "null".to_string(), |v| format!("{:.3}", finite(v)))
                )
            });
            format!(
                "    {{\"transport\": {}, \"calls\": {}, \"mean_us\": {:.3}, \"p50_us\": {}, \"p95_us\": {}, \"p99_us\": {}, \"p999_us\": {}, \"calls_per_sec\": {:.3}, \"client_cpu_us\": {:.3}, \"server_cpu_us\": {}, \"client_syscalls\": {}, \"server_syscalls\": {}, \"round\": {}{fleet}{push}{idle}}}",
                json_str(&r.transport),
                r.calls,
                finite(r.mean_us),
                r.p50_us,
                r.p95_us,
                r.p99_us,
                r.p999_us,
                finite(r.calls_per_sec),
                finite(r.client_cpu_us),
                r.server_cpu_us
                    .map_or_else(|| "null".to_string(), |v| format!("{:.3}", finite(v))),
                r.client_syscalls
                    .map_or_else(|| "null".to_string(), |v| format!("{:.3}", finite(v))),
                r.server_syscalls
                    .map_or_else(|| "null".to_string(), |v| format!("{:.3}", finite(v))),
                r.round
            )
        })
        .collect();
    format!(
        "{{\n  \"settings\": {settings},\n  \"rows\": [\n{}\n  ]\n}}\n",
        objs.join(",\n")
    )
}

/// A JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out += "\\\"",
            '\\' => out += "\\\\",
            c if (c as u32) < 0x20 => out += &format!("\\u{:04x}", c as u32),
            c => out.push(c),
        }
    }
    out + "\""
}

/// JSON has no NaN or infinity.
fn finite(v: f64) -> f64 {
    if v.is_finite() { v } else { 0.0 }
}

/// Draws each row's latency CDF (log-scale µs on x, fraction of calls on y) into an SVG file
/// with `plotters`, one curve per row, labelled with the row's transport. Errors: no row has
/// samples, or the file cannot be written.
pub fn plot(rows: &[Row], path: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    let xs = rows.iter().flat_map(|r| r.cdf.iter().map(|p| p.0));
    let lo = xs.clone().fold(f64::INFINITY, f64::min).max(1.0);
    let hi = xs.fold(0.0, f64::max);
    if !hi.is_finite() || hi <= 0.0 {
        return Err("no latency samples to plot".into());
    }
    let (lo, hi) = (lo * 0.9, (hi * 1.1).max(lo * 2.0));
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("bx ps bench: latency CDF per transport", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("latency (µs, log scale)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_desc("fraction of calls")
        .draw()
        .map_err(|x| e(&x))?;
    for (i, r) in rows.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                r.cdf.iter().map(|&(x, y)| (x.max(lo), y)),
                color.stroke_width(2),
            ))
            .map_err(|x| e(&x))?
            .label(r.label())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ps::args::tests::parse;
    use crate::ps::bench::FleetCounts;

    fn row() -> Row {
        Row {
            transport: "bx/rdma".into(),
            calls: 10,
            mean_us: 12.5,
            p50_us: 11,
            p99_us: 20,
            p95_us: 15,
            p999_us: 30,
            calls_per_sec: 1000.0,
            client_cpu_us: 5.0,
            server_cpu_us: Some(f64::NAN),
            client_syscalls: Some(0.5),
            server_syscalls: None,
            round: 0,
            cdf: vec![(10.0, 0.0), (11.0, 0.5), (30.0, 1.0)],
            fleet: None,
            push_bytes: None,
            mib_per_sec: None,
            idle: None,
        }
    }

    fn args() -> BenchArgs {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct A {
            #[command(flatten)]
            b: BenchArgs,
        }
        A::parse_from([
            "bench",
            "--server",
            "127.0.0.1:9",
            "--transports",
            "rdma,tcp",
        ])
        .b
    }

    #[test]
    fn table_and_json_shapes() {
        let t = table(&[row()]);
        assert_eq!(t.lines().count(), 2);
        assert!(t.contains("bx/rdma"));
        let other = Row {
            server_cpu_us: None,
            ..row()
        };
        let t = table(std::slice::from_ref(&other));
        assert!(
            t.lines()
                .nth(1)
                .unwrap()
                .trim_end()
                .ends_with("-       0.50        n/a"),
            "{t}"
        );
        let j = json(&args(), &[row(), other]);
        assert!(j.contains("\"transport\": \"bx/rdma\""));
        assert!(j.contains("\"server_cpu_us\": 0.000"));
        assert!(j.contains("\"server_cpu_us\": null"));
        assert!(j.contains("\"server\": \"127.0.0.1:9\""), "{j}");
        assert!(j.contains("\"transports\": [\"rdma\", \"tcp\"]"), "{j}");
        // settings, and one object per row
        assert_eq!(j.matches('{').count(), 4);
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }

    #[test]
    fn fleet_rows_add_failed_retried_hedged_and_ejections_to_the_table_and_json() {
        let fleet = |n: Option<u64>| Row {
            fleet: Some(FleetCounts {
                failed: 7,
                retried: n.map(|n| n + 3),
                hedged: n.map(|n| n + 1),
                ejections: n,
            }),
            ..row()
        };
        let t = table(&[fleet(Some(2)), fleet(None)]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].ends_with("   failed  retried   hedged ejections"),
            "{t}"
        );
        assert!(
            lines[1].ends_with("        7        5        3         2"),
            "{t}"
        );
        assert!(
            lines[2].ends_with("        7        -        -         -"),
            "{t}"
        );
        use clap::Parser;
        #[derive(clap::Parser)]
        struct A {
            #[command(flatten)]
            b: BenchArgs,
        }
        let a = A::parse_from([
            "bench",
            "--servers",
            "2",
            "--replicas",
            "3",
            "--fault",
            "kill",
            "--policy",
            "retries",
        ])
        .b;
        let j = json(&a, &[fleet(Some(2)), fleet(None)]);
        assert!(
            j.contains("\"servers\": 2, \"replicas\": 3, \"fault\": \"kill\", \"fault_at_s\": 2.666666667, \"deadline_ms\": 1000, \"policy\": \"retries\"}"),
            "{j}"
        );
        assert!(
            j.contains("\"failed\": 7, \"retried\": 5, \"hedged\": 3, \"ejections\": 2}"),
            "{j}"
        );
        assert!(
            j.contains("\"failed\": 7, \"retried\": null, \"hedged\": null, \"ejections\": null}"),
            "{j}"
        );
        assert_eq!(j.matches('{').count(), 4);
        // flags that make no sense without a fleet are refused
        assert!(A::try_parse_from(["bench", "--fault", "kill"]).is_err());
        assert!(A::try_parse_from(["bench", "--policy", "retries"]).is_err());
        assert!(A::try_parse_from(["bench", "--servers", "2", "--server", "h:1"]).is_err());
        assert!(A::try_parse_from(["bench", "--servers", "0"]).is_err());
        // each policy is a valid A6 service config; none is no config
        for (p, kind) in [("retries", "retry"), ("hedging", "hedging")] {
            let a = A::parse_from(["bench", "--servers", "1", "--policy", p]).b;
            let sc = a.service_config().unwrap().expect("a policy");
            let m = sc
                .method("/ps.ParameterServer/Pull")
                .expect("Pull has a policy");
            assert!(format!("{m:?}").to_lowercase().contains(kind), "{m:?}");
            assert!(sc.method("/ps.ParameterServer/Push").is_none());
        }
        let a = A::parse_from(["bench", "--servers", "1"]).b;
        assert!(a.service_config().unwrap().is_none());
    }

    #[test]
    fn rows_with_an_idle_phase_add_its_cpu_to_the_table_and_json() {
        use crate::ps::bench::Idle;
        let idle = Row {
            idle: Some(Idle {
                seconds: 5.0,
                client_core_pct: 0.4,
                server_core_pct: Some(0.25),
            }),
            ..row()
        };
        let inproc = Row {
            idle: Some(Idle {
                server_core_pct: None,
                ..idle.idle.unwrap()
            }),
            ..row()
        };
        let t = table(&[idle.clone(), inproc.clone()]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].ends_with("  idle client %   idle server %"), "{t}");
        assert!(lines[1].ends_with("           0.40            0.25"), "{t}");
        assert!(lines[2].ends_with("           0.40               -"), "{t}");
        assert!(
            !table(&[row()]).contains("idle"),
            "no idle phase, no idle columns"
        );
        let j = json(&args(), &[idle, inproc]);
        assert!(
            j.contains(
                "\"idle_s\": 5.000, \"idle_client_core_pct\": 0.400, \"idle_server_core_pct\": 0.250}"
            ),
            "{j}"
        );
        assert!(j.contains("\"idle_server_core_pct\": null}"), "{j}");
        assert!(!json(&args(), &[row()]).contains("idle"));
    }

    #[test]
    fn push_rows_add_their_size_and_mib_per_s_to_the_table_json_and_plot_label() {
        let push = Row {
            push_bytes: Some(4 << 20),
            mib_per_sec: Some(123.456),
            ..row()
        };
        let t = table(std::slice::from_ref(&push));
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].ends_with("    push     MiB/s"), "{t}");
        assert!(lines[1].ends_with("    4MiB     123.5"), "{t}");
        // the Zipf table is as it was: no push columns
        assert!(!table(&[row()]).contains("MiB/s"));
        let a = parse(&["--push-bytes", "4MiB"]).unwrap();
        let j = json(&a, std::slice::from_ref(&push));
        assert!(j.contains("\"push_bytes\": [4194304]}"), "{j}");
        assert!(
            j.contains("\"push_bytes\": 4194304, \"mib_per_sec\": 123.456}"),
            "{j}"
        );
        let j = json(&args(), &[row()]);
        assert!(
            !j.contains("push_bytes") && !j.contains("mib_per_sec"),
            "{j}"
        );
        assert_eq!(push.label(), "bx/rdma push 4MiB");
        assert_eq!(row().label(), "bx/rdma");
    }

    #[test]
    fn the_plot_is_an_svg_with_one_curve_per_row() {
        let dir = std::env::temp_dir().join(format!("bx-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cdf.svg");
        let tcp = Row {
            transport: "bx/tcp".into(),
            cdf: vec![(20.0, 0.0), (25.0, 0.5), (90.0, 1.0)],
            ..row()
        };
        plot(&[row(), tcp], &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        assert!(
            svg.contains("bx/rdma") && svg.contains("bx/tcp"),
            "labels missing"
        );
        assert!(svg.matches("<polyline").count() >= 2, "curves missing");
        assert!(
            plot(
                &[Row {
                    cdf: vec![],
                    ..row()
                }],
                &path
            )
            .is_err()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
