//! Test support shared by the figures' tests: seeded TTFT rows for every variant, and checks
//! that a written figure is well-formed (balanced SVG tags, PNG header) and shows what it should
//! (each variant's colour in the plots and the legend, legend text right of the plots).

use super::SIZE;
use super::figure::LEGEND_W;
use super::style::style;
use crate::report::Row;
use crate::scenario::VARIANTS;
use crate::sim::Outcome;
use plotters::prelude::*;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};

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

pub(super) fn rows(load: f64) -> Vec<Row> {
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
pub(super) fn text_xs(svg: &str, s: &str) -> Vec<f64> {
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

pub(super) fn png_rgb(path: &Path) -> (u32, u32, Vec<u8>) {
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
pub(super) fn count(rgb: &[u8], w: u32, c: RGBColor, x_range: Range<u32>) -> usize {
    rgb.chunks(3)
        .enumerate()
        .filter(|(i, p)| x_range.contains(&((*i as u32) % w)) && p == &[c.0, c.1, c.2])
        .count()
}

/// Checks both files of a figure: sizes, XML shape, one legend entry per variant right of the
/// plots, the floor's label, PNG header and that each variant's colour is drawn in the plots
/// and in the legend.
pub(super) fn check_figure(files: &[PathBuf; 2], floor_label: &str) {
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
