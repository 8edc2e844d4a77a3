//! How a fleet comes back from a burst: TTFT p50 in fixed windows of arrival time, the p50 before
//! the burst, and how long after the burst every later window is back within a margin of it.

use crate::sim::{Outcome, quantile};
use crate::workload::burst::Burst;

/// Window of the recovery figures, seconds of arrival time.
pub const WINDOW_S: f64 = 10.0;
/// The pre-burst reference: p50 over this many seconds before the burst.
pub const BEFORE_S: f64 = 60.0;
/// Back to normal: within this factor of the pre-burst p50.
pub const MARGIN: f64 = 1.2;

/// TTFT p50 of the requests arriving in each `window_s` window from 0 (NaN for an empty window).
pub fn windowed_p50(o: &Outcome, window_s: f64) -> Vec<f64> {
    let last = o.arrived.iter().cloned().fold(0.0, f64::max);
    let n = (last / window_s).floor() as usize + 1;
    let mut by: Vec<Vec<f64>> = vec![Vec::new(); n];
    for (&t, &ttft) in o.arrived.iter().zip(&o.ttft) {
        by[((t / window_s).floor() as usize).min(n - 1)].push(ttft);
    }
    by.iter().map(|w| quantile(w, 0.5)).collect()
}

/// One variant's burst figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovery {
    pub label: String,
    /// p50 TTFT over the [`BEFORE_S`] before the burst.
    pub before_p50: f64,
    /// The worst window's p50 from the burst on.
    pub peak_p50: f64,
    /// Seconds after the burst's end until every later full window's p50 is within [`MARGIN`] of
    /// `before_p50`; `None`: never within the run.
    pub recovery_s: Option<f64>,
    pub hit: f64,
    /// Per window, its p50 (for the figure).
    pub windows: Vec<f64>,
}

impl Recovery {
    pub fn json(&self) -> serde_json::Value {
        let windows: Vec<Option<f64>> = self
            .windows
            .iter()
            .map(|w| w.is_finite().then_some(*w))
            .collect();
        serde_json::json!({ "label": self.label, "before_p50_s": self.before_p50, "peak_p50_s": self.peak_p50, "recovery_s": self.recovery_s, "hit": self.hit, "window_s": WINDOW_S, "window_p50_s": windows })
    }
}

/// The burst figures of `o` (a run of [`crate::scenario::saturation::burst_arrivals`]).
pub fn recovery(label: &str, o: &Outcome, b: &Burst, duration_s: f64) -> Recovery {
    let before: Vec<f64> = o
        .arrived
        .iter()
        .zip(&o.ttft)
        .filter(|(t, _)| (b.start_s - BEFORE_S..b.start_s).contains(*t))
        .map(|(_, &x)| x)
        .collect();
    let before_p50 = quantile(&before, 0.5);
    let windows = windowed_p50(o, WINDOW_S);
    let end = b.start_s + b.len_s;
    let full = (duration_s / WINDOW_S).floor() as usize; // windows wholly inside the run
    let first = (b.start_s / WINDOW_S).floor() as usize;
    let peak_p50 = windows
        .iter()
        .take(full)
        .skip(first)
        .cloned()
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max);
    let ok = |w: &f64| !w.is_finite() || *w <= MARGIN * before_p50;
    // The first window starting at or after the burst's end from which every later one is ok.
    let from = (end / WINDOW_S).ceil() as usize;
    let recovery_s = (from..full)
        .find(|&k| windows[k..full].iter().all(ok))
        .map(|k| ((k as f64 + 1.0) * WINDOW_S - end).max(0.0));
    Recovery {
        label: label.to_string(),
        before_p50,
        peak_p50,
        recovery_s,
        hit: o.cache_hit_rate().unwrap_or(0.0),
        windows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(points: &[(f64, f64)]) -> Outcome {
        Outcome {
            arrived: points.iter().map(|p| p.0).collect(),
            ttft: points.iter().map(|p| p.1).collect(),
            ..Outcome::default()
        }
    }

    #[test]
    fn recovery_counts_from_the_burst_end_to_the_window_after_which_all_are_back() {
        let b = Burst {
            start_s: 100.0,
            len_s: 30.0,
            base: 0.8,
            peak: 1.2,
        };
        // 0.1 s before, 2 s in the burst and until 170 s, 0.11 s after (within 1.2×).
        let pts: Vec<(f64, f64)> = (0..2000)
            .map(|k| {
                let t = k as f64 * 0.1;
                let ttft = if t < 100.0 {
                    0.1
                } else if t < 170.0 {
                    2.0
                } else {
                    0.11
                };
                (t, ttft)
            })
            .collect();
        let r = recovery("x", &outcome(&pts), &b, 200.0);
        assert_eq!(r.before_p50, 0.1);
        assert_eq!(r.peak_p50, 2.0);
        // Windows from 170 s are back; the first ends at 180 s, 50 s after the burst's end.
        assert_eq!(r.recovery_s, Some(50.0));
        // Never back within the run.
        let bad: Vec<(f64, f64)> = pts
            .iter()
            .map(|&(t, x)| (t, if t >= 100.0 { 2.0 } else { x }))
            .collect();
        assert_eq!(recovery("y", &outcome(&bad), &b, 200.0).recovery_s, None);
    }
}
