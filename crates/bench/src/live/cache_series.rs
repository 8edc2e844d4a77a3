//! The fleet's cache counters through a live run, so a run's hit rate can leave out a warm-up
//! (`bench live --warmup`, [`crate::sim::Outcome::hit_rate_since`]): every run starts with empty
//! caches, and a prefix workload's first tens of seconds recompute every shared prefix whatever
//! the router does. The engines' lifetime counters are read every [`EVERY_S`] virtual seconds
//! and stored as the run's `(virtual s, cached, prompt)` since its start, as the simulator stores
//! its own.

use super::scrape::fleet_cache_counters;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Virtual seconds between two reads of the counters (a warm-up is read to within this).
pub const EVERY_S: f64 = 5.0;

/// Reads the engines' cache counters every [`EVERY_S`] virtual seconds until finished.
pub(super) struct CacheSeries {
    done: Arc<AtomicBool>,
    series: Arc<Mutex<Vec<(f64, u64, u64)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CacheSeries {
    /// Starts reading at `start`; `before` is the fleet's counters then (the series is relative
    /// to it), `time_scale` turns wall seconds into virtual ones.
    pub(super) fn start(
        c: reqwest::Client,
        engines: Vec<String>,
        (start, before): (Instant, (f64, f64)),
        time_scale: f64,
    ) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let series: Arc<Mutex<Vec<(f64, u64, u64)>>> = Arc::default();
        let (d, out) = (done.clone(), series.clone());
        let tick = Duration::from_secs_f64(EVERY_S / time_scale);
        let task = tokio::spawn(async move {
            let mut next = start + tick;
            while !d.load(Ordering::Relaxed) {
                tokio::time::sleep_until(next.into()).await;
                next += tick;
                if d.load(Ordering::Relaxed) {
                    break;
                }
                let t = start.elapsed().as_secs_f64() * time_scale;
                if let Some((cached, prompt)) = fleet_cache_counters(&c, &engines).await {
                    let delta = |x: f64, y: f64| (x - y).max(0.0) as u64;
                    let point = (t, delta(cached, before.0), delta(prompt, before.1));
                    out.lock().unwrap_or_else(|p| p.into_inner()).push(point);
                }
            }
        });
        CacheSeries { done, series, task }
    }

    /// Stops reading; the series so far.
    pub(super) async fn finish(self) -> Vec<(f64, u64, u64)> {
        self.done.store(true, Ordering::Relaxed);
        self.task.abort();
        let _ = self.task.await;
        std::mem::take(&mut *self.series.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// One variant's figures over the requests arriving after a warm-up, the whole run's beside them.
#[derive(Debug, Clone, PartialEq)]
pub struct AfterWarmup {
    pub label: String,
    pub warmup_s: f64,
    pub p50: f64,
    pub p99: f64,
    pub wait_p99: f64,
    /// Over the prompt tokens computed from the first counter read at or after the warm-up.
    pub hit: Option<f64>,
    pub requests: usize,
    pub p99_whole_run: f64,
    pub hit_whole_run: Option<f64>,
}

impl AfterWarmup {
    pub fn of(label: &str, o: &crate::sim::Outcome, warmup_s: f64) -> Self {
        use crate::sim::quantile;
        let (ttft, waits) = o.since(warmup_s);
        AfterWarmup {
            label: label.to_string(),
            warmup_s,
            p50: quantile(&ttft, 0.5),
            p99: quantile(&ttft, 0.99),
            wait_p99: quantile(&waits, 0.99),
            hit: o.hit_rate_since(warmup_s),
            requests: ttft.len(),
            p99_whole_run: quantile(&o.ttft, 0.99),
            hit_whole_run: o.cache_hit_rate(),
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({ "label": self.label, "warmup_s": self.warmup_s, "ttft_p50_s": self.p50, "ttft_p99_s": self.p99, "wait_p99_s": self.wait_p99, "hit": self.hit, "requests": self.requests, "ttft_p99_whole_run_s": self.p99_whole_run, "hit_whole_run": self.hit_whole_run })
    }
}

/// The after-warm-up table: per variant its p50, p99, wait p99 and hit rate, and the whole run's
/// p99 and hit rate.
pub fn warmup_table(rows: &[AfterWarmup]) -> String {
    let pct = |h: Option<f64>| h.map_or_else(|| "-".to_string(), |h| format!("{:.1}%", 100.0 * h));
    let mut s = format!(
        "after the first {} virtual s:\n{:<40} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>7}\n",
        rows.first().map_or(0.0, |r| r.warmup_s),
        "variant",
        "requests",
        "TTFT p50",
        "TTFT p99",
        "hit",
        "wait p99",
        "whole p99",
        "whole hit"
    );
    for r in rows {
        s.push_str(&format!(
            "{:<40} {:>9} {:>8.3}s {:>8.3}s {:>7} {:>8.3}s {:>8.3}s {:>7}\n",
            r.label,
            r.requests,
            r.p50,
            r.p99,
            pct(r.hit),
            r.wait_p99,
            r.p99_whole_run,
            pct(r.hit_whole_run)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::Outcome;

    #[test]
    fn the_warmup_leaves_out_early_arrivals_and_the_tokens_computed_before_it() {
        // 100 requests, one per second: slow and uncached for the first 30 s, then fast.
        let o = Outcome {
            arrived: (0..100).map(f64::from).collect(),
            ttft: (0..100).map(|k| if k < 30 { 5.0 } else { 0.1 }).collect(),
            ttft_floor: vec![0.05; 100],
            cache_tokens: Some((7_000, 10_000)),
            // By 30 s: 3,000 prompt tokens computed, none cached; then 7,000 of 7,000 cached.
            cache_series: vec![(25.0, 0, 2_500), (30.0, 0, 3_000), (35.0, 500, 3_500)],
            ..Outcome::default()
        };
        let w = AfterWarmup::of("a", &o, 30.0);
        assert_eq!(w.requests, 70);
        assert_eq!((w.p50, w.p99), (0.1, 0.1));
        assert!((w.wait_p99 - 0.05).abs() < 1e-12);
        assert_eq!(w.hit, Some(1.0));
        assert_eq!(w.p99_whole_run, 5.0);
        assert_eq!(w.hit_whole_run, Some(0.7));
        let t = warmup_table(&[w]);
        assert!(
            t.contains("after the first 30 virtual s") && t.contains("100.0%"),
            "{t}"
        );
    }
}
