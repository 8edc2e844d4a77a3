//! The rank's load as SGLang's collector reports it, read off the model.

use super::{RATE_WINDOW_S, Req, Scheduler};
use loadlink_wire::LoadSnapshot;
use loadlink_wire::snapshot::{LoraMetrics, MemoryMetrics, QueueMetrics};

impl Scheduler {
    /// Prompt tokens still to compute for queued requests (their cached prefix, matched when
    /// queued, left out) and for the one being prefilled in chunks.
    pub fn waiting_uncached_tokens(&self) -> u64 {
        self.waiting
            .iter()
            .map(|r| r.prefill_target().saturating_sub(r.queued_hit))
            .sum::<u64>()
            + self
                .chunked
                .as_ref()
                .map_or(0, |r| r.prefill_target() - r.prefilled)
    }

    /// The requests still owed their first token: queued ones (a retracted one already had it)
    /// and the one being prefilled in chunks.
    pub fn awaiting_first_token(&self) -> impl Iterator<Item = u64> + '_ {
        (self.waiting.iter().chain(self.chunked.as_ref()))
            .filter(|r| !r.retracted)
            .map(|r| r.id)
    }

    /// The share of the KV pool in use (SGLang's `token_usage`; 0 for an empty pool).
    pub fn token_usage(&self) -> f64 {
        match self.cfg.max_total_tokens {
            0 => 0.0,
            cap => self.used_tokens() as f64 / cap as f64,
        }
    }

    /// `(cached, prompt)` tokens of every admission so far: the lifetime hit rate's terms.
    pub fn cache_totals(&self) -> (u64, u64) {
        (self.stats.hit_tokens, self.stats.prompt_tokens)
    }

    /// Cached / (cached + computed) prompt tokens of the admissions of the last 15 s.
    pub fn cache_hit_rate(&self) -> f64 {
        let (hit, total) = self
            .stats
            .hits
            .iter()
            .fold((0, 0), |(h, t), w| (h + w.1, t + w.2));
        if total == 0 {
            0.0
        } else {
            hit as f64 / total as f64
        }
    }

    /// SGLang's `lora` section when LoRA is on: the distinct adapters of the running batch against
    /// the slots (`max_loaded`).
    fn lora_metrics(&self) -> Option<LoraMetrics> {
        let total = self.cfg.lora.max_loaded;
        if total == 0 {
            return None;
        }
        let mut active: Vec<u32> = self.running.iter().filter_map(|r| r.adapter).collect();
        active.sort_unstable();
        active.dedup();
        Some(LoraMetrics {
            slots_used: active.len() as i64,
            slots_total: total as i64,
            utilization: active.len() as f64 / total as f64,
        })
    }

    /// This rank's load, as SGLang's collector reports it (`wall_ts`: wall-clock seconds).
    pub fn snapshot(&self, rank: u32, wall_ts: f64) -> LoadSnapshot {
        let used = self.used_tokens();
        let cap = self.cfg.max_total_tokens;
        let queued: u64 = self.waiting.iter().map(Req::prefill_target).sum();
        let since = self.now - RATE_WINDOW_S;
        let (tokens, busy) = self
            .stats
            .window
            .iter()
            .filter(|w| w.0 >= since)
            .fold((0u64, 0.0), |(t, b), w| (t + w.1, b + w.2));
        let span = RATE_WINDOW_S.min(self.now);
        let per_span = |x: f64| if span > 0.0 { x / span } else { 0.0 };
        LoadSnapshot {
            timestamp: Some(wall_ts),
            dp_rank: rank as i64,
            num_running_reqs: self.running.len() as i64,
            num_waiting_reqs: self.num_waiting() as i64,
            num_waiting_uncached_tokens: self.waiting_uncached_tokens() as i64,
            num_used_tokens: used as i64,
            num_total_tokens: (used + queued) as i64,
            num_active_tokens: (used + queued) as i64,
            max_total_num_tokens: cap as i64,
            max_running_requests: self.cfg.max_running_requests as i64,
            token_usage: Some(self.token_usage()),
            gen_throughput: Some(per_span(tokens as f64)),
            cache_hit_rate: Some(self.cache_hit_rate()),
            utilization: Some(per_span(busy).min(1.0)),
            total_prefill_uncached_tokens: self.stats.total_prefill_tokens as i64,
            total_prefill_busy_us: self.stats.total_prefill_busy_us as i64,
            decode_moments: Some(self.stats.decode_moments.to_vec()),
            memory: Some(MemoryMetrics {
                weight_gb: 0.0,
                kv_cache_gb: 0.0,
                graph_gb: 0.0,
                token_capacity: cap as i64,
            }),
            lora: self.lora_metrics(),
            disaggregation: self.disaggregation_metrics(),
            queues: Some(QueueMetrics {
                waiting: self.num_waiting() as i64,
                retracted: self.waiting.iter().filter(|r| r.retracted).count() as i64,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}
