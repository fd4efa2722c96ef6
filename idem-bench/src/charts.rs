//! SVG charts of a run (plotters): idem against raw per backend, workload and client
//! count, and the scaling curves. BENCHMARKS.md shows them beside the tables.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::Measurement;
use crate::scaling::ScaleReport;
use crate::target::BoxError;
use crate::workload::Workload;

const IDEM: RGBColor = RGBColor(31, 119, 180);
const RAW: RGBColor = RGBColor(190, 190, 190);
const SERIES: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

fn failed(err: impl std::fmt::Display) -> BoxError {
    format!("drawing a chart: {err}").into()
}

/// Writes every chart the report has data for; the paths written.
pub(crate) fn write(
    dir: &Path,
    measurements: &[Measurement],
    scaling: &ScaleReport,
) -> Result<Vec<PathBuf>, BoxError> {
    let mut written = Vec::new();
    let mut backends: Vec<&str> = measurements.iter().map(|m| m.backend).collect();
    backends.dedup();
    for backend in backends {
        let rows: Vec<&Measurement> = measurements
            .iter()
            .filter(|m| m.backend == backend)
            .collect();
        let path = dir.join(format!("idem-vs-raw-{backend}.svg"));
        idem_against_raw(&path, backend, &rows)?;
        written.push(path);
    }
    let mut scaled: Vec<&str> = scaling.rows.iter().map(|r| r.backend).collect();
    scaled.dedup();
    for backend in scaled {
        let path = dir.join(format!("scaling-{backend}.svg"));
        scaling_curves(&path, backend, scaling)?;
        written.push(path);
    }
    Ok(written)
}

/// Grouped bars: for each workload and client count, idem's and raw's operations per
/// second, with idem / raw written above.
fn idem_against_raw(path: &Path, backend: &str, rows: &[&Measurement]) -> Result<(), BoxError> {
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(failed)?;
    let top = rows
        .iter()
        .map(|m| m.idem_ops_per_sec.max(m.raw_ops_per_sec))
        .fold(1.0, f64::max)
        * 1.15;
    let labels: Vec<String> = rows
        .iter()
        .map(|m| format!("{} c={}", m.workload.name(), m.concurrency))
        .collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{backend}: idem (blue) against raw (grey), operations per second"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..rows.len() as f64, 0f64..top)
        .map_err(failed)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let slot = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 {
                labels.get(slot).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("ops/s")
        .draw()
        .map_err(failed)?;
    for (i, m) in rows.iter().enumerate() {
        let x = i as f64;
        chart
            .draw_series([
                Rectangle::new(
                    [(x + 0.1, 0.0), (x + 0.5, m.idem_ops_per_sec)],
                    IDEM.filled(),
                ),
                Rectangle::new([(x + 0.5, 0.0), (x + 0.9, m.raw_ops_per_sec)], RAW.filled()),
            ])
            .map_err(failed)?;
        chart
            .draw_series([Text::new(
                format!("{:.2}", m.ratio),
                (
                    x + 0.3,
                    m.idem_ops_per_sec.max(m.raw_ops_per_sec) + top * 0.03,
                ),
                ("sans-serif", 13),
            )])
            .map_err(failed)?;
    }
    root.present().map_err(failed)?;
    Ok(())
}

/// Operations per second against records in the store (both axes logarithmic), one line
/// per workload and client count.
fn scaling_curves(path: &Path, backend: &str, report: &ScaleReport) -> Result<(), BoxError> {
    let rows: Vec<_> = report
        .rows
        .iter()
        .filter(|r| r.backend == backend)
        .collect();
    let (mut low, mut high) = (f64::MAX, 1.0f64);
    let (mut fewest, mut most) = (u64::MAX, 1u64);
    for row in &rows {
        low = low.min(row.ops_per_sec);
        high = high.max(row.ops_per_sec);
        fewest = fewest.min(row.records);
        most = most.max(row.records);
    }
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(failed)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{backend}: operations per second against records in the store"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (fewest.max(1) as f64 / 2.0..most as f64 * 2.0).log_scale(),
            (low.max(1.0) / 2.0..high * 2.0).log_scale(),
        )
        .map_err(failed)?;
    chart
        .configure_mesh()
        .x_desc("records in the store")
        .y_desc("ops/s")
        .x_label_formatter(&|x| format!("{x:.0e}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(failed)?;
    let mut colour = SERIES.iter().cycle();
    for workload in [Workload::Fresh, Workload::Replay] {
        for clients in [1, 16] {
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.workload == workload && r.clients == clients)
                .map(|r| (r.records as f64, r.ops_per_sec))
                .collect();
            let colour = *colour.next().unwrap_or(&IDEM);
            if points.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
                .map_err(failed)?
                .label(format!("{} c={clients}", workload.name()))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                });
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(|p| Circle::new(p, 3, colour.filled())),
                )
                .map_err(failed)?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(failed)?;
    root.present().map_err(failed)?;
    Ok(())
}
