//! What one run measured, the quantile every report uses, and the TTFT floor a request's own
//! prefill sets ([`isolated_ttft`]).

use loadlink_engine::model::{Event, ModelConfig, Scheduler, StepKind, Submit};

/// How unevenly the engines' waiting queues were filled, from 1 s samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueueStats {
    /// Fraction of samples in which some engine's queue was hot: above twice the fleet's mean and
    /// at least [`HOT_QUEUE_MIN`] requests.
    pub hot_fraction: f64,
    /// The longest run of consecutive hot samples of one engine, seconds.
    pub hot_longest_s: f64,
    /// Mean over the 1 s samples taken while requests arrive, and over engines, of the utilisation
    /// ρ the (first) router's book measured (`loadlink_router::book::utilisation`); `None`: never
    /// measured.
    pub mean_utilisation: Option<f64>,
}

/// A queue counts as hot only from this many waiting requests (a queue of 1 against a mean of 0.25
/// is noise, not a pile-up).
pub const HOT_QUEUE_MIN: f64 = 4.0;

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub ttft: Vec<f64>,
    /// Each request's TTFT on an idle engine of its kind for the tokens it did not find cached
    /// (its own prefill): what is left of its TTFT once the queueing is gone, so TTFT minus this
    /// is its wait. Same order as `ttft`.
    pub ttft_floor: Vec<f64>,
    /// Each completed request's arrival time, virtual seconds. Same order as `ttft`.
    pub arrived: Vec<f64>,
    pub e2e: Vec<f64>,
    pub completed: usize,
    /// Requests sent to an engine (routed requests refused by admission are not).
    pub submitted: usize,
    /// Routed requests refused by admission control (never sent, never completed).
    pub rejected: usize,
    /// Closed-loop turns never sent because an earlier turn of their session was refused (the
    /// agent stopped there); not counted in `rejected`.
    pub abandoned: usize,
    /// Refusals its client answered by sending the request again (`SimConfig::client_retries`);
    /// a request refused for good counts in `rejected` once, whatever it retried before.
    pub retried: usize,
    /// Virtual seconds until the last completion.
    pub makespan: f64,
    /// Mean over 1 s samples of the coefficient of variation of waiting requests across engines.
    pub queue_cv: f64,
    pub decisions: u64,
    pub fallback_decisions: u64,
    /// `(cached, prompt)` tokens summed over the fleet's engines for the run; `None`: unknown
    /// (a live engine that does not export them).
    pub cache_tokens: Option<(u64, u64)>,
    /// The fleet's `(t, cached, prompt)` token totals at each 1 s sample (simulated runs), so a
    /// hit rate can leave out a warm-up ([`Outcome::hit_rate_since`]).
    pub cache_series: Vec<(f64, u64, u64)>,
    /// The first router replica's mean eviction regret over the fleet's schedulers at each 1 s
    /// sample (simulated runs with the KV index; 0 otherwise): the share of the pools' evictions
    /// needed again within a pool turnover, the sign of pools holding less than is live.
    pub regret_series: Vec<(f64, f64)>,
    /// Of the cached tokens, those loaded back from engines' host tiers (0 without one).
    pub loaded_back_tokens: u64,
    /// LoRA adapter loads summed over the fleet's engines (0 without adapters).
    pub adapter_loads: u64,
    /// Completed requests that named an adapter.
    pub adapter_requests: u64,
    /// Per completed request of two or more output tokens, its time per output token after the
    /// first: (done − first token) ÷ (output tokens − 1).
    pub tpot: Vec<f64>,
    /// Per completed request of a PD fleet, its prefill → transfer → decode timeline (empty for
    /// aggregated fleets).
    pub pd: Vec<super::PdTimeline>,
}

impl Outcome {
    /// The fleet's hit rate over the prompt tokens computed from `t0` (the first sample at or
    /// after it) to the end; the whole run's when `t0` is 0 or there are no samples.
    pub fn hit_rate_since(&self, t0: f64) -> Option<f64> {
        let (cached, prompt) = self.cache_tokens?;
        let (c0, p0) = match self.cache_series.iter().find(|s| s.0 >= t0) {
            Some(&(_, c, p)) if t0 > 0.0 => (c, p),
            _ => (0, 0),
        };
        let p = prompt.checked_sub(p0).filter(|&p| p > 0)?;
        Some(cached.saturating_sub(c0) as f64 / p as f64)
    }

    /// TTFTs and waits (TTFT minus floor) of the requests that arrived from `t0` on.
    pub fn since(&self, t0: f64) -> (Vec<f64>, Vec<f64>) {
        let keep = |k: &usize| self.arrived.get(*k).is_none_or(|&a| a >= t0);
        let idx: Vec<usize> = (0..self.ttft.len()).filter(keep).collect();
        let ttft = idx.iter().map(|&k| self.ttft[k]).collect();
        let waits = idx
            .iter()
            .map(|&k| self.ttft[k] - self.ttft_floor.get(k).copied().unwrap_or(0.0))
            .collect();
        (ttft, waits)
    }

    /// Per request, TTFT minus its floor: the waiting that routing can influence.
    pub fn waits(&self) -> Vec<f64> {
        self.ttft
            .iter()
            .zip(&self.ttft_floor)
            .map(|(t, f)| (t - f).max(0.0))
            .collect()
    }

    /// Adapter loads per 1,000 completed requests; `None` when no request named an adapter.
    pub fn adapter_loads_per_1k(&self) -> Option<f64> {
        (self.adapter_requests > 0)
            .then(|| self.adapter_loads as f64 * 1000.0 / self.completed.max(1) as f64)
    }

    /// Per PD request, seconds from its prefill's end to its KV's arrival at the decode engine
    /// (waiting for the link, and the transfer).
    pub fn transfer_waits(&self) -> Vec<f64> {
        self.pd
            .iter()
            .map(|p| p.transferred - p.prefilled)
            .collect()
    }

    /// Hit rate per tier, over the fleet's prompt tokens: (device, host); `None` when unknown.
    pub fn tier_hit_rates(&self) -> Option<(f64, f64)> {
        let (cached, prompt) = self.cache_tokens?;
        let p = prompt.max(1) as f64;
        let host = self.loaded_back_tokens.min(cached);
        Some(((cached - host) as f64 / p, host as f64 / p))
    }

    /// Σ cached / Σ prompt tokens over the fleet (0 without prompts; `None` when unknown).
    pub fn cache_hit_rate(&self) -> Option<f64> {
        let (cached, prompt) = self.cache_tokens?;
        Some(if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        })
    }
}

/// The `p`-quantile (0–1) of `v` (nearest rank); NaN when empty.
pub fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * p).round() as usize]
}

/// Time to the first token of a lone request with `prompt` tokens on an idle engine.
pub fn isolated_ttft(m: ModelConfig, prompt: u64) -> f64 {
    let mut s = Scheduler::new(m);
    s.submit(Submit::counted(0, prompt, 2));
    let mut t = 0.0;
    loop {
        let step = s.step(t);
        t += step.duration;
        if step.kind == StepKind::Idle
            || step
                .events
                .iter()
                .any(|e| matches!(e, Event::FirstToken { .. } | Event::Finished { .. }))
        {
            return t;
        }
    }
}
