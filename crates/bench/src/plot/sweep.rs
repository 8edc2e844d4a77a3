//! The sweep figure: p99 TTFT against offered load on a log axis, one line per variant (dots,
//! or triangles on the dashed least-load lines), and the floor's p99 dashed: how each policy's
//! tail grows as the fleet fills up.

use super::axis::{
    AxisText, Frame, Linear, chart, log_axis, log_ticks, mesh, num, round_nice, trim,
};
use super::figure::{DrawResult, Figure, layout};
use super::legend::{entries, legend};
use super::style::{FLOOR, line, style};
use super::{SIZE, SweepPoint};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::ops::Range;

type Line = Vec<(f64, f64)>;

pub(super) struct SweepFigure<'a> {
    title: &'a str,
    /// (label, (load, p99) by load)
    lines: Vec<(String, Line)>,
    /// (load, floor p99) by load
    floor: Line,
}

impl<'a> SweepFigure<'a> {
    /// One line per label (in order of first appearance) of the points with a finite load and a
    /// positive p99, and the first positive floor p99 at each load.
    pub(super) fn new(title: &'a str, pts: &[SweepPoint]) -> Self {
        let mut lines: Vec<(String, Line)> = Vec::new();
        let mut floor: Line = Vec::new();
        for p in pts {
            if !(p.load.is_finite() && p.p99.is_finite() && p.p99 > 0.0) {
                continue;
            }
            match lines.iter_mut().find(|(l, _)| l == p.label) {
                Some((_, v)) => v.push((p.load, p.p99)),
                None => lines.push((p.label.to_string(), vec![(p.load, p.p99)])),
            }
            let new_load = !floor.iter().any(|f| f.0 == p.load);
            if p.floor_p99.is_finite() && p.floor_p99 > 0.0 && new_load {
                floor.push((p.load, p.floor_p99));
            }
        }
        for (_, v) in &mut lines {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        floor.sort_by(|a, b| a.0.total_cmp(&b.0));
        SweepFigure {
            title,
            lines,
            floor,
        }
    }

    fn all(&self) -> impl Iterator<Item = &(f64, f64)> {
        self.lines
            .iter()
            .flat_map(|l| l.1.iter())
            .chain(&self.floor)
    }

    /// The load axis: labelled at every load swept, padded a little either side.
    fn load_axis(&self) -> Linear {
        let mut loads: Vec<f64> = self.all().map(|p| p.0).collect();
        loads.sort_by(f64::total_cmp);
        loads.dedup();
        let (l0, l1) = match (loads.first(), loads.last()) {
            (Some(a), Some(b)) => (*a, *b),
            _ => (0.0, 1.0),
        };
        let pad = ((l1 - l0) * 0.04).max(0.02);
        Linear::new((l0 - pad)..(l1 + pad), loads, vec![])
    }

    /// The p99 axis's range: nice values around every p99, at least a decade.
    fn p99_range(&self) -> Range<f64> {
        let ymin = self.all().map(|p| p.1).fold(f64::MAX, f64::min).min(1e6);
        let ymax = self.all().map(|p| p.1).fold(1e-6, f64::max);
        let y_lo = round_nice(ymin * 0.85, false);
        let y_hi = round_nice((ymax * 1.05).max(y_lo * 10.0), true);
        y_lo..y_hi
    }
}

impl Figure for SweepFigure<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let (plot, legend_area) = layout(root, self.title)?;
        let y = self.p99_range();
        let plot_h = SIZE.1 as f64 - 140.0;
        let y = log_axis(y.clone(), log_ticks(y.start, y.end, plot_h));
        let frame = Frame {
            margin: 16,
            y_labels: 72,
        };
        let mut chart = chart(&plot, frame, self.load_axis(), y)?;
        mesh(
            &mut chart,
            AxisText {
                desc: "offered load (fraction of nominal fleet capacity)",
                label: &|v| trim(*v),
            },
            AxisText {
                desc: "p99 time to first token (s, log scale)",
                label: &|v| num(*v),
            },
        )?;
        for (i, (_, pts)) in self.lines.iter().enumerate() {
            let (c, d) = style(i);
            line(&mut chart, pts.clone(), c, d, 2)?;
            if d {
                chart.draw_series(pts.iter().map(|p| TriangleMarker::new(*p, 6, c.filled())))?;
            } else {
                chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled())))?;
            }
        }
        line(&mut chart, self.floor.clone(), FLOOR, true, 2)?;
        let entries = entries(&self.lines);
        legend(
            &legend_area,
            "policy / signal",
            &entries,
            "TTFT floor p99",
            true,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check_figure, rows, text_xs};
    use super::super::{p99_vs_load, sweep_title};
    use crate::report::Row;

    #[test]
    fn sweep_figure_files() {
        let dir = tempfile::tempdir().unwrap();
        let sweep: Vec<Row> = [0.5, 0.7, 0.9, 1.0].into_iter().flat_map(rows).collect();
        let files = p99_vs_load(
            &dir.path().join("s9-p99-vs-load"),
            &sweep_title("s9", "ingest"),
            &sweep,
        )
        .unwrap();
        check_figure(&files, "TTFT floor p99");
        let svg = std::fs::read_to_string(&files[0]).unwrap();
        // Load ticks (0.5 and 1 are also p99 ticks).
        for load in ["0.7", "0.9"] {
            assert_eq!(text_xs(&svg, load).len(), 1, "tick {load}");
        }
    }
}
