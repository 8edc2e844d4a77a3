//! The PNG's drawing backend: plotters' `BitMapBackend` with its own text drawing, because
//! plotters 0.3.7's ab_glyph text drops each glyph's side bearing and rounds the pen to whole
//! pixels, which spaces letters unevenly ("TTF T fl oor"). Here glyphs sit at their exact advance
//! (kerned, sub-pixel) and are blended by coverage; everything else is plotters' own drawing.
//!
//! The font is DejaVu Sans embedded in the binary (`assets/`, license beside it), registered as
//! plotters' "sans-serif" so that text is measured the same way in the SVG and the PNG.

use super::style::FAMILY;
use ab_glyph::{Font, FontRef, GlyphId, PxScaleFont, ScaleFont};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind,
};

const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

fn font_ref() -> &'static FontRef<'static> {
    static F: std::sync::OnceLock<FontRef<'static>> = std::sync::OnceLock::new();
    F.get_or_init(|| FontRef::try_from_slice(FONT).expect("the embedded DejaVu Sans parses"))
}

/// Registers the embedded font as plotters' "sans-serif" (its `ab_glyph` text has no other).
pub(super) fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_err() {
            panic!("the embedded DejaVu Sans does not parse");
        }
    });
}

/// `BitMapBackend` drawing text glyph by glyph at exact advances. Widths match plotters' own
/// estimate (the same advances), so layout is unchanged.
pub(super) struct Bitmap<'a>(pub(super) BitMapBackend<'a>);

type BitmapError = <BitMapBackend<'static> as DrawingBackend>::ErrorType;
type BitmapResult = Result<(), DrawingErrorKind<BitmapError>>;

/// Methods that only hand their arguments on to the wrapped `BitMapBackend`.
macro_rules! delegate {
    ($(fn $name:ident[$($generics:tt)*]($($arg:ident: $ty:ty),*);)*) => {
        $(fn $name<$($generics)*>(&mut self, $($arg: $ty),*) -> BitmapResult {
            self.0.$name($($arg),*)
        })*
    };
}

impl DrawingBackend for Bitmap<'_> {
    type ErrorType = BitmapError;

    fn get_size(&self) -> (u32, u32) {
        self.0.get_size()
    }

    delegate! {
        fn ensure_prepared[]();
        fn present[]();
        fn draw_pixel[](p: BackendCoord, c: BackendColor);
        fn draw_line[S: BackendStyle](a: BackendCoord, b: BackendCoord, s: &S);
        fn draw_rect[S: BackendStyle](a: BackendCoord, b: BackendCoord, s: &S, fill: bool);
        fn draw_path[S: BackendStyle, I: IntoIterator<Item = BackendCoord>](path: I, s: &S);
        fn draw_circle[S: BackendStyle](c: BackendCoord, r: u32, s: &S, fill: bool);
        fn fill_polygon[S: BackendStyle, I: IntoIterator<Item = BackendCoord>](vert: I, s: &S);
        fn blit_bitmap[](pos: BackendCoord, size: (u32, u32), src: &[u8]);
    }

    fn draw_text<T: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &T,
        pos: BackendCoord,
    ) -> BitmapResult {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let transform = style.transform();
        for (x, y, c) in coverage(text, style) {
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

/// Each glyph of `text` with the pen position it sits at (kerned), the pen starting at `start`,
/// then the pen position after the last glyph (from a start of 0: the text's width).
fn pen_positions(
    scaled: &PxScaleFont<&FontRef<'static>>,
    text: &str,
    start: f32,
) -> (Vec<(GlyphId, f32)>, f32) {
    let mut glyphs = Vec::new();
    let (mut pen, mut prev) = (start, None);
    for ch in text.chars() {
        let id = scaled.glyph_id(ch);
        if let Some(p) = prev {
            pen += scaled.kern(p, id);
        }
        glyphs.push((id, pen));
        pen += scaled.h_advance(id);
        prev = Some(id);
    }
    (glyphs, pen)
}

/// The pixels `text` covers, relative to its anchor, and how much of each (0 to 1).
fn coverage<T: BackendTextStyle>(text: &str, style: &T) -> Vec<(i32, i32, f32)> {
    let font = font_ref();
    let scaled = font.as_scaled(style.size() as f32);
    let (_, width) = pen_positions(&scaled, text, 0.0);
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
    let mut cover = Vec::new();
    for (id, pen) in pen_positions(&scaled, text, x0).0 {
        let glyph = id.with_scale_and_position(scaled.scale(), ab_glyph::point(pen, baseline));
        if let Some(outline) = font.outline_glyph(glyph) {
            let b = outline.px_bounds();
            outline.draw(|x, y, c| {
                cover.push((b.min.x as i32 + x as i32, b.min.y as i32 + y as i32, c))
            });
        }
    }
    cover
}

#[cfg(test)]
mod tests {
    use super::super::style::font;
    use super::*;
    use plotters::style::text_anchor::Pos;

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
}
