//! The fleet as a policy sees it for one request: every candidate's load on the configured
//! signal, its pricing inputs, and the request's cached prefix on each ([`crate::policy::View`]).
//! A candidate is a worker or one DP rank of it ([`crate::candidate`]); index `i` of the view is
//! candidate `i`. Built per request from the fleet's lists; kept apart from [`crate::fleet`], which
//! owns membership and subscriptions, because policies and admission read this and nothing else.

use crate::adapters::AdapterCost;
use crate::book::{LoadSignal, Pricing, Worker};
use crate::candidate::{Candidate, Candidates};
use crate::policy::View;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// The policy's view of a request's candidates.
pub struct FleetView<'a> {
    /// The candidates, over the worker list.
    pub targets: Candidates<'a>,
    pub signal: LoadSignal,
    pub freshness_ms: u64,
    /// Bitmask of workers (by index in the worker list, first 64) already tried for this request:
    /// a failed attempt excludes every rank of its worker.
    pub tried: u64,
    /// A rank the client named itself: only candidates of that rank (and whole workers) qualify.
    pub pinned_rank: Option<u32>,
    /// The request's `now` ([`Worker::now_ms`]), read once per pick.
    pub now_ms: u64,
    /// The request's prompt tokens (0: unknown).
    pub prompt_tokens: u64,
    /// Per candidate (same order), the request's tokens cached there; empty: unknown.
    pub cached: &'a [u64],
    /// Per candidate, the part of `cached` on a host tier only; empty: none.
    pub host_cached: &'a [u64],
    /// Per candidate, the tokens the router believes cached there in all; empty: unknown.
    pub cache_sizes: &'a [u64],
    /// Per candidate, what the request's LoRA adapter costs there: a load, the reload of what it
    /// evicts, a wait for a slot ([`crate::adapters::AdapterBook::fill_costs`]); empty: no adapter.
    pub adapter_costs: &'a [AdapterCost],
    /// Per candidate, its cache's eviction regret, 0–1 ([`crate::cache::regret`]); empty: unknown.
    pub regret: &'a [f32],
    /// The request's chain of page hashes (root first) and the tokens per page; empty: unknown.
    pub chain: (&'a [i64], u64),
    /// This router's meter of reused prompt tails; `None`: unknown.
    pub reuse: Option<&'a crate::cache::TailReuse>,
}

impl<'a> FleetView<'a> {
    /// One candidate per worker of `workers`.
    pub fn new(workers: &'a [Arc<Worker>], signal: LoadSignal, freshness_ms: u64) -> Self {
        let now_ms = workers.first().map_or(0, |w| w.now_ms());
        FleetView {
            targets: Candidates::whole(workers),
            signal,
            freshness_ms,
            tried: 0,
            pinned_rank: None,
            now_ms,
            prompt_tokens: 0,
            cached: &[],
            host_cached: &[],
            cache_sizes: &[],
            adapter_costs: &[],
            regret: &[],
            chain: (&[], 0),
            reuse: None,
        }
    }

    /// The same view over the candidates `list` (an empty list: one per worker).
    pub fn with_candidates(mut self, list: &'a [Candidate]) -> Self {
        self.targets = Candidates::listed(self.targets.workers(), list);
        self
    }

    /// The worker list the candidates index.
    pub fn workers(&self) -> &'a [Arc<Worker>] {
        self.targets.workers()
    }

    /// Candidate `i`'s worker.
    #[inline]
    pub fn worker(&self, i: usize) -> &'a Arc<Worker> {
        self.targets.worker(i)
    }

    /// Candidate `i`'s load on the configured signal (its rank's alone when it is a rank).
    #[inline]
    pub fn load_of(&self, i: usize) -> crate::book::Load {
        self.load_on(i, self.signal)
    }

    #[inline]
    fn load_on(&self, i: usize, signal: LoadSignal) -> crate::book::Load {
        let c = self.targets.get(i);
        let w = &self.targets.workers()[c.worker as usize];
        match c.rank {
            Some(r) => w.rank_load_at(r, signal, self.freshness_ms, self.now_ms),
            None => w.load_at(signal, self.freshness_ms, self.now_ms),
        }
    }

    /// The view for a request of `prompt_tokens` whose cached prefix on candidate i is `cached[i]`.
    pub fn with_prefix(mut self, prompt_tokens: u64, cached: &'a [u64]) -> Self {
        self.prompt_tokens = prompt_tokens;
        self.cached = cached;
        self
    }

    /// The view with a request's cache lookup: its prompt, each candidate's cached prefix (and the
    /// part of it on a host tier only), the router's belief of each cache's size, and each
    /// cache's eviction regret.
    pub fn with_lookup(self, l: &'a crate::cache::Lookup) -> Self {
        let (block, chain) = l.prompt.any_chain().unwrap_or((0, &[]));
        self.with_prefix(l.prompt.prompt_tokens, &l.cached)
            .with_host_cached(&l.host_cached)
            .with_cache_sizes(&l.sizes)
            .with_regret(&l.regret)
            .with_chain(chain, block)
    }

    /// The view with the request's chain of page hashes, `block` tokens per page.
    pub fn with_chain(mut self, chain: &'a [i64], block: u64) -> Self {
        self.chain = (chain, block);
        self
    }

    /// The view with this router's meter of reused prompt tails.
    pub fn with_reuse(mut self, reuse: &'a crate::cache::TailReuse) -> Self {
        self.reuse = Some(reuse);
        self
    }

    /// The view with each candidate's eviction regret (same order).
    pub fn with_regret(mut self, regret: &'a [f32]) -> Self {
        self.regret = regret;
        self
    }

    /// The view with the part of each candidate's cached prefix held on a host tier only.
    pub fn with_host_cached(mut self, host_cached: &'a [u64]) -> Self {
        self.host_cached = host_cached;
        self
    }

    /// The view with the router's belief of each worker's whole cache size, in tokens.
    pub fn with_cache_sizes(mut self, cache_sizes: &'a [u64]) -> Self {
        self.cache_sizes = cache_sizes;
        self
    }

    /// The view with what the request's adapter costs on each candidate (same order).
    pub fn with_adapter_costs(mut self, adapter_costs: &'a [AdapterCost]) -> Self {
        self.adapter_costs = adapter_costs;
        self
    }

    /// Candidate `i`'s pricing inputs at this view's `now`.
    #[inline]
    fn pricing(&self, i: usize) -> Pricing {
        let c = self.targets.get(i);
        let w = &self.targets.workers()[c.worker as usize];
        match c.rank {
            Some(r) => w.rank_pricing_at(r, self.signal, self.freshness_ms, self.now_ms),
            None => w.pricing_at(self.signal, self.freshness_ms, self.now_ms),
        }
    }

    /// Leaves candidate `i`'s worker (every rank of it) out of the next picks of this request (it
    /// was tried and failed).
    pub fn exclude(&mut self, i: usize) {
        let w = self.targets.get(i).worker;
        if w < 64 {
            self.tried |= 1 << w;
        }
    }
}

impl View for FleetView<'_> {
    fn len(&self) -> usize {
        self.targets.len()
    }
    #[inline]
    fn load(&self, i: usize) -> i64 {
        self.load_of(i).score
    }
    #[inline]
    fn available(&self, i: usize) -> bool {
        let c = self.targets.get(i);
        let w = c.worker;
        (w >= 64 || self.tried & (1 << w) == 0)
            && self
                .pinned_rank
                .is_none_or(|p| c.rank.is_none_or(|r| r == p))
            && self.targets.workers()[w as usize].available_at(self.now_ms)
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
    fn host_cached_tokens(&self, i: usize) -> u64 {
        self.host_cached.get(i).copied().unwrap_or(0)
    }
    #[inline]
    fn adapter_cost(&self, i: usize) -> AdapterCost {
        self.adapter_costs
            .get(i)
            .copied()
            .unwrap_or(AdapterCost::RESIDENT)
    }
    fn host_load_s_per_token(&self, i: usize) -> Option<f64> {
        match self.worker(i).host_load_tokens_per_s.load(Relaxed) {
            0 => None,
            rate => Some(1.0 / rate as f64),
        }
    }
    #[inline]
    fn queued_prefill_s(&self, i: usize) -> Option<f64> {
        let p = self.pricing(i);
        p.queued_tokens.map(|q| q as f64 * p.us_per_token / 1e6)
    }
    #[inline]
    fn engine_requests(&self, i: usize) -> Option<i64> {
        self.pricing(i).engine_requests
    }
    #[inline]
    fn prefill_s_per_token(&self, i: usize) -> f64 {
        self.pricing(i).us_per_token / 1e6
    }
    fn kv_usage(&self, i: usize) -> f64 {
        self.pricing(i).kv_usage
    }
    fn inflight(&self, i: usize) -> i64 {
        self.pricing(i).inflight
    }
    #[inline]
    fn utilisation(&self, i: usize) -> Option<f64> {
        self.pricing(i).utilisation
    }
    #[inline]
    fn free_pool_tokens(&self, i: usize) -> Option<u64> {
        self.pricing(i).free_pool_tokens
    }
    #[inline]
    fn prefix_key(&self, tokens: u64) -> Option<u64> {
        let (chain, block) = self.chain;
        crate::cache::reuse::tail_key(chain, block, tokens)
    }
    fn tail_reused(&self, deepest: u64) -> bool {
        let (chain, block) = self.chain;
        match self.reuse {
            Some(r) => r.expects_reuse(chain, block, deepest, self.now_ms),
            None => deepest > 0,
        }
    }
    fn prefix_private(&self, deepest: u64) -> bool {
        let (chain, block) = self.chain;
        self.reuse
            .is_some_and(|r| !r.branched(chain, block, deepest, self.now_ms))
    }
    #[inline]
    fn worker_key(&self, i: usize) -> u64 {
        let c = self.targets.get(i);
        let w = &self.targets.workers()[c.worker as usize];
        w.url_key ^ c.rank.map_or(0, |r| crate::policy::mix(u64::from(r) + 1))
    }
    #[inline]
    fn eviction_regret(&self, i: usize) -> f64 {
        self.regret.get(i).map_or(0.0, |&r| f64::from(r))
    }
    fn pending_transfers(&self, i: usize) -> Option<i64> {
        let c = self.targets.get(i);
        let w = &self.targets.workers()[c.worker as usize];
        let of = |r: &crate::book::ranks::RankState| r.pd_pending.load(Relaxed);
        Some(match c.rank.and_then(|r| w.ranks.get(r as usize)) {
            Some(r) => of(r),
            None => w.ranks.iter().map(of).sum(),
        })
    }
    #[inline]
    fn price(&self, i: usize) -> crate::policy::Price {
        let p = self.pricing(i);
        crate::policy::Price {
            queued_s: p.queued_tokens.map(|q| q as f64 * p.us_per_token * 1e-6),
            engine_requests: p.engine_requests,
            s_per_token: p.us_per_token * 1e-6,
            kv_usage: p.kv_usage,
            inflight: p.inflight,
            utilisation: p.utilisation,
            free_pool_tokens: p.free_pool_tokens,
        }
    }
}
