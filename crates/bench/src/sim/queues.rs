//! The 1 s samples of the engines' waiting queues: how unevenly they filled (coefficient of
//! variation, and runs of one engine's queue above twice the fleet's mean); and of the utilisation
//! ρ the first router replica's book measured per engine, to check it against the offered load.

use super::outcome::{HOT_QUEUE_MIN, Outcome, QueueStats};
use super::{Ev, Sim};

impl Sim<'_> {
    /// The 1 s sample at `t`: the engines' queues, and the routers' adapter reports when due.
    pub(super) fn sample(&mut self, t: f64) {
        let w: Vec<f64> = self
            .engines
            .iter()
            .map(|e| e.num_waiting() as f64)
            .collect();
        self.queues.sample(&w);
        // While requests arrive: the drain after the last one is not the offered load.
        if self.arrivals.last().is_some_and(|a| t <= a.t) {
            for rho in self.books[0].iter().filter_map(|w| w.utilisation()) {
                self.queues.rho_sum += rho;
                self.queues.rho_samples += 1;
            }
        }
        let totals = self.engines[self.prefilling_units()]
            .iter()
            .map(super::engine::SimEngine::cache_totals)
            .fold((0, 0), |(c, p), (ec, ep)| (c + ec, p + ep));
        self.out.cache_series.push((t, totals.0, totals.1));
        if let Some(c) = self.caches.first() {
            self.out.regret_series.push((t, c.mean_regret()));
        }
        self.report_adapters(t);
        if self.remaining > 0 {
            self.push(t + 1.0, Ev::Sample);
        }
    }
}

/// The 1 s samples of the engines' waiting queues.
#[derive(Default)]
pub(super) struct QueueSamples {
    cv: Vec<f64>,
    hot: usize,
    /// (engine, consecutive hot samples) of the current run.
    run: Option<(usize, usize)>,
    longest: usize,
    /// Σ and count of the engines' measured ρ over the samples (engines not measured yet skipped).
    rho_sum: f64,
    rho_samples: usize,
}

impl QueueSamples {
    pub(super) fn sample(&mut self, waiting: &[f64]) {
        let m = waiting.iter().sum::<f64>() / waiting.len().max(1) as f64;
        let sd = (waiting.iter().map(|x| (x - m).powi(2)).sum::<f64>()
            / waiting.len().max(1) as f64)
            .sqrt();
        self.cv.push(if m > 0.0 { sd / m } else { 0.0 });
        let hot = (0..waiting.len()).find(|&e| waiting[e] >= HOT_QUEUE_MIN && waiting[e] > 2.0 * m);
        self.run = match (hot, self.run) {
            (Some(e), Some((r, n))) if e == r => Some((e, n + 1)),
            (Some(e), _) => Some((e, 1)),
            (None, _) => None,
        };
        if hot.is_some() {
            self.hot += 1;
        }
        self.longest = self.longest.max(self.run.map_or(0, |r| r.1));
    }

    pub(super) fn finish(&self, out: &mut Outcome) -> QueueStats {
        let n = self.cv.len().max(1) as f64;
        out.queue_cv = self.cv.iter().sum::<f64>() / n;
        QueueStats {
            hot_fraction: self.hot as f64 / n,
            hot_longest_s: self.longest as f64,
            mean_utilisation: (self.rho_samples > 0)
                .then(|| self.rho_sum / self.rho_samples as f64),
        }
    }
}
