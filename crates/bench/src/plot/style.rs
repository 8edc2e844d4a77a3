//! How things look, in one place so that both figures and their legends agree: text sizes, the
//! font, one colour and dash per variant, the floor's black, the grid's greys, and drawing a
//! series dashed or solid.

use super::figure::DrawResult;
use plotters::prelude::*;

pub(super) const FAMILY: &str = "sans-serif";
// Text sizes in pixels: large enough to stay legible when a page shrinks the figure to ~70%.
pub(super) const TITLE: u32 = 24;
pub(super) const CAPTION: u32 = 18;
pub(super) const TICK: u32 = 15;
pub(super) const LEGEND: u32 = 16;
pub(super) const NOTE: u32 = 14;

/// How one variant is drawn: distinct colours in `scenario::VARIANTS` order, grouped by signal
/// (in-flight warm, engine blue, backlog green; Okabe–Ito based), least-load dashed.
const STYLES: [(RGBColor, bool); 7] = [
    (RGBColor(0xCC, 0x79, 0xA7), false), // round_robin / inflight: reddish purple
    (RGBColor(0xE6, 0x9F, 0x00), false), // power_of_two / inflight: orange
    (RGBColor(0x56, 0xB4, 0xE9), false), // power_of_two / engine: sky blue
    (RGBColor(0x00, 0x9E, 0x73), false), // power_of_two / backlog: bluish green
    (RGBColor(0xD5, 0x5E, 0x00), true),  // least_load / inflight: vermillion
    (RGBColor(0x00, 0x48, 0x9E), true),  // least_load / engine: dark blue
    (RGBColor(0x2E, 0x6B, 0x1F), true),  // least_load / backlog: dark green
];
/// Colours past the seventh variant, solid then dashed.
const EXTRA: [RGBColor; 3] = [
    RGBColor(0x8C, 0x56, 0x4B),
    RGBColor(0x7F, 0x7F, 0x7F),
    RGBColor(0xB8, 0x9B, 0x00),
];
/// The TTFT floor, always dashed.
pub(super) const FLOOR: RGBColor = BLACK;
pub(super) const GRID_BOLD: RGBColor = RGBColor(0xC8, 0xC8, 0xC8);
pub(super) const GRID_LIGHT: RGBColor = RGBColor(0xEC, 0xEC, 0xEC);

/// Colour and dashing of the `i`th variant.
pub(super) fn style(i: usize) -> (RGBColor, bool) {
    match STYLES.get(i) {
        Some(s) => *s,
        None => {
            let k = i - STYLES.len();
            (EXTRA[k % EXTRA.len()], (k / EXTRA.len()) % 2 == 1)
        }
    }
}

/// Black text of `size` pixels in the embedded font.
pub(super) fn font(size: u32) -> TextStyle<'static> {
    TextStyle::from((FAMILY, size).into_font()).color(&BLACK)
}

/// Draws a polyline, dashed or solid.
pub(super) fn line<DB, CT>(
    chart: &mut ChartContext<'_, DB, CT>,
    pts: Vec<(f64, f64)>,
    color: RGBColor,
    dashed: bool,
    width: u32,
) -> DrawResult<DB>
where
    DB: DrawingBackend,
    CT: CoordTranslate<From = (f64, f64)>,
{
    let style = color.stroke_width(width);
    if dashed {
        chart.draw_series(DashedLineSeries::new(pts, 9, 5, style))?;
    } else {
        chart.draw_series(LineSeries::new(pts, style))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_get_distinct_styles() {
        let colours: Vec<RGBColor> = (0..10).map(|i| style(i).0).collect();
        for (i, a) in colours.iter().enumerate() {
            assert_ne!(*a, FLOOR, "variant {i} drawn like the floor");
            assert_ne!(*a, WHITE);
        }
        for i in 0..7 {
            for j in 0..i {
                assert_ne!(colours[i], colours[j], "variants {i} and {j}");
            }
        }
    }
}
