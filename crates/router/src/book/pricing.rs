//! What a cost policy reads of one worker in one go: the queued prefill (engine backlog plus this
//! router's dispatches since the snapshot, in tokens), the measured prefill speed, KV usage and
//! in-flight count. Lock-free: a handful of atomic loads, as [`Worker::load_at`].

use super::{LoadSignal, Worker};
use std::sync::atomic::Ordering::{Acquire, Relaxed};

/// What a cost policy needs of one worker, read in one go ([`Worker::pricing_at`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pricing {
    /// Prompt tokens queued for prefill there: the engines' reported backlog plus what this router
    /// dispatched since the oldest snapshot. `None` when engine load is not usable (no range,
    /// stale, or `--load-signal inflight`): price on in-flight instead.
    pub queued_tokens: Option<u64>,
    /// µs per prefill token: measured from the snapshots' counters, [`PRIOR_US_PER_TOKEN`](super::prefill_rate::PRIOR_US_PER_TOKEN) until
    /// then.
    pub us_per_token: f64,
    /// The fullest rank's KV usage, 0–1 (0 when unknown).
    pub kv_usage: f64,
    /// This router's open requests there.
    pub inflight: i64,
    /// Requests there by its engine (running + waiting, plus this router's dispatches since the
    /// snapshot, at least its open requests); `None` as `queued_tokens`.
    pub engine_requests: Option<i64>,
}

impl Worker {
    /// What a cost policy prices this worker on at `now` (see [`Pricing`]); engine numbers are
    /// used only when `signal` is not `Inflight` and every rank is fresher than `freshness_ms`.
    #[inline]
    pub fn pricing_at(&self, signal: LoadSignal, freshness_ms: u64, now: u64) -> Pricing {
        let oldest_rx = self.agg_oldest_rx.load(Acquire);
        let fresh = !self.ranks.is_empty()
            && oldest_rx != 0
            && now.saturating_sub(oldest_rx) <= freshness_ms
            && signal != LoadSignal::Inflight;
        let queued_tokens = fresh.then(|| {
            // What this router dispatched since the snapshot, but never more than its requests
            // still open here: one that finished is not queued (with polled load, or a quiet
            // engine, a snapshot can be older than a whole short request).
            let since = self
                .dispatched_tokens
                .load(Relaxed)
                .saturating_sub(self.agg_tokens_mark.load(Relaxed))
                .min(self.inflight_tokens.load(Relaxed));
            self.agg_backlog.load(Relaxed).max(0) as u64 + since
        });
        let inflight = self.inflight.load(Relaxed).max(0);
        let engine_requests = fresh.then(|| {
            let since = self
                .dispatched
                .load(Relaxed)
                .saturating_sub(self.agg_mark.load(Relaxed));
            let e = self.agg_requests.load(Relaxed);
            inflight.max(e.saturating_add(i64::try_from(since).unwrap_or(i64::MAX)))
        });
        Pricing {
            queued_tokens,
            us_per_token: f64::from_bits(self.agg_us_per_token_bits.load(Relaxed)),
            kv_usage: f64::from_bits(self.agg_kv_usage_bits.load(Relaxed)),
            inflight,
            engine_requests,
        }
    }

    /// [`Worker::pricing_at`] for DP rank `rank` alone: its own backlog, fresh on its own, plus
    /// what this router routed to it by name since; its own prefill speed and KV usage. A rank
    /// without a slot is priced as the whole worker.
    #[inline]
    pub fn rank_pricing_at(
        &self,
        rank: u32,
        signal: LoadSignal,
        freshness_ms: u64,
        now: u64,
    ) -> Pricing {
        let Some(r) = self.ranks.get(rank as usize) else {
            return self.pricing_at(signal, freshness_ms, now);
        };
        let routed = r.routed();
        let rx = r.received_ms();
        let fresh =
            rx != 0 && now.saturating_sub(rx) <= freshness_ms && signal != LoadSignal::Inflight;
        let queued_tokens = fresh.then(|| {
            let since = routed
                .dispatched_tokens
                .load(Relaxed)
                .saturating_sub(routed.tokens_mark.load(Relaxed))
                .min(routed.inflight_tokens.load(Relaxed));
            r.backlog.load(Relaxed).max(0) as u64 + since
        });
        let inflight = routed.inflight().max(0);
        let engine_requests = fresh.then(|| {
            let since = routed
                .dispatched
                .load(Relaxed)
                .saturating_sub(routed.dispatch_mark.load(Relaxed));
            let e = r.requests.load(Relaxed);
            inflight.max(e.saturating_add(i64::try_from(since).unwrap_or(i64::MAX)))
        });
        Pricing {
            queued_tokens,
            us_per_token: f64::from_bits(r.us_per_token_bits.load(Relaxed)),
            kv_usage: f64::from_bits(r.token_usage_bits.load(Relaxed)),
            inflight,
            engine_requests,
        }
    }
}
