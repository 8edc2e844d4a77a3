//! What a cost policy reads of one worker in one go: the queued prefill (engine backlog plus this
//! router's dispatches since the snapshot, in tokens, and never less than its own streaming
//! requests still unanswered), the measured prefill speed, KV usage and in-flight count.
//! Lock-free: a handful of atomic loads, as [`Worker::load_at`].

use super::{LoadSignal, Worker};
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::atomic::{AtomicI64, AtomicU64};

/// What a cost policy needs of one worker, read in one go ([`Worker::pricing_at`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pricing {
    /// Prompt tokens queued for prefill there: the engines' reported backlog plus what this router
    /// dispatched since the oldest snapshot, at least its streaming requests with no answer yet.
    /// `None` when engine load is not usable (no range, stale, or `--load-signal inflight`):
    /// price on in-flight instead.
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
    /// Utilisation ρ in [0, 1) ([`super::utilisation`]; a worker's: the mean of its ranks');
    /// `None` until measured, and as `queued_tokens`.
    pub utilisation: Option<f64>,
    /// KV pool tokens not in use (`max_total_num_tokens − num_used_tokens`, the fullest rank's
    /// for a worker); `None` without a reported pool size, and as `queued_tokens`. Engines count
    /// cached pages no request uses as not in use (SGLang: used = capacity − available −
    /// evictable), so this includes the cache a placement would evict: what it can fill without
    /// evicting is this less the cache held there (`View::cache_size`), which errs low by the
    /// cached pages running requests lock (counted in both).
    pub free_pool_tokens: Option<u64>,
}

impl Worker {
    /// What a cost policy prices this worker on at `now` (see [`Pricing`]); engine numbers are
    /// used only when `signal` is not `Inflight` and every rank is fresher than `freshness_ms`.
    #[inline]
    pub fn pricing_at(&self, signal: LoadSignal, freshness_ms: u64, now: u64) -> Pricing {
        let oldest_rx = self.agg_oldest_rx.load(Acquire);
        let fresh = !self.ranks.is_empty() && fresh_at(oldest_rx, signal, freshness_ms, now);
        Counters {
            dispatched: &self.dispatched,
            dispatch_mark: &self.agg_mark,
            dispatched_tokens: &self.dispatched_tokens,
            tokens_mark: &self.agg_tokens_mark,
            inflight: &self.inflight,
            inflight_tokens: &self.inflight_tokens,
            unstarted_tokens: &self.unstarted_tokens,
            requests: &self.agg_requests,
            backlog: &self.agg_backlog,
            us_per_token_bits: &self.agg_us_per_token_bits,
            kv_usage_bits: &self.agg_kv_usage_bits,
            rho_bits: &self.agg_rho_bits,
            pool_free: &self.agg_pool_free,
        }
        .price(fresh)
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
        Counters {
            dispatched: &routed.dispatched,
            dispatch_mark: &routed.dispatch_mark,
            dispatched_tokens: &routed.dispatched_tokens,
            tokens_mark: &routed.tokens_mark,
            inflight: &routed.inflight,
            inflight_tokens: &routed.inflight_tokens,
            unstarted_tokens: &routed.unstarted_tokens,
            requests: &r.requests,
            backlog: &r.backlog,
            us_per_token_bits: &r.us_per_token_bits,
            kv_usage_bits: &r.token_usage_bits,
            rho_bits: &r.rho_bits,
            pool_free: &r.pool_free,
        }
        .price(fresh_at(r.received_ms(), signal, freshness_ms, now))
    }
}

/// Whether a snapshot received at `rx` (0: never) may be priced on at `now`.
#[inline]
fn fresh_at(rx: u64, signal: LoadSignal, freshness_ms: u64, now: u64) -> bool {
    rx != 0 && now.saturating_sub(rx) <= freshness_ms && signal != LoadSignal::Inflight
}

/// The counters one price is read from: a worker's (its sums over ranks) or one rank's.
struct Counters<'a> {
    dispatched: &'a AtomicU64,
    /// `dispatched` when the snapshot arrived.
    dispatch_mark: &'a AtomicU64,
    dispatched_tokens: &'a AtomicU64,
    /// `dispatched_tokens` when the snapshot arrived.
    tokens_mark: &'a AtomicU64,
    inflight: &'a AtomicI64,
    inflight_tokens: &'a AtomicU64,
    unstarted_tokens: &'a AtomicU64,
    requests: &'a AtomicI64,
    backlog: &'a AtomicI64,
    us_per_token_bits: &'a AtomicU64,
    kv_usage_bits: &'a AtomicU64,
    rho_bits: &'a AtomicU64,
    pool_free: &'a AtomicU64,
}

impl Counters<'_> {
    #[inline]
    fn price(self, fresh: bool) -> Pricing {
        let inflight = self.inflight.load(Relaxed).max(0);
        let (queued_tokens, engine_requests, utilisation, free_pool_tokens) = if fresh {
            // What this router dispatched since the snapshot, but never more than its requests
            // still open here: one that finished is not queued (with polled load, or a quiet
            // engine, a snapshot can be older than a whole short request).
            let since_tokens = self
                .dispatched_tokens
                .load(Relaxed)
                .saturating_sub(self.tokens_mark.load(Relaxed))
                .min(self.inflight_tokens.load(Relaxed));
            let since = self
                .dispatched
                .load(Relaxed)
                .saturating_sub(self.dispatch_mark.load(Relaxed));
            let e = self.requests.load(Relaxed);
            // At least this router's streaming requests not yet answered: a snapshot taken while
            // they were still on their way to the engine's queue (tokenizing, in a socket) does
            // not show them, and it moves the marks past them.
            let queued = (self.backlog.load(Relaxed).max(0) as u64 + since_tokens)
                .max(self.unstarted_tokens.load(Relaxed));
            (
                Some(queued),
                Some(inflight.max(e.saturating_add(i64::try_from(since).unwrap_or(i64::MAX)))),
                super::utilisation::rho_of_bits(self.rho_bits.load(Relaxed)),
                Some(self.pool_free.load(Relaxed)).filter(|&f| f != super::ranks::POOL_UNKNOWN),
            )
        } else {
            (None, None, None, None)
        };
        Pricing {
            queued_tokens,
            us_per_token: f64::from_bits(self.us_per_token_bits.load(Relaxed)),
            kv_usage: f64::from_bits(self.kv_usage_bits.load(Relaxed)),
            inflight,
            engine_requests,
            utilisation,
            free_pool_tokens,
        }
    }
}
