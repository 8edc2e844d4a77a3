//! The TTFT figure: per variant, the CDF (left panel) beside its tail (right panel) — the share
//! of requests slower than x on a log axis, where p90, p99 and p99.9 are evenly spaced — with the
//! TTFT floor (each request alone on an idle engine) as its own black dashed line. The tail is
//! where routers differ, and a linear CDF squeezes it into the top few pixels; hence two panels.

use super::axis::{
    AxisText, ChartResult, Frame, Linear, LogAxis, chart, log_axis, log_ticks, mesh, num,
    round_nice, tail_label,
};
use super::clip::clip_loglog;
use super::figure::{DrawResult, Figure, LEGEND_W, layout, panel_title};
use super::legend::{entries, legend};
use super::style::{FLOOR, line, style};
use super::{Curve, SIZE};
use plotters::coord::Shift;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::prelude::*;
use std::ops::Range;

/// Width of one panel's plotting area, for choosing how many ticks fit.
const PLOT_W: f64 = (SIZE.0 - LEGEND_W) as f64 / 2.0 - 90.0;

pub(super) struct TtftFigure<'a> {
    title: &'a str,
    /// (label, sorted samples)
    curves: Vec<(String, Vec<f64>)>,
    /// sorted
    floor: Vec<f64>,
}

/// The tail panel's box: x from the fastest median, y (share slower) from just below the
/// slowest request up to half.
struct TailBox {
    x_lo: f64,
    hi: f64,
    y_lo: f64,
    y_hi: f64,
}

impl<'a> TtftFigure<'a> {
    /// The figure of `curves` and `floor`, their finite samples sorted.
    pub(super) fn new(title: &'a str, curves: &[Curve], floor: &[f64]) -> Self {
        let sorted = |v: &[f64]| {
            let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
            v.sort_by(f64::total_cmp);
            v
        };
        TtftFigure {
            title,
            curves: curves
                .iter()
                .map(|c| (c.label.to_string(), sorted(c.ttft)))
                .collect(),
            floor: sorted(floor),
        }
    }

    /// Every sample set, the floor last.
    fn all(&self) -> impl Iterator<Item = &[f64]> {
        self.curves
            .iter()
            .map(|c| c.1.as_slice())
            .chain([self.floor.as_slice()])
    }

    fn positive(&self) -> impl Iterator<Item = f64> {
        self.all().flatten().copied().filter(|v| *v > 0.0)
    }

    /// Every sample set with its colour and dashing, the floor last.
    fn series(&self) -> impl Iterator<Item = (&[f64], RGBColor, bool)> {
        let curves = self.curves.iter().enumerate().map(|(i, (_, v))| {
            let (c, d) = style(i);
            (v.as_slice(), c, d)
        });
        curves.chain([(self.floor.as_slice(), FLOOR, true)])
    }

    /// Left: the CDF, linear, over every sample.
    fn draw_cdf<DB: DrawingBackend>(
        &self,
        panel: &DrawingArea<DB, Shift>,
        hi: f64,
    ) -> DrawResult<DB> {
        let lo = round_nice(
            self.positive().fold(f64::MAX, f64::min).min(hi / 10.0),
            false,
        );
        let y = Panel {
            caption: "CDF: share of requests at or below x",
            y_labels: 64,
            y: Linear::new(
                0.0..1.0,
                vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
                vec![0.1, 0.3, 0.5, 0.7, 0.9],
            ),
            y_text: AxisText {
                desc: "share of requests",
                label: &|v| format!("{v:.1}"),
            },
        };
        let mut cdf = panel_chart(panel, lo..hi, y)?;
        for (v, c, d) in self.series() {
            line(&mut cdf, cdf_points(v), c, d, 2)?;
        }
        Ok(())
    }

    fn tail_box(&self, hi: f64) -> TailBox {
        let n_max = self.all().map(<[f64]>::len).max().unwrap_or(1).max(10);
        // Down to just below the slowest request, or to the decade under it when that is close,
        // so that at least one percentile below p90 is labelled.
        let below_last = 0.8 / n_max as f64;
        let decade = 10f64.powf(below_last.log10().floor());
        let y_lo = if decade * 2.0 >= below_last {
            decade * 0.9
        } else {
            below_last
        };
        let fastest_median = self
            .all()
            .filter(|v| !v.is_empty())
            .map(|v| v[v.len() / 2])
            .filter(|v| *v > 0.0)
            .fold(f64::MAX, f64::min);
        let x_lo = round_nice(fastest_median.min(hi / 3.0), false);
        TailBox {
            x_lo,
            hi,
            y_lo,
            y_hi: 0.5,
        }
    }

    /// Right: the slower half, share of requests slower than x on a log axis, so that p90, p99
    /// and p99.9 get the same height; x starts at the fastest median.
    fn draw_tail<DB: DrawingBackend>(
        &self,
        panel: &DrawingArea<DB, Shift>,
        hi: f64,
    ) -> DrawResult<DB> {
        let b = self.tail_box(hi);
        let y = Panel {
            caption: "tail: share of requests slower than x",
            y_labels: 124,
            y: log_axis(b.y_lo..b.y_hi, tail_ticks(b.y_lo, b.y_hi)),
            y_text: AxisText {
                desc: "share slower (log scale)",
                label: &|v| tail_label(*v),
            },
        };
        let mut tail = panel_chart(panel, b.x_lo..b.hi, y)?;
        for (v, c, d) in self.series() {
            for piece in clip_loglog(&tail_points(v), (b.x_lo, b.hi), (b.y_lo, b.y_hi)) {
                line(&mut tail, piece, c, d, 2)?;
            }
        }
        Ok(())
    }
}

/// One panel's y axis and caption; the x axis is always TTFT on a log scale.
struct Panel<'f, Y: Ranged> {
    caption: &'f str,
    /// Width of the y-label column.
    y_labels: u32,
    y: Y,
    y_text: AxisText<'f, Y::ValueType>,
}

/// Captions `panel` and builds its chart over TTFT in `x` × `spec.y`, grid and axes drawn.
fn panel_chart<'a, DB, Y, YV>(
    panel: &DrawingArea<DB, Shift>,
    x: Range<f64>,
    spec: Panel<'_, Y>,
) -> ChartResult<'a, DB, LogAxis, Y>
where
    DB: DrawingBackend,
    Y: Ranged<ValueType = YV> + ValueFormatter<YV>,
{
    let ticks = log_ticks(x.start, x.end, PLOT_W);
    let area = panel_title(panel, spec.caption, spec.y_labels)?;
    let frame = Frame {
        margin: 12,
        y_labels: spec.y_labels,
    };
    let mut chart = chart(&area, frame, log_axis(x, ticks), spec.y)?;
    let x_text = AxisText {
        desc: "time to first token (s, log scale)",
        label: &|v| num(*v),
    };
    mesh(&mut chart, x_text, spec.y_text)?;
    Ok(chart)
}

impl Figure for TtftFigure<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let (plots, legend_area) = layout(root, self.title)?;
        let panels = plots.split_evenly((1, 2));
        let hi = round_nice(self.positive().fold(1e-3, f64::max), true);
        self.draw_cdf(&panels[0], hi)?;
        self.draw_tail(&panels[1], hi)?;
        let entries = entries(&self.curves);
        legend(
            &legend_area,
            "policy / signal",
            &entries,
            "TTFT floor",
            false,
        )
    }
}

/// The tail's y ticks: (labelled 10^-k and 0.5, grid-only 5·10^-k, 2·10^-k and 0.2).
fn tail_ticks(y_lo: f64, y_hi: f64) -> (Vec<f64>, Vec<f64>) {
    let bold = (1..=8)
        .map(|k| 10f64.powi(-k))
        .chain([0.5])
        .filter(|v| *v >= y_lo)
        .collect();
    let light = (1..=8)
        .flat_map(|k| [5.0, 2.0].map(|m| m * 10f64.powi(-k)))
        .chain([0.2])
        .filter(|v| *v >= y_lo && *v < y_hi)
        .collect();
    (bold, light)
}

/// CDF points of sorted samples `v`: (sample, share at or below it).
fn cdf_points(v: &[f64]) -> Vec<(f64, f64)> {
    thinned(v, |i, n| (i + 1) as f64 / n as f64)
}

/// Tail points of sorted samples `v`: (sample, share at or above it).
fn tail_points(v: &[f64]) -> Vec<(f64, f64)> {
    thinned(v, |i, n| (n - i) as f64 / n as f64)
}

/// (sample, `share(i, n)`) of the positive samples [`keep`] keeps of sorted `v`, `i` the rank.
fn thinned(v: &[f64], share: fn(usize, usize) -> f64) -> Vec<(f64, f64)> {
    let n = v.len();
    keep(n)
        .into_iter()
        .filter(|&i| v[i] > 0.0)
        .map(|i| (v[i], share(i, n)))
        .collect()
}

/// Indices into `n` sorted samples that keep a curve's shape with few points: each of the 100
/// largest (the far tail, where single requests show), then ranks about 1% apart in the number of
/// requests above them.
fn keep(n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut above = n;
    while above >= 1 {
        out.push(n - above);
        above = ((above as f64 / 1.01) as usize).min(above - 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check_figure, count, png_rgb, rows};
    use super::super::{ttft_cdf, ttft_title};
    use super::*;

    #[test]
    fn ttft_figure_files() {
        let dir = tempfile::tempdir().unwrap();
        let stem = dir.path().join("s9-ttft-cdf");
        let files = ttft_cdf(&stem, &ttft_title("s9", false, "ingest", 0.85), &rows(0.85)).unwrap();
        assert_eq!(files[0], dir.path().join("s9-ttft-cdf.svg"));
        assert_eq!(files[1], dir.path().join("s9-ttft-cdf.png"));
        check_figure(&files, "TTFT floor");
        // The floor is drawn black, in the plots as well as in the legend.
        let (w, _, rgb) = png_rgb(&files[1]);
        assert!(count(&rgb, w, FLOOR, 0..SIZE.0 - LEGEND_W) > 1000);
    }

    #[test]
    fn keep_has_every_tail_sample_and_the_ends() {
        let k = keep(10_000);
        assert_eq!(k.first(), Some(&0));
        assert_eq!(k.last(), Some(&9_999));
        assert!(k.windows(2).all(|w| w[0] < w[1]));
        assert!((9_900..10_000).all(|i| k.contains(&i)));
        assert!(k.len() < 700, "{} points", k.len());
        assert_eq!(keep(1), vec![0]);
        assert!(keep(0).is_empty());
    }
}
