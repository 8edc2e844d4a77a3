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

use crate::report::Row;
use crate::sim::quantile;
use loadlink_engine::PublishPoint;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters_backend::{
    self as backend, BackendColor, BackendCoord, BackendTextStyle, DrawingErrorKind,
};
use serde_json::Value;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Pixel size of every figure (SVG user units and PNG pixels).
pub const SIZE: (u32, u32) = (1280, 600);
const LEGEND_W: u32 = 330;
const FAMILY: &str = "sans-serif";
// Text sizes in pixels: large enough to stay legible when a page shrinks the figure to ~70%.
const TITLE: u32 = 24;
const CAPTION: u32 = 18;
const TICK: u32 = 15;
const LEGEND: u32 = 16;
const NOTE: u32 = 14;
const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

fn font_ref() -> &'static ab_glyph::FontRef<'static> {
    static F: std::sync::OnceLock<ab_glyph::FontRef<'static>> = std::sync::OnceLock::new();
    F.get_or_init(|| {
        ab_glyph::FontRef::try_from_slice(FONT).expect("the embedded DejaVu Sans parses")
    })
}

/// Registers the embedded font as plotters' "sans-serif" (its `ab_glyph` text has no other).
fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_err() {
            panic!("the embedded DejaVu Sans does not parse");
        }
    });
}

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
const EXTRA: [RGBColor; 3] = [
    RGBColor(0x8C, 0x56, 0x4B),
    RGBColor(0x7F, 0x7F, 0x7F),
    RGBColor(0xB8, 0x9B, 0x00),
];
const FLOOR: RGBColor = BLACK;

fn style(i: usize) -> (RGBColor, bool) {
    match STYLES.get(i) {
        Some(s) => *s,
        None => {
            let k = i - STYLES.len();
            (EXTRA[k % EXTRA.len()], (k / EXTRA.len()) % 2 == 1)
        }
    }
}

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
    let sorted = |v: &[f64]| {
        let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let fig = TtftFigure {
        title,
        curves: curves
            .iter()
            .map(|c| (c.label.to_string(), sorted(c.ttft)))
            .collect(),
        floor: sorted(floor),
    };
    write_figure(stem, &fig)
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
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut floor: Vec<(f64, f64)> = Vec::new();
    for p in pts {
        if !(p.load.is_finite() && p.p99.is_finite() && p.p99 > 0.0) {
            continue;
        }
        match lines.iter_mut().find(|(l, _)| l == p.label) {
            Some((_, v)) => v.push((p.load, p.p99)),
            None => lines.push((p.label.to_string(), vec![(p.load, p.p99)])),
        }
        if p.floor_p99.is_finite() && p.floor_p99 > 0.0 && !floor.iter().any(|f| f.0 == p.load) {
            floor.push((p.load, p.floor_p99));
        }
    }
    for (_, v) in &mut lines {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    floor.sort_by(|a, b| a.0.total_cmp(&b.0));
    write_figure(
        stem,
        &SweepFigure {
            title,
            lines,
            floor,
        },
    )
}

/// `loadlink bench plot`: redraws the plots of a results JSON beside it — the TTFT figure when its
/// rows carry `ttft_samples_s` (live runs record them), the sweep when it has one. Returns the
/// files written and, for what it could not draw, why.
pub fn from_json(json: &Path) -> io::Result<(Vec<PathBuf>, Vec<String>)> {
    let text = std::fs::read_to_string(json)?;
    let doc: Value = serde_json::from_str(&text).map_err(io::Error::other)?;
    let base = json.with_extension("");
    let name = |suffix: &str| with_suffix(&base, suffix);
    let scenario = doc["scenario"].as_str().unwrap_or("?");
    let point = doc["publish_point"]
        .as_str()
        .unwrap_or(PublishPoint::default().as_str());
    let live = doc["mode"] == "live";
    let rows = doc["rows"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let (mut wrote, mut skipped) = (Vec::new(), Vec::new());
    let samples = |r: &Value, k: &str| -> Option<Vec<f64>> {
        r[k].as_array()?.iter().map(Value::as_f64).collect()
    };
    let with_samples: Option<Vec<(String, Vec<f64>)>> = rows
        .iter()
        .map(|r| {
            Some((
                r["variant"].as_str()?.to_string(),
                samples(r, "ttft_samples_s")?,
            ))
        })
        .collect();
    match with_samples {
        Some(c) if !c.is_empty() => {
            let floor = rows
                .first()
                .and_then(|r| samples(r, "ttft_floor_samples_s"))
                .unwrap_or_default();
            let curves: Vec<Curve> = c.iter().map(|(l, t)| Curve { label: l, ttft: t }).collect();
            let load = rows[0]["load"].as_f64().unwrap_or(f64::NAN);
            wrote.extend(ttft_cdf_samples(
                &name("-ttft-cdf"),
                &ttft_title(scenario, live, point, load),
                &curves,
                &floor,
            )?);
        }
        _ => skipped.push(format!(
            "TTFT plot: the rows of {} carry no ttft_samples_s ({})",
            json.display(),
            if live {
                "a live run from before they were recorded; only a rerun of `loadlink bench live` \
                 has them"
            } else {
                "simulated results do not; `loadlink bench sim` redraws them, it is deterministic"
            }
        )),
    }
    match doc["sweep"].as_array() {
        Some(sweep) if !sweep.is_empty() => {
            let pts: Vec<SweepPoint> = sweep
                .iter()
                .map(|r| SweepPoint {
                    label: r["variant"].as_str().unwrap_or("?"),
                    load: r["load"].as_f64().unwrap_or(f64::NAN),
                    p99: r["ttft_p99_s"].as_f64().unwrap_or(f64::NAN),
                    floor_p99: r["ttft_floor_p99_s"].as_f64().unwrap_or(f64::NAN),
                })
                .collect();
            wrote.extend(p99_vs_load_points(
                &name("-p99-vs-load"),
                &sweep_title(scenario, point),
                &pts,
            )?);
        }
        _ => skipped.push(format!("sweep plot: {} has no sweep", json.display())),
    }
    Ok((wrote, skipped))
}

// ---- rendering ---------------------------------------------------------------------------------

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

trait Figure {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB>;
}

fn with_suffix(stem: &Path, ext: &str) -> PathBuf {
    let mut s = stem.as_os_str().to_owned();
    s.push(ext);
    PathBuf::from(s)
}

/// Draws `fig` into `STEM.svg` and `STEM.png`.
fn write_figure(stem: &Path, fig: &impl Figure) -> io::Result<[PathBuf; 2]> {
    register_font();
    let err = |e: &dyn std::fmt::Display| io::Error::other(format!("plot {}: {e}", stem.display()));
    let svg = with_suffix(stem, ".svg");
    {
        let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
        fig.draw(&root).map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    let (w, h) = SIZE;
    let mut rgb = vec![0u8; w as usize * h as usize * 3];
    {
        let root = Bitmap(BitMapBackend::with_buffer(&mut rgb, SIZE)).into_drawing_area();
        fig.draw(&root).map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    let png = with_suffix(stem, ".png");
    let file = io::BufWriter::new(std::fs::File::create(&png)?);
    let mut enc = png::Encoder::new(file, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::High);
    let mut writer = enc.write_header().map_err(io::Error::other)?;
    writer.write_image_data(&rgb).map_err(io::Error::other)?;
    writer.finish().map_err(io::Error::other)?;
    Ok([svg, png])
}

/// plotters' `BitMapBackend` with its own text drawing: plotters 0.3.7's ab_glyph text drops each
/// glyph's side bearing and rounds the pen to whole pixels, which spaces letters unevenly
/// ("TTF T fl oor"). Here glyphs sit at their exact advance (kerned, sub-pixel) and are blended by
/// coverage. Widths match plotters' own estimate (the same advances), so layout is unchanged.
struct Bitmap<'a>(BitMapBackend<'a>);

type BitmapResult =
    Result<(), DrawingErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>>;

impl DrawingBackend for Bitmap<'_> {
    type ErrorType = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.0.get_size()
    }
    fn ensure_prepared(&mut self) -> BitmapResult {
        self.0.ensure_prepared()
    }
    fn present(&mut self) -> BitmapResult {
        self.0.present()
    }
    fn draw_pixel(&mut self, p: BackendCoord, c: BackendColor) -> BitmapResult {
        self.0.draw_pixel(p, c)
    }
    fn draw_line<S: backend::BackendStyle>(
        &mut self,
        a: BackendCoord,
        b: BackendCoord,
        s: &S,
    ) -> BitmapResult {
        self.0.draw_line(a, b, s)
    }
    fn draw_rect<S: backend::BackendStyle>(
        &mut self,
        a: BackendCoord,
        b: BackendCoord,
        s: &S,
        fill: bool,
    ) -> BitmapResult {
        self.0.draw_rect(a, b, s, fill)
    }
    fn draw_path<S: backend::BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        s: &S,
    ) -> BitmapResult {
        self.0.draw_path(path, s)
    }
    fn draw_circle<S: backend::BackendStyle>(
        &mut self,
        c: BackendCoord,
        r: u32,
        s: &S,
        fill: bool,
    ) -> BitmapResult {
        self.0.draw_circle(c, r, s, fill)
    }
    fn fill_polygon<S: backend::BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        s: &S,
    ) -> BitmapResult {
        self.0.fill_polygon(vert, s)
    }
    fn blit_bitmap(&mut self, pos: BackendCoord, size: (u32, u32), src: &[u8]) -> BitmapResult {
        self.0.blit_bitmap(pos, size, src)
    }

    fn draw_text<T: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &T,
        pos: BackendCoord,
    ) -> BitmapResult {
        use ab_glyph::{Font, ScaleFont};
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let font = font_ref();
        let scaled = font.as_scaled(style.size() as f32);
        let width: f32 = {
            let (mut w, mut prev) = (0.0, None);
            for ch in text.chars() {
                let id = scaled.glyph_id(ch);
                if let Some(p) = prev {
                    w += scaled.kern(p, id);
                }
                w += scaled.h_advance(id);
                prev = Some(id);
            }
            w
        };
        let x0 = match style.anchor().h_pos {
            HPos::Left => 0.0,
            HPos::Center => -width / 2.0,
            HPos::Right => -width,
        };
        // The baseline, from the anchor: plotters lays text out in a box `size / 1.24` high (its
        // estimate); the glyphs' ascent-descent box is centred on that box.
        let half = style.size() as f32 / 1.24 / 2.0;
        let centre = match style.anchor().v_pos {
            VPos::Top => half,
            VPos::Center => 0.0,
            VPos::Bottom => -half,
        };
        let baseline = centre + (scaled.ascent() + scaled.descent()) / 2.0;
        let transform = style.transform();
        let mut cover: Vec<(i32, i32, f32)> = Vec::new();
        let (mut pen, mut prev) = (x0, None);
        for ch in text.chars() {
            let id = scaled.glyph_id(ch);
            if let Some(p) = prev {
                pen += scaled.kern(p, id);
            }
            let glyph = id.with_scale_and_position(scaled.scale(), ab_glyph::point(pen, baseline));
            if let Some(outline) = font.outline_glyph(glyph) {
                let b = outline.px_bounds();
                outline.draw(|x, y, c| {
                    cover.push((b.min.x as i32 + x as i32, b.min.y as i32 + y as i32, c))
                });
            }
            pen += scaled.h_advance(id);
            prev = Some(id);
        }
        for (x, y, c) in cover {
            let (dx, dy) = transform.transform(x, y);
            let alpha = color.alpha * f64::from(c.clamp(0.0, 1.0));
            if alpha > 0.0 {
                self.0
                    .draw_pixel((pos.0 + dx, pos.1 + dy), color.mix(alpha / color.alpha))?;
            }
        }
        Ok(())
    }
}

fn font(size: u32) -> TextStyle<'static> {
    TextStyle::from((FAMILY, size).into_font()).color(&BLACK)
}

/// `v` as a tick label: `0.05`, `0.2`, `1`, `20`.
fn num(v: f64) -> String {
    let decimals = (-v.abs().log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

/// 1-2-5 values spanning `[lo, hi]`: (labelled, unlabelled grid) for a log axis about `px` long.
fn log_ticks(lo: f64, hi: f64, px: f64) -> (Vec<f64>, Vec<f64>) {
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
fn round_nice(v: f64, up: bool) -> f64 {
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

/// A linear axis with fixed labelled and grid-only values (plotters' `with_key_points` on a
/// linear range has no default formatter, which `configure_mesh` requires).
struct Linear {
    inner: RangedCoordf64,
    bold: Vec<f64>,
    light: Vec<f64>,
}

impl Linear {
    fn new(r: Range<f64>, bold: Vec<f64>, light: Vec<f64>) -> Self {
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

/// Draws a polyline, dashed or solid.
fn line<DB, CT>(
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

/// Legend entries (label, colour, dashed, line width), one per line, then the floor entry with
/// its explanation; drawn in their own column so they never cover a curve.
fn legend<DB: DrawingBackend>(
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
    area.draw(&Text::new(
        floor_label.to_string(),
        (x + 46, y),
        left.clone(),
    ))?;
    area.draw(&Text::new(
        "each request alone on an idle engine:".to_string(),
        (x + 46, y + 22),
        small.clone(),
    ))?;
    area.draw(&Text::new(
        "no router can beat it".to_string(),
        (x + 46, y + 41),
        small,
    ))?;
    Ok(())
}

/// Draws `title` centred over the plotting part of `panel` (right of its `y_labels` pixels of
/// y-axis labels, as built with a margin of 12) and returns the area below it.
fn panel_title<DB: DrawingBackend>(
    panel: &DrawingArea<DB, Shift>,
    title: &str,
    y_labels: u32,
) -> Result<DrawingArea<DB, Shift>, DrawingAreaErrorKind<DB::ErrorType>> {
    let (head, rest) = panel.split_vertically(40);
    let w = head.dim_in_pixel().0;
    let x = (12 + y_labels + w.saturating_sub(12)) / 2;
    head.draw(&Text::new(
        title.to_string(),
        (x as i32, 24),
        font(CAPTION).pos(Pos::new(HPos::Center, VPos::Center)),
    ))?;
    Ok(rest)
}

struct TtftFigure<'a> {
    title: &'a str,
    /// (label, sorted samples)
    curves: Vec<(String, Vec<f64>)>,
    /// sorted
    floor: Vec<f64>,
}

impl Figure for TtftFigure<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        root.fill(&WHITE)?;
        let body = root.titled(self.title, font(TITLE))?;
        let (plots, legend_area) = body.split_horizontally(SIZE.0 - LEGEND_W);
        let panels = plots.split_evenly((1, 2));
        let all = || {
            self.curves
                .iter()
                .map(|c| c.1.as_slice())
                .chain([self.floor.as_slice()])
        };
        let positive = || all().flatten().copied().filter(|v| *v > 0.0);
        let hi = round_nice(positive().fold(1e-3, f64::max), true);
        let plot_w = (SIZE.0 - LEGEND_W) as f64 / 2.0 - 90.0;
        let grid_bold = RGBColor(0xC8, 0xC8, 0xC8);
        let grid_light = RGBColor(0xEC, 0xEC, 0xEC);
        let x_desc = "time to first token (s, log scale)";

        // Left: the CDF, linear, over every sample.
        let lo = round_nice(positive().fold(f64::MAX, f64::min).min(hi / 10.0), false);
        let (xb, xl) = log_ticks(lo, hi, plot_w);
        let area = panel_title(&panels[0], "CDF: share of requests at or below x", 64)?;
        let mut cdf = ChartBuilder::on(&area)
            .margin(12)
            .x_label_area_size(56)
            .y_label_area_size(64)
            .build_cartesian_2d(
                (lo..hi)
                    .log_scale()
                    .with_key_points(xb)
                    .with_light_points(xl),
                Linear::new(
                    0.0..1.0,
                    vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
                    vec![0.1, 0.3, 0.5, 0.7, 0.9],
                ),
            )?;
        cdf.configure_mesh()
            .x_desc(x_desc)
            .y_desc("share of requests")
            .x_label_formatter(&|v| num(*v))
            .y_label_formatter(&|v| format!("{v:.1}"))
            .label_style(font(TICK))
            .axis_desc_style(font(TICK))
            .bold_line_style(grid_bold)
            .light_line_style(grid_light)
            .draw()?;
        let cdf_pts = |v: &[f64]| -> Vec<(f64, f64)> {
            let n = v.len();
            keep(n)
                .into_iter()
                .filter(|&i| v[i] > 0.0)
                .map(|i| (v[i], (i + 1) as f64 / n as f64))
                .collect()
        };
        for (i, (_, v)) in self.curves.iter().enumerate() {
            let (c, d) = style(i);
            line(&mut cdf, cdf_pts(v), c, d, 2)?;
        }
        line(&mut cdf, cdf_pts(&self.floor), FLOOR, true, 2)?;

        // Right: the slower half, share of requests slower than x on a log axis, so that p90, p99
        // and p99.9 get the same height; x starts at the fastest median.
        let n_max = all().map(<[f64]>::len).max().unwrap_or(1).max(10);
        // Down to just below the slowest request, or to the decade under it when that is close,
        // so that at least one percentile below p90 is labelled.
        let below_last = 0.8 / n_max as f64;
        let decade = 10f64.powf(below_last.log10().floor());
        let y_lo = if decade * 2.0 >= below_last {
            decade * 0.9
        } else {
            below_last
        };
        let y_hi = 0.5;
        let x_lo = round_nice(
            all()
                .filter(|v| !v.is_empty())
                .map(|v| v[v.len() / 2])
                .filter(|v| *v > 0.0)
                .fold(f64::MAX, f64::min)
                .min(hi / 3.0),
            false,
        );
        let (xb, xl) = log_ticks(x_lo, hi, plot_w);
        let y_bold: Vec<f64> = (1..=8)
            .map(|k| 10f64.powi(-k))
            .chain([0.5])
            .filter(|v| *v >= y_lo)
            .collect();
        let y_light: Vec<f64> = (1..=8)
            .flat_map(|k| [5.0, 2.0].map(|m| m * 10f64.powi(-k)))
            .chain([0.2])
            .filter(|v| *v >= y_lo && *v < y_hi)
            .collect();
        let area = panel_title(&panels[1], "tail: share of requests slower than x", 124)?;
        let mut tail = ChartBuilder::on(&area)
            .margin(12)
            .x_label_area_size(56)
            .y_label_area_size(124)
            .build_cartesian_2d(
                (x_lo..hi)
                    .log_scale()
                    .with_key_points(xb)
                    .with_light_points(xl),
                (y_lo..y_hi)
                    .log_scale()
                    .with_key_points(y_bold)
                    .with_light_points(y_light),
            )?;
        tail.configure_mesh()
            .x_desc(x_desc)
            .y_desc("share slower (log scale)")
            .x_label_formatter(&|v| num(*v))
            .y_label_formatter(&|v| tail_label(*v))
            .label_style(font(TICK))
            .axis_desc_style(font(TICK))
            .bold_line_style(grid_bold)
            .light_line_style(grid_light)
            .draw()?;
        let tail_pts = |v: &[f64]| -> Vec<Vec<(f64, f64)>> {
            let n = v.len();
            let pts: Vec<(f64, f64)> = keep(n)
                .into_iter()
                .filter(|&i| v[i] > 0.0)
                .map(|i| (v[i], (n - i) as f64 / n as f64))
                .collect();
            clip_loglog(&pts, (x_lo, hi), (y_lo, y_hi))
        };
        for (i, (_, v)) in self.curves.iter().enumerate() {
            let (c, d) = style(i);
            for piece in tail_pts(v) {
                line(&mut tail, piece, c, d, 2)?;
            }
        }
        for piece in tail_pts(&self.floor) {
            line(&mut tail, piece, FLOOR, true, 2)?;
        }

        let entries: Vec<(String, RGBColor, bool)> = self
            .curves
            .iter()
            .enumerate()
            .map(|(i, (l, _))| (l.clone(), style(i).0, style(i).1))
            .collect();
        legend(
            &legend_area,
            "policy / signal",
            &entries,
            "TTFT floor",
            false,
        )
    }
}

/// The parts of a polyline inside `[x.0, x.1] × [y.0, y.1]`, cut at the edges, both axes
/// logarithmic (plotters draws whatever it is given, also outside the plotting area).
fn clip_loglog(pts: &[(f64, f64)], x: (f64, f64), y: (f64, f64)) -> Vec<Vec<(f64, f64)>> {
    let lg = |p: &(f64, f64)| (p.0.log10(), p.1.log10());
    let (lo, hi) = ((x.0.log10(), y.0.log10()), (x.1.log10(), y.1.log10()));
    let exp = |p: (f64, f64)| (10f64.powf(p.0), 10f64.powf(p.1));
    let mut pieces: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut open = false;
    for w in pts.windows(2) {
        let (a, b) = (lg(&w[0]), lg(&w[1]));
        match clip_segment(a, b, lo, hi) {
            Some((p, q)) => {
                if !(open && p == a) {
                    pieces.push(vec![exp(p)]);
                }
                if let Some(last) = pieces.last_mut() {
                    last.push(if q == b { w[1] } else { exp(q) });
                }
                open = q == b;
            }
            None => open = false,
        }
    }
    pieces
}

/// Liang–Barsky: the part of segment `a`–`b` inside the box `lo`–`hi`.
#[allow(clippy::type_complexity)]
fn clip_segment(
    a: (f64, f64),
    b: (f64, f64),
    lo: (f64, f64),
    hi: (f64, f64),
) -> Option<((f64, f64), (f64, f64))> {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let (mut t0, mut t1) = (0.0f64, 1.0f64);
    for (p, q) in [
        (-dx, a.0 - lo.0),
        (dx, hi.0 - a.0),
        (-dy, a.1 - lo.1),
        (dy, hi.1 - a.1),
    ] {
        if p == 0.0 {
            if q < 0.0 {
                return None;
            }
        } else {
            let r = q / p;
            if p < 0.0 {
                t0 = t0.max(r);
            } else {
                t1 = t1.min(r);
            }
        }
    }
    if t0 > t1 {
        return None;
    }
    let at = |t: f64| (a.0 + t * dx, a.1 + t * dy);
    Some((
        if t0 == 0.0 { a } else { at(t0) },
        if t1 == 1.0 { b } else { at(t1) },
    ))
}

/// A tail tick: the share slower and the percentile it marks, `1% (p99)`.
fn tail_label(v: f64) -> String {
    if v >= 0.999 {
        return "all".into();
    }
    let pct = v * 100.0;
    let p = 100.0 - pct;
    format!("{}% (p{})", trim(pct), trim(p))
}

fn trim(v: f64) -> String {
    let s = format!("{v:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

struct SweepFigure<'a> {
    title: &'a str,
    lines: Vec<(String, Vec<(f64, f64)>)>,
    floor: Vec<(f64, f64)>,
}

impl Figure for SweepFigure<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        root.fill(&WHITE)?;
        let body = root.titled(self.title, font(TITLE))?;
        let (plot, legend_area) = body.split_horizontally(SIZE.0 - LEGEND_W);
        let all = || {
            self.lines
                .iter()
                .flat_map(|l| l.1.iter())
                .chain(&self.floor)
        };
        let mut loads: Vec<f64> = all().map(|p| p.0).collect();
        loads.sort_by(f64::total_cmp);
        loads.dedup();
        let (l0, l1) = match (loads.first(), loads.last()) {
            (Some(a), Some(b)) => (*a, *b),
            _ => (0.0, 1.0),
        };
        let pad = ((l1 - l0) * 0.04).max(0.02);
        let ymin = all().map(|p| p.1).fold(f64::MAX, f64::min).min(1e6);
        let ymax = all().map(|p| p.1).fold(1e-6, f64::max);
        let y_lo = round_nice(ymin * 0.85, false);
        let y_hi = round_nice((ymax * 1.05).max(y_lo * 10.0), true);
        let plot_h = SIZE.1 as f64 - 140.0;
        let (yb, yl) = log_ticks(y_lo, y_hi, plot_h);
        let mut chart = ChartBuilder::on(&plot)
            .margin(16)
            .x_label_area_size(56)
            .y_label_area_size(72)
            .build_cartesian_2d(
                Linear::new((l0 - pad)..(l1 + pad), loads.clone(), vec![]),
                (y_lo..y_hi)
                    .log_scale()
                    .with_key_points(yb)
                    .with_light_points(yl),
            )?;
        chart
            .configure_mesh()
            .x_desc("offered load (fraction of nominal fleet capacity)")
            .y_desc("p99 time to first token (s, log scale)")
            .x_label_formatter(&|v| trim(*v))
            .y_label_formatter(&|v| num(*v))
            .label_style(font(TICK))
            .axis_desc_style(font(TICK))
            .bold_line_style(RGBColor(0xC8, 0xC8, 0xC8))
            .light_line_style(RGBColor(0xEC, 0xEC, 0xEC))
            .draw()?;
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
        let entries: Vec<(String, RGBColor, bool)> = self
            .lines
            .iter()
            .enumerate()
            .map(|(i, (l, _))| (l.clone(), style(i).0, style(i).1))
            .collect();
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
    use super::*;
    use crate::report::{Row, json_text, row_json_with_samples};
    use crate::scenario::VARIANTS;
    use crate::sim::Outcome;

    fn labels() -> Vec<String> {
        VARIANTS
            .iter()
            .map(|v| format!("{} / {}", v.0.as_str(), v.1.as_str()))
            .collect()
    }

    /// Log-normal-ish samples from a fixed LCG: `n` TTFTs around `median` seconds.
    fn samples(seed: u64, n: usize, median: f64) -> Vec<f64> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut uniform = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                // Sum of 4 uniforms ~ normal; exp of it ~ log-normal.
                let z = (0..4).map(|_| uniform()).sum::<f64>() - 2.0;
                median * (1.4 * z).exp()
            })
            .collect()
    }

    fn rows(load: f64) -> Vec<Row> {
        let floor = samples(99, 2000, 0.05);
        labels()
            .into_iter()
            .enumerate()
            .map(|(i, label)| Row {
                label,
                load,
                outcome: Outcome {
                    ttft: samples(i as u64, 2000, 0.08 + 0.01 * i as f64 + (load - 0.5)),
                    ttft_floor: floor.clone(),
                    ..Outcome::default()
                },
            })
            .collect()
    }

    /// Tags balance: every `<x ...>` is closed by `</x>` or is `<x .../>`, in order.
    fn assert_xmlish(svg: &str) {
        assert!(svg.trim_start().starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.trim_end().ends_with("</svg>"));
        let mut stack: Vec<String> = Vec::new();
        let mut rest = svg;
        while let Some(open) = rest.find('<') {
            let close = rest[open..].find('>').expect("unclosed tag") + open;
            let tag = &rest[open + 1..close];
            assert!(!tag.contains('<'), "tag inside tag: {tag}");
            let name = |t: &str| {
                t.split(|c: char| c.is_whitespace() || c == '/')
                    .find(|s| !s.is_empty())
                    .unwrap_or("")
                    .to_string()
            };
            if let Some(t) = tag.strip_prefix('/') {
                assert_eq!(stack.pop().as_deref(), Some(name(t).as_str()), "</{t}>");
            } else if !tag.ends_with('/') && !tag.starts_with('?') && !tag.starts_with('!') {
                stack.push(name(tag));
            }
            rest = &rest[close + 1..];
        }
        assert!(stack.is_empty(), "unclosed: {stack:?}");
    }

    /// The x of every `<text>` whose content is exactly `s`.
    fn text_xs(svg: &str, s: &str) -> Vec<f64> {
        svg.split("<text")
            .skip(1)
            .filter(|t| {
                t.split('>')
                    .nth(1)
                    .and_then(|c| c.split('<').next())
                    .map(str::trim)
                    == Some(s)
            })
            .map(|t| {
                let x = t.split("x=\"").nth(1).and_then(|v| v.split('"').next());
                x.and_then(|v| v.parse().ok()).expect("text without x")
            })
            .collect()
    }

    fn png_rgb(path: &Path) -> (u32, u32, Vec<u8>) {
        let bytes = std::fs::read(path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG magic");
        assert_eq!(&bytes[12..16], b"IHDR");
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let (w, h) = (be(&bytes[16..20]), be(&bytes[20..24]));
        let mut reader = png::Decoder::new(io::Cursor::new(bytes))
            .read_info()
            .unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (w, h));
        assert_eq!(info.color_type, png::ColorType::Rgb);
        buf.truncate(info.buffer_size());
        (w, h, buf)
    }

    /// Pixels of exactly this colour in the region x >= x0.
    fn count(rgb: &[u8], w: u32, c: RGBColor, x_range: Range<u32>) -> usize {
        rgb.chunks(3)
            .enumerate()
            .filter(|(i, p)| x_range.contains(&((*i as u32) % w)) && p == &[c.0, c.1, c.2])
            .count()
    }

    /// Checks both files of a figure: sizes, XML shape, one legend entry per variant right of the
    /// plots, the floor's label, PNG header and that each variant's colour is drawn in the plots
    /// and in the legend.
    fn check_figure(files: &[PathBuf; 2], floor_label: &str) {
        let [svg_path, png_path] = files;
        assert_eq!(svg_path.extension().unwrap(), "svg");
        assert_eq!(png_path.extension().unwrap(), "png");
        let svg = std::fs::read_to_string(svg_path).unwrap();
        assert!(svg.len() > 20_000, "svg only {} bytes", svg.len());
        assert_xmlish(&svg);
        let legend_x0 = (SIZE.0 - LEGEND_W) as f64;
        for l in labels() {
            assert_eq!(svg.matches(l.as_str()).count(), 1, "{l} in the svg");
            let xs = text_xs(&svg, &l);
            assert_eq!(xs.len(), 1, "{l}");
            assert!(xs[0] > legend_x0, "{l} at x {} is over the plots", xs[0]);
        }
        assert_eq!(text_xs(&svg, floor_label).len(), 1, "{floor_label}");
        assert!(text_xs(&svg, floor_label)[0] > legend_x0);

        assert!(std::fs::metadata(png_path).unwrap().len() > 20_000);
        let (w, h, rgb) = png_rgb(png_path);
        assert_eq!((w, h), SIZE);
        let plots = 0..SIZE.0 - LEGEND_W;
        let legend = SIZE.0 - LEGEND_W..SIZE.0;
        for i in 0..labels().len() {
            let c = style(i).0;
            assert!(
                count(&rgb, w, c, plots.clone()) > 200,
                "variant {i} not drawn"
            );
            assert!(
                count(&rgb, w, c, legend.clone()) > 20,
                "variant {i} not in the legend"
            );
        }
        // Text was rendered: dark pixels in the legend beyond the line samples.
        let dark = rgb
            .chunks(3)
            .enumerate()
            .filter(|(i, p)| (*i as u32) % w >= SIZE.0 - LEGEND_W + 60 && p.iter().all(|v| *v < 90))
            .count();
        assert!(dark > 500, "legend text missing ({dark} dark pixels)");
    }

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

    #[test]
    fn bench_plot_redraws_from_samples_and_sweeps_only() {
        let dir = tempfile::tempdir().unwrap();
        let r85 = rows(0.85);
        let live = serde_json::json!({ "scenario": "s9", "mode": "live", "publish_point": "batch-end", "rows": r85.iter().map(row_json_with_samples).collect::<Vec<_>>() });
        let json = dir.path().join("s9-live-batch-end.json");
        std::fs::write(&json, json_text(&live)).unwrap();
        let (wrote, skipped) = from_json(&json).unwrap();
        let name = |f: &str| dir.path().join(f);
        assert_eq!(
            wrote,
            vec![
                name("s9-live-batch-end-ttft-cdf.svg"),
                name("s9-live-batch-end-ttft-cdf.png")
            ]
        );
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        let svg = std::fs::read_to_string(&wrote[0]).unwrap();
        assert!(svg.contains(
            "S9 live: time to first token per request (load 0.85, publish point batch-end)"
        ));
        check_figure(&[wrote[0].clone(), wrote[1].clone()], "TTFT floor");

        // A simulated result: quantiles only, and a sweep.
        let sweep: Vec<Row> = [0.5, 0.9].into_iter().flat_map(rows).collect();
        let sim = serde_json::json!({ "scenario": "s9", "publish_point": "ingest", "rows": r85.iter().map(crate::report::row_json).collect::<Vec<_>>(), "sweep": sweep.iter().map(crate::report::row_json).collect::<Vec<_>>() });
        let json = name("s9.json");
        std::fs::write(&json, serde_json::to_string_pretty(&sim).unwrap()).unwrap();
        let (wrote, skipped) = from_json(&json).unwrap();
        assert_eq!(
            wrote,
            vec![name("s9-p99-vs-load.svg"), name("s9-p99-vs-load.png")]
        );
        assert!(skipped[0].contains("no ttft_samples_s"), "{skipped:?}");
        assert!(!name("s9-ttft-cdf.svg").exists());
    }

    /// The bitmap's own text: ink where the anchor says, as wide as plotters' estimate.
    #[test]
    fn bitmap_text_lands_on_its_anchor() {
        register_font();
        let (w, h) = (400u32, 100u32);
        let ink = |h_pos: HPos, v_pos: VPos| {
            let mut rgb = vec![255u8; (w * h * 3) as usize];
            let estimate = {
                let root = Bitmap(BitMapBackend::with_buffer(&mut rgb, (w, h))).into_drawing_area();
                let style = font(20).pos(Pos::new(h_pos, v_pos));
                let size = root.estimate_text_size("TTFT floor", &style).unwrap();
                root.draw(&Text::new("TTFT floor", (200, 50), style))
                    .unwrap();
                root.present().unwrap();
                size
            };
            let dark: Vec<(u32, u32)> = rgb
                .chunks(3)
                .enumerate()
                .filter(|(_, p)| p[0] < 128)
                .map(|(i, _)| (i as u32 % w, i as u32 / w))
                .collect();
            let xs = (
                dark.iter().map(|p| p.0).min().unwrap(),
                dark.iter().map(|p| p.0).max().unwrap(),
            );
            let ys = (
                dark.iter().map(|p| p.1).min().unwrap(),
                dark.iter().map(|p| p.1).max().unwrap(),
            );
            (xs, ys, estimate)
        };
        let ((x0, x1), (y0, y1), (ew, eh)) = ink(HPos::Left, VPos::Top);
        assert!((200..=203).contains(&x0), "left edge {x0}");
        assert!(
            (x1 - x0).abs_diff(ew) <= 3,
            "ink {} wide, estimate {ew}",
            x1 - x0
        );
        assert!(
            y0 >= 50 && y1 <= 50 + eh + 4,
            "ink rows {y0}..{y1}, box {eh}"
        );
        let ((_, x1), _, _) = ink(HPos::Right, VPos::Top);
        assert!((197..=200).contains(&x1), "right edge {x1}");
        let ((x0, x1), (y0, y1), _) = ink(HPos::Center, VPos::Center);
        assert!((x0 + x1).abs_diff(400) <= 4, "centre {}", (x0 + x1) / 2);
        // Capitals centred on the anchor within 2 px (no descenders in "TTFT floor").
        assert!((y0 + y1).abs_diff(100) <= 4, "rows {y0}..{y1}");
    }

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

    #[test]
    fn clipping_cuts_at_the_box() {
        // A straight line in log-log space from (0.01, 1) to (10, 1e-4): it enters the box through
        // its left side x = 0.1, a third of the way, at y = 10^(-4/3).
        let pieces = clip_loglog(&[(0.01, 1.0), (10.0, 1e-4)], (0.1, 100.0), (1e-5, 0.5));
        assert_eq!(pieces.len(), 1);
        let p = &pieces[0];
        assert_eq!(p.len(), 2);
        assert!((p[0].0 - 0.1).abs() < 1e-12, "{p:?}");
        assert!((p[0].1 - 10f64.powf(-4.0 / 3.0)).abs() < 1e-12, "{p:?}");
        assert_eq!(p[1], (10.0, 1e-4));
        // From (0.2, 1) to (2, 0.01), then on inside: enters through the top y = 0.5.
        let pieces = clip_loglog(
            &[(0.2, 1.0), (2.0, 0.01), (3.0, 0.001)],
            (0.1, 100.0),
            (1e-5, 0.5),
        );
        assert_eq!(pieces.len(), 1);
        let p = &pieces[0];
        assert_eq!(p.len(), 3, "{p:?}");
        assert!((p[0].1 - 0.5).abs() < 1e-12);
        let t = 0.5f64.log10() / -2.0;
        assert!((p[0].0 - 0.2 * 10f64.powf(t)).abs() < 1e-12, "{p:?}");
        assert_eq!(&p[1..], &[(2.0, 0.01), (3.0, 0.001)]);
        // Leaves and comes back: two pieces.
        let pieces = clip_loglog(
            &[(1.0, 0.1), (1.0, 1.0), (2.0, 0.1)],
            (0.1, 100.0),
            (1e-5, 0.5),
        );
        assert_eq!(pieces.len(), 2, "{pieces:?}");
        // Wholly outside.
        assert!(clip_loglog(&[(0.01, 1.0), (0.05, 0.9)], (0.1, 1.0), (1e-3, 0.5)).is_empty());
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
