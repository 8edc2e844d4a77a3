//! Cutting polylines at the edge of a log-log plotting box. plotters draws whatever it is given,
//! also outside the plotting area, and the tail panel starts its axes inside the data (at the
//! fastest median, just below the slowest request), so its curves must be cut first.

/// A point of a polyline: (x, y).
type Point = (f64, f64);

/// The parts of a polyline inside `[x.0, x.1] × [y.0, y.1]`, cut at the edges, both axes
/// logarithmic.
pub(super) fn clip_loglog(pts: &[Point], x: (f64, f64), y: (f64, f64)) -> Vec<Vec<Point>> {
    let lg = |p: &Point| (p.0.log10(), p.1.log10());
    let (lo, hi) = ((x.0.log10(), y.0.log10()), (x.1.log10(), y.1.log10()));
    let exp = |p: Point| (10f64.powf(p.0), 10f64.powf(p.1));
    let mut pieces: Vec<Vec<Point>> = Vec::new();
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
fn clip_segment(a: Point, b: Point, lo: Point, hi: Point) -> Option<(Point, Point)> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
