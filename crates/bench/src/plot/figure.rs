//! Figure layout and output, shared by both figures: a figure draws itself onto any plotters
//! backend, and [`write_figure`] draws it twice, into `STEM.svg` and (through [`Bitmap`]) into
//! `STEM.png`, so both files show the same thing. The layout is a title on top, the plots, and
//! the legend in its own column of [`LEGEND_W`] pixels on the right.

use super::SIZE;
use super::bitmap::{Bitmap, register_font};
use super::style::{CAPTION, TITLE, font};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::io;
use std::path::{Path, PathBuf};

/// Width of the legend column right of the plots.
pub(super) const LEGEND_W: u32 = 330;

pub(super) type DrawResult<DB> =
    Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;
type AreaError<DB> = DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>;
type Area<DB> = DrawingArea<DB, Shift>;

/// A figure that can draw itself on any backend (SVG and bitmap).
pub(super) trait Figure {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB>;
}

/// `stem` with `ext` appended: `s1-ttft-cdf` and `.svg` make `s1-ttft-cdf.svg`.
pub(super) fn with_suffix(stem: &Path, ext: &str) -> PathBuf {
    let mut s = stem.as_os_str().to_owned();
    s.push(ext);
    PathBuf::from(s)
}

/// Clears `root` to white, writes `title` on top and returns (the plots' area, the legend's).
pub(super) fn layout<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
) -> Result<(Area<DB>, Area<DB>), AreaError<DB>> {
    root.fill(&WHITE)?;
    let body = root.titled(title, font(TITLE))?;
    Ok(body.split_horizontally(SIZE.0 - LEGEND_W))
}

/// Draws `title` centred over the plotting part of `panel` (right of its `y_labels` pixels of
/// y-axis labels, as built with a margin of 12) and returns the area below it.
pub(super) fn panel_title<DB: DrawingBackend>(
    panel: &DrawingArea<DB, Shift>,
    title: &str,
    y_labels: u32,
) -> Result<Area<DB>, AreaError<DB>> {
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

/// Draws `fig` into `STEM.svg` and `STEM.png`.
pub(super) fn write_figure(stem: &Path, fig: &impl Figure) -> io::Result<[PathBuf; 2]> {
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
    write_png(&png, &rgb)?;
    Ok([svg, png])
}

/// Writes `rgb` (8-bit RGB rows of a [`SIZE`] image) as a compressed PNG.
fn write_png(path: &Path, rgb: &[u8]) -> io::Result<()> {
    let (w, h) = SIZE;
    let file = io::BufWriter::new(std::fs::File::create(path)?);
    let mut enc = png::Encoder::new(file, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::High);
    let mut writer = enc.write_header().map_err(io::Error::other)?;
    writer.write_image_data(rgb).map_err(io::Error::other)?;
    writer.finish().map_err(io::Error::other)
}
