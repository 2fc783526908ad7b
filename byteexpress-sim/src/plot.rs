//! SVG plots of a set of arms (plotters): push-latency CDF per arm, and the PS port's queue
//! depth over time per arm.

use std::path::Path;

use plotters::prelude::*;

use crate::error::SimError;
use crate::report::ArmResult;

fn perr(path: &Path, e: impl std::fmt::Display) -> SimError {
    SimError::Plot {
        path: path.display().to_string(),
        msg: e.to_string(),
    }
}

/// Points of a CDF of sorted `v`, at most ~`max` of them (every value at the tail).
fn cdf_points(v: &[f64], max: usize) -> Vec<(f64, f64)> {
    let n = v.len();
    let step = (n / max.max(1)).max(1);
    let mut pts: Vec<(f64, f64)> = (0..n)
        .filter(|i| i % step == 0 || *i + 1000 >= n)
        .map(|i| (v[i], (i + 1) as f64 / n as f64))
        .collect();
    pts.dedup_by(|a, b| a.0 == b.0 && a.1 <= b.1);
    pts
}

/// Push-latency CDF of each row (log-scale ms on x, fraction of pushes on y) into `path`.
///
/// # Errors
/// [`SimError::Plot`] when no row has samples or the file cannot be written.
pub fn latency_cdf(rows: &[ArmResult], title: &str, path: &Path) -> Result<(), SimError> {
    let xs = rows
        .iter()
        .flat_map(|r| r.lat_us_sorted.iter().map(|&u| u / 1e3));
    let lo = xs.clone().fold(f64::INFINITY, f64::min).max(1e-3);
    let hi = xs.fold(0.0, f64::max);
    if hi <= 0.0 {
        return Err(perr(path, "no latency samples"));
    }
    let (lo, hi) = (lo * 0.8, (hi * 1.25).max(lo * 2.0));
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| perr(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
        .map_err(|e| perr(path, e))?;
    chart
        .configure_mesh()
        .x_desc("push latency (ms, log scale)")
        .x_label_formatter(&|v| format!("{v:.2}"))
        .y_desc("fraction of pushes")
        .draw()
        .map_err(|e| perr(path, e))?;
    for (i, r) in rows.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts = cdf_points(&r.lat_us_sorted, 2000);
        chart
            .draw_series(LineSeries::new(
                pts.into_iter().map(|(x, y)| (x / 1e3, y)),
                color.stroke_width(2),
            ))
            .map_err(|e| perr(path, e))?
            .label(format!("{} (N={})", r.arm, r.workers))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| perr(path, e))?;
    root.present().map_err(|e| perr(path, e))
}

/// The PS port's queue depth (KB) over the first `window_ms` of simulated time, per row.
///
/// # Errors
/// [`SimError::Plot`] when the file cannot be written.
pub fn queue_depth(
    rows: &[ArmResult],
    title: &str,
    window_ms: f64,
    path: &Path,
) -> Result<(), SimError> {
    let hi_q = rows
        .iter()
        .flat_map(|r| {
            r.queue_samples
                .iter()
                .filter(|s| s.0 <= window_ms)
                .map(|s| s.1)
        })
        .max()
        .unwrap_or(0) as f64
        / 1e3;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| perr(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..window_ms, 0.0..(hi_q * 1.1).max(1.0))
        .map_err(|e| perr(path, e))?;
    chart
        .configure_mesh()
        .x_desc("simulated time (ms)")
        .y_desc("PS port queue (KB, max per bin)")
        .draw()
        .map_err(|e| perr(path, e))?;
    for (i, r) in rows.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                r.queue_samples
                    .iter()
                    .filter(|s| s.0 <= window_ms)
                    .map(|&(t, b)| (t, b as f64 / 1e3)),
                color.stroke_width(1),
            ))
            .map_err(|e| perr(path, e))?
            .label(format!("{} (N={})", r.arm, r.workers))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| perr(path, e))?;
    root.present().map_err(|e| perr(path, e))
}
