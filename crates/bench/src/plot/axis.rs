//! Axes: where the ticks go (1-2-5 on log axes, exact decimals), how they read (`0.05`,
//! `1% (p99)`), nice axis ends, and the one grid style every chart shares. plotters' own tick
//! choice labels log axes with values like 0.30000000000000004, hence all of this.

use super::figure::DrawResult;
use super::style::{GRID_BOLD, GRID_LIGHT, TICK, font};
use plotters::coord::Shift;
use plotters::coord::combinators::{LogCoord, WithKeyPoints};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::ops::Range;

/// `v` as a tick label: `0.05`, `0.2`, `1`, `20`.
pub(super) fn num(v: f64) -> String {
    let decimals = (-v.abs().log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

/// `v` with at most 4 decimals and no trailing zeros: `0.85`, `1`.
pub(super) fn trim(v: f64) -> String {
    let s = format!("{v:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A tail tick: the share slower and the percentile it marks, `1% (p99)`.
pub(super) fn tail_label(v: f64) -> String {
    if v >= 0.999 {
        return "all".into();
    }
    let pct = v * 100.0;
    let p = 100.0 - pct;
    format!("{}% (p{})", trim(pct), trim(p))
}

/// 1-2-5 values spanning `[lo, hi]`: (labelled, unlabelled grid) for a log axis about `px` long.
pub(super) fn log_ticks(lo: f64, hi: f64, px: f64) -> (Vec<f64>, Vec<f64>) {
    let decades = (hi / lo).log10().max(1e-9);
    let per_decade = px / decades;
    let (mut bold, mut light) = (Vec::new(), Vec::new());
    for k in (lo.log10().floor() as i32)..=(hi.log10().ceil() as i32) {
        for m in 1..10 {
            // Exact decimal values: 5e-2, not 5 * 0.01.
            let v: f64 = format!("{m}e{k}").parse().unwrap_or(f64::NAN);
            if !(v >= lo * 0.999 && v <= hi * 1.001) {
                continue;
            }
            let labelled = m == 1 || (per_decade >= 170.0 && (m == 2 || m == 5));
            if labelled {
                bold.push(v);
            } else if per_decade >= 60.0 || m == 1 {
                light.push(v);
            }
        }
    }
    (bold, light)
}

/// The next 1-2-3-5 value at or above `v` (`up`) or at or below it: an axis end.
pub(super) fn round_nice(v: f64, up: bool) -> f64 {
    let k = v.log10().floor() as i32;
    let steps: Vec<f64> = (k - 1..=k + 1)
        .flat_map(|e| [1, 2, 3, 5].map(|m| format!("{m}e{e}").parse::<f64>().unwrap_or(f64::NAN)))
        .collect();
    if up {
        steps.into_iter().find(|s| *s >= v * 0.999).unwrap_or(v)
    } else {
        steps
            .into_iter()
            .rev()
            .find(|s| *s <= v * 1.001)
            .unwrap_or(v)
    }
}

/// A log axis over `range` with the given (labelled, grid-only) tick values.
pub(super) fn log_axis(range: Range<f64>, (bold, light): (Vec<f64>, Vec<f64>)) -> LogAxis {
    range
        .log_scale()
        .with_key_points(bold)
        .with_light_points(light)
}

pub(super) type LogAxis = WithKeyPoints<LogCoord<f64>>;

/// A linear axis with fixed labelled and grid-only values (plotters' `with_key_points` on a
/// linear range has no default formatter, which `configure_mesh` requires).
pub(super) struct Linear {
    inner: RangedCoordf64,
    bold: Vec<f64>,
    light: Vec<f64>,
}

impl Linear {
    pub(super) fn new(r: Range<f64>, bold: Vec<f64>, light: Vec<f64>) -> Self {
        Self {
            inner: r.into(),
            bold,
            light,
        }
    }
}

impl Ranged for Linear {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;
    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(v, limit)
    }
    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.bold.clone()
        }
    }
    fn range(&self) -> Range<f64> {
        self.inner.range()
    }
}

/// The space a chart leaves around its plotting area: the margin and the y-label column width.
pub(super) struct Frame {
    pub margin: u32,
    pub y_labels: u32,
}

/// A chart of `x` × `y` values, or why plotters could not build or draw it.
pub(super) type ChartResult<'a, DB, X, Y> = Result<
    ChartContext<'a, DB, Cartesian2d<X, Y>>,
    DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>,
>;

/// A chart on `area` over `x` × `y`, with 56 pixels of x labels.
pub(super) fn chart<'a, DB: DrawingBackend, X: Ranged, Y: Ranged>(
    area: &DrawingArea<DB, Shift>,
    frame: Frame,
    x: X,
    y: Y,
) -> ChartResult<'a, DB, X, Y> {
    ChartBuilder::on(area)
        .margin(frame.margin)
        .x_label_area_size(56)
        .y_label_area_size(frame.y_labels)
        .build_cartesian_2d(x, y)
}

/// What an axis says: its description and how its ticks read.
pub(super) struct AxisText<'f, V> {
    pub desc: &'f str,
    pub label: &'f dyn Fn(&V) -> String,
}

/// Draws the grid, ticks and axis descriptions in the shared style.
pub(super) fn mesh<DB, X, Y, XV, YV>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<X, Y>>,
    x: AxisText<'_, XV>,
    y: AxisText<'_, YV>,
) -> DrawResult<DB>
where
    DB: DrawingBackend,
    X: Ranged<ValueType = XV> + ValueFormatter<XV>,
    Y: Ranged<ValueType = YV> + ValueFormatter<YV>,
{
    chart
        .configure_mesh()
        .x_desc(x.desc)
        .y_desc(y.desc)
        .x_label_formatter(x.label)
        .y_label_formatter(y.label)
        .label_style(font(TICK))
        .axis_desc_style(font(TICK))
        .bold_line_style(GRID_BOLD)
        .light_line_style(GRID_LIGHT)
        .draw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_exact_decimals() {
        assert_eq!(num(0.05), "0.05");
        assert_eq!(num(0.2), "0.2");
        assert_eq!(num(1.0), "1");
        assert_eq!(num(20.0), "20");
        assert_eq!(tail_label(0.01), "1% (p99)");
        assert_eq!(tail_label(0.001), "0.1% (p99.9)");
        assert_eq!(round_nice(0.34, false), 0.3);
        assert_eq!(round_nice(2.3, true), 3.0);
        assert_eq!(round_nice(0.05, false), 0.05);
        let (bold, _) = log_ticks(0.01, 10.0, 400.0);
        assert_eq!(bold, vec![0.01, 0.1, 1.0, 10.0]);
    }
}
