//! The fleet as a policy sees it for one request: every worker's load on the configured signal,
//! its pricing inputs, and the request's cached prefix per worker ([`crate::policy::View`]).
//! Built per request from the fleet's worker list; kept apart from [`crate::fleet`], which owns
//! membership and subscriptions, because policies and admission read this and nothing else.

/// The policy's view of a worker list.
use crate::book::{LoadSignal, Worker};
use crate::policy::View;
use std::sync::Arc;

pub struct FleetView<'a> {
    pub workers: &'a [Arc<Worker>],
    pub signal: LoadSignal,
    pub freshness_ms: u64,
    /// Bitmask of workers already tried for this request (first 64).
    pub tried: u64,
    /// The request's `now` ([`Worker::now_ms`]), read once per pick.
    pub now_ms: u64,
    /// The request's prompt tokens (0: unknown).
    pub prompt_tokens: u64,
    /// Per worker (same order as `workers`), the request's tokens cached there; empty: unknown.
    pub cached: &'a [u64],
    /// Per worker, the tokens the router believes cached there in all; empty: unknown.
    pub cache_sizes: &'a [u64],
}

impl<'a> FleetView<'a> {
    pub fn new(workers: &'a [Arc<Worker>], signal: LoadSignal, freshness_ms: u64) -> Self {
        let now_ms = workers.first().map_or(0, |w| w.now_ms());
        FleetView {
            workers,
            signal,
            freshness_ms,
            tried: 0,
            now_ms,
            prompt_tokens: 0,
            cached: &[],
            cache_sizes: &[],
        }
    }

    /// The view for a request of `prompt_tokens` whose cached prefix on worker i is `cached[i]`.
    pub fn with_prefix(mut self, prompt_tokens: u64, cached: &'a [u64]) -> Self {
        self.prompt_tokens = prompt_tokens;
        self.cached = cached;
        self
    }

    /// The view with the router's belief of each worker's whole cache size, in tokens.
    pub fn with_cache_sizes(mut self, cache_sizes: &'a [u64]) -> Self {
        self.cache_sizes = cache_sizes;
        self
    }

    /// Worker `i`'s pricing inputs at this view's `now`.
    #[inline]
    fn pricing(&self, i: usize) -> crate::book::Pricing {
        self.workers[i].pricing_at(self.signal, self.freshness_ms, self.now_ms)
    }

    /// Leaves worker `i` out of the next picks of this request (it was tried and failed).
    pub fn exclude(&mut self, i: usize) {
        if i < 64 {
            self.tried |= 1 << i;
        }
    }
}

impl View for FleetView<'_> {
    fn len(&self) -> usize {
        self.workers.len()
    }
    #[inline]
    fn load(&self, i: usize) -> i64 {
        self.workers[i]
            .load_at(self.signal, self.freshness_ms, self.now_ms)
            .score
    }
    #[inline]
    fn available(&self, i: usize) -> bool {
        (i >= 64 || self.tried & (1 << i) == 0) && self.workers[i].available_at(self.now_ms)
    }
    fn prompt_tokens(&self) -> u64 {
        self.prompt_tokens
    }
    #[inline]
    fn cached_tokens(&self, i: usize) -> u64 {
        self.cached.get(i).copied().unwrap_or(0)
    }
    fn cache_size(&self, i: usize) -> u64 {
        self.cache_sizes.get(i).copied().unwrap_or(0)
    }
    #[inline]
    fn queued_prefill_s(&self, i: usize) -> Option<f64> {
        let p = self.pricing(i);
        p.queued_tokens.map(|q| q as f64 * p.us_per_token / 1e6)
    }
    #[inline]
    fn engine_requests(&self, i: usize) -> Option<i64> {
        let l = self.workers[i].load_at(LoadSignal::Engine, self.freshness_ms, self.now_ms);
        (self.signal != LoadSignal::Inflight && l.source == crate::book::Source::Engine)
            .then_some(l.requests)
    }
    #[inline]
    fn prefill_s_per_token(&self, i: usize) -> f64 {
        self.pricing(i).us_per_token / 1e6
    }
    fn kv_usage(&self, i: usize) -> f64 {
        self.pricing(i).kv_usage
    }
    fn inflight(&self, i: usize) -> i64 {
        self.workers[i].inflight()
    }
}
