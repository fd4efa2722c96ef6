//! SVG charts of a run (plotters): idem against raw per backend, workload and client
//! count, and the scaling curves. BENCHMARKS.md shows them beside the tables.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::Measurement;
use crate::scaling::ScaleReport;
use crate::target::BoxError;

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

/// One bar pair: a workload and client count on one backend.
#[derive(Clone, Debug, serde::Deserialize)]
pub(crate) struct Bar {
    pub(crate) backend: String,
    pub(crate) workload: String,
    pub(crate) concurrency: usize,
    pub(crate) idem_ops_per_sec: f64,
    pub(crate) raw_ops_per_sec: f64,
    pub(crate) ratio: f64,
}

/// One point of a scaling curve.
#[derive(Clone, Debug, serde::Deserialize)]
pub(crate) struct Point {
    pub(crate) backend: String,
    pub(crate) records: u64,
    pub(crate) workload: String,
    pub(crate) clients: usize,
    pub(crate) ops_per_sec: f64,
}

/// What a JSON report (`--json`) holds that the charts draw.
#[derive(serde::Deserialize)]
struct Saved {
    #[serde(default)]
    measurements: Vec<Bar>,
    #[serde(default)]
    scaling: SavedScaling,
}

#[derive(Default, serde::Deserialize)]
struct SavedScaling {
    #[serde(default)]
    rows: Vec<Point>,
}

/// Writes every chart the report has data for; the paths written.
pub(crate) fn write(
    dir: &Path,
    measurements: &[Measurement],
    scaling: &ScaleReport,
) -> Result<Vec<PathBuf>, BoxError> {
    let bars: Vec<Bar> = measurements
        .iter()
        .map(|m| Bar {
            backend: m.backend.to_owned(),
            workload: m.workload.name().to_owned(),
            concurrency: m.concurrency,
            idem_ops_per_sec: m.idem_ops_per_sec,
            raw_ops_per_sec: m.raw_ops_per_sec,
            ratio: m.ratio,
        })
        .collect();
    let points: Vec<Point> = scaling
        .rows
        .iter()
        .map(|r| Point {
            backend: r.backend.to_owned(),
            records: r.records,
            workload: r.workload.name().to_owned(),
            clients: r.clients,
            ops_per_sec: r.ops_per_sec,
        })
        .collect();
    draw(dir, &bars, &points)
}

/// Redraws the charts of saved JSON reports (`--json` files of earlier runs); a backend's
/// scaling curve comes from the last report that has one.
pub(crate) fn redraw(dir: &Path, reports: &[PathBuf]) -> Result<Vec<PathBuf>, BoxError> {
    let (mut bars, mut points): (Vec<Bar>, Vec<Point>) = (Vec::new(), Vec::new());
    for path in reports {
        let saved: Saved = serde_json::from_slice(&std::fs::read(path)?)
            .map_err(|err| format!("{}: not an idem-bench report: {err}", path.display()))?;
        let backends: Vec<String> = saved
            .scaling
            .rows
            .iter()
            .map(|p| p.backend.clone())
            .collect();
        points.retain(|p| !backends.contains(&p.backend));
        points.extend(saved.scaling.rows);
        let backends: Vec<String> = saved
            .measurements
            .iter()
            .map(|b| b.backend.clone())
            .collect();
        bars.retain(|b| !backends.contains(&b.backend));
        bars.extend(saved.measurements);
    }
    draw(dir, &bars, &points)
}

fn draw(dir: &Path, bars: &[Bar], points: &[Point]) -> Result<Vec<PathBuf>, BoxError> {
    let mut written = Vec::new();
    let mut backends: Vec<&str> = bars.iter().map(|b| b.backend.as_str()).collect();
    backends.dedup();
    for backend in backends {
        let rows: Vec<&Bar> = bars.iter().filter(|b| b.backend == backend).collect();
        let path = dir.join(format!("idem-vs-raw-{backend}.svg"));
        idem_against_raw(&path, backend, &rows)?;
        written.push(path);
    }
    let mut scaled: Vec<&str> = points.iter().map(|p| p.backend.as_str()).collect();
    scaled.dedup();
    for backend in scaled {
        let path = dir.join(format!("scaling-{backend}.svg"));
        scaling_curves(&path, backend, points)?;
        written.push(path);
    }
    Ok(written)
}

/// Grouped bars: for each workload and client count, idem's and raw's operations per
/// second, with idem / raw written above.
fn idem_against_raw(path: &Path, backend: &str, rows: &[&Bar]) -> Result<(), BoxError> {
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(failed)?;
    let top = rows
        .iter()
        .map(|m| m.idem_ops_per_sec.max(m.raw_ops_per_sec))
        .fold(1.0, f64::max)
        * 1.15;
    let labels: Vec<String> = rows
        .iter()
        .map(|m| format!("{} c={}", m.workload, m.concurrency))
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
        .y_label_formatter(&|y| format!("{y:.0}"))
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

/// Throughput against records in the store (logarithmic), relative to the smallest store
/// measured, one line per workload and client count: a flat line at 1.0 is a cost that
/// does not grow.
fn scaling_curves(path: &Path, backend: &str, points: &[Point]) -> Result<(), BoxError> {
    let rows: Vec<&Point> = points.iter().filter(|p| p.backend == backend).collect();
    let fewest = rows.iter().map(|p| p.records).min().unwrap_or(1).max(1);
    let most = rows
        .iter()
        .map(|p| p.records)
        .max()
        .unwrap_or(1)
        .max(fewest + 1);
    // (label, points relative to the first size)
    let mut lines = Vec::new();
    for workload in ["fresh", "replay"] {
        for clients in [1, 16] {
            let mut series: Vec<&&Point> = rows
                .iter()
                .filter(|p| p.workload == workload && p.clients == clients)
                .collect();
            series.sort_by_key(|p| p.records);
            let Some(first) = series.first() else {
                continue;
            };
            let base = first.ops_per_sec.max(1e-9);
            lines.push((
                format!(
                    "{workload}, {clients} client(s): {:.0}/s at the smallest",
                    base
                ),
                series
                    .iter()
                    .map(|p| (p.records as f64, p.ops_per_sec / base))
                    .collect::<Vec<_>>(),
            ));
        }
    }
    let top = lines
        .iter()
        .flat_map(|(_, points)| points.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.6;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(failed)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{backend}: throughput against records in the store (1.0 = as with the fewest)"
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (fewest as f64 / 2.0..most as f64 * 2.0).log_scale(),
            0f64..top,
        )
        .map_err(failed)?;
    chart
        .configure_mesh()
        .x_desc("records in the store")
        .y_desc("throughput, relative")
        .x_label_formatter(&|x| format!("{x:.0e}"))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()
        .map_err(failed)?;
    for ((label, points), colour) in lines.into_iter().zip(SERIES.iter().cycle()) {
        let colour = *colour;
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
            .map_err(failed)?
            .label(label)
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
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(failed)?;
    root.present().map_err(failed)?;
    Ok(())
}
