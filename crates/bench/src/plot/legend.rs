//! The legend column right of the plots (so it never covers a curve): a heading, one entry per
//! variant in its colour and dash (with the sweep's marker), then the floor and what it means.

use super::figure::DrawResult;
use super::style::{FLOOR, LEGEND, NOTE, font, style};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One legend line per labelled series, in the series' order and styles.
pub(super) fn entries<T>(series: &[(String, T)]) -> Vec<(String, RGBColor, bool)> {
    series
        .iter()
        .enumerate()
        .map(|(i, (l, _))| (l.clone(), style(i).0, style(i).1))
        .collect()
}

/// Legend entries (label, colour, dashed), one per line, then the floor entry with its
/// explanation; drawn in their own column so they never cover a curve.
pub(super) fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    heading: &str,
    entries: &[(String, RGBColor, bool)],
    floor_label: &str,
    markers: bool,
) -> DrawResult<DB> {
    let left = font(LEGEND).pos(Pos::new(HPos::Left, VPos::Center));
    let small = font(NOTE)
        .color(&RGBColor(0x55, 0x55, 0x55))
        .pos(Pos::new(HPos::Left, VPos::Center));
    let (x, mut y) = (12, 70);
    area.draw(&Text::new(heading.to_string(), (x, y), left.clone()))?;
    y += 30;
    for (label, color, dashed) in entries {
        legend_sample(area, (x, y), *color, *dashed, 3, markers)?;
        area.draw(&Text::new(label.clone(), (x + 46, y), left.clone()))?;
        y += 28;
    }
    y += 8;
    legend_sample(area, (x, y), FLOOR, true, 2, false)?;
    let floor_text = [
        (floor_label, 0, &left),
        ("each request alone on an idle engine:", 22, &small),
        ("no router can beat it", 41, &small),
    ];
    for (text, dy, style) in floor_text {
        area.draw(&Text::new(
            text.to_string(),
            (x + 46, y + dy),
            style.clone(),
        ))?;
    }
    Ok(())
}

/// A legend entry's sample: a short line, dashed or not, and a marker if asked.
fn legend_sample<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    color: RGBColor,
    dashed: bool,
    width: u32,
    marker: bool,
) -> DrawResult<DB> {
    let style = color.stroke_width(width);
    let pts = vec![(x, y), (x + 36, y)];
    if dashed {
        area.draw(&DashedPathElement::new(pts, 9, 5, style))?;
    } else {
        area.draw(&PathElement::new(pts, style))?;
    }
    if marker {
        marker_at(area, (x + 18, y), color, dashed)?;
    }
    Ok(())
}

/// The sweep's point marker: a triangle on dashed (least-load) lines, else a dot.
fn marker_at<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: (i32, i32),
    color: RGBColor,
    triangle: bool,
) -> DrawResult<DB> {
    if triangle {
        area.draw(&TriangleMarker::new(p, 6, color.filled()))
    } else {
        area.draw(&Circle::new(p, 4, color.filled()))
    }
}
