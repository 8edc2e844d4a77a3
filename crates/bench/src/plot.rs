//! Plots for people, drawn with plotters and written twice, as `STEM.svg` and `STEM.png`:
//! * [`ttft_cdf`]: per variant, the TTFT CDF beside its tail — the share of requests slower than x
//!   on a log axis, where p90, p99 and p99.9 are evenly spaced — with the TTFT floor (each request
//!   alone on an idle engine) as its own black dashed line;
//! * [`p99_vs_load`]: p99 TTFT against offered load on a log axis, one line per variant, with the
//!   floor's p99 dashed.
//!
//! The legend has its own column right of the plots, so it never covers a curve; each variant has
//! its own colour (least-load variants are also dashed). Text is measured and, in the PNG, drawn
//! with DejaVu Sans embedded in the binary (`assets/`, license beside it): no system font needed.
//!
//! This file is the public API; the drawing is split by concern into the submodules below.

mod axis;
mod bitmap;
mod clip;
mod figure;
mod json;
mod legend;
mod style;
mod sweep;
#[cfg(test)]
mod testing;
mod ttft;

pub use json::from_json;

use crate::report::Row;
use crate::sim::quantile;
use figure::write_figure;
use loadlink_engine::PublishPoint;
use std::io;
use std::path::{Path, PathBuf};
use sweep::SweepFigure;
use ttft::TtftFigure;

/// Pixel size of every figure (SVG user units and PNG pixels).
pub const SIZE: (u32, u32) = (1280, 600);

/// One variant's TTFT samples (seconds, any order).
pub struct Curve<'a> {
    pub label: &'a str,
    pub ttft: &'a [f64],
}

/// One point of a load sweep.
pub struct SweepPoint<'a> {
    pub label: &'a str,
    pub load: f64,
    pub p99: f64,
    pub floor_p99: f64,
}

/// Title of a TTFT figure: `S1 simulated: time to first token per request (load 0.85)`, with a
/// non-default publish point named after the load.
pub fn ttft_title(scenario: &str, live: bool, publish_point: &str, load: f64) -> String {
    format!(
        "{}{}: time to first token per request (load {load:.2}{})",
        scenario.to_uppercase(),
        if live { " live" } else { " simulated" },
        point_note(publish_point)
    )
}

/// Title of a sweep figure.
pub fn sweep_title(scenario: &str, publish_point: &str) -> String {
    format!(
        "{} simulated: p99 time to first token against offered load{}",
        scenario.to_uppercase(),
        match point_note(publish_point) {
            n if n.is_empty() => n,
            n => format!(" ({})", n.trim_start_matches(", ")),
        }
    )
}

fn point_note(publish_point: &str) -> String {
    if publish_point == PublishPoint::default().as_str() {
        String::new()
    } else {
        format!(", publish point {publish_point}")
    }
}

/// TTFT CDF and tail of every row, the floor taken from the first row (the same requests in
/// every variant). Writes `STEM.svg` and `STEM.png`, returns their paths.
pub fn ttft_cdf(stem: &Path, title: &str, rows: &[Row]) -> io::Result<[PathBuf; 2]> {
    let curves: Vec<Curve> = rows
        .iter()
        .map(|r| Curve {
            label: &r.label,
            ttft: &r.outcome.ttft,
        })
        .collect();
    let floor = rows
        .first()
        .map(|r| r.outcome.ttft_floor.as_slice())
        .unwrap_or(&[]);
    ttft_cdf_samples(stem, title, &curves, floor)
}

/// [`ttft_cdf`] from bare samples.
pub fn ttft_cdf_samples(
    stem: &Path,
    title: &str,
    curves: &[Curve],
    floor: &[f64],
) -> io::Result<[PathBuf; 2]> {
    write_figure(stem, &TtftFigure::new(title, curves, floor))
}

/// p99 TTFT against load, one line per label (in order of first appearance), and the floor's p99.
pub fn p99_vs_load(stem: &Path, title: &str, rows: &[Row]) -> io::Result<[PathBuf; 2]> {
    let pts: Vec<SweepPoint> = rows
        .iter()
        .map(|r| SweepPoint {
            label: &r.label,
            load: r.load,
            p99: quantile(&r.outcome.ttft, 0.99),
            floor_p99: quantile(&r.outcome.ttft_floor, 0.99),
        })
        .collect();
    p99_vs_load_points(stem, title, &pts)
}

/// [`p99_vs_load`] from bare points.
pub fn p99_vs_load_points(
    stem: &Path,
    title: &str,
    pts: &[SweepPoint],
) -> io::Result<[PathBuf; 2]> {
    write_figure(stem, &SweepFigure::new(title, pts))
}
