//! Routing policies. Pure: `pick(view, entropy)` with no I/O, no clock and no allocation, so the
//! same code runs in the live router and in a simulator. The view carries the loads (already
//! merged by the `LoadBook`, with `now` baked in) and, for cache-aware policies, this request's
//! cached prefix on each worker and what pricing in time needs; `entropy` is a per-request number
//! (the router uses its request sequence), from which the randomised policies derive their choices.
//!
//! * load only: `round_robin`, `random`, `power_of_two`, `least_load` (here);
//! * [`cache_aware`]: SGLang's cache-aware algorithm (thresholds in [`CacheAware`]);
//! * [`min_ttft`]: loadlink's cost policy, the predicted time to first token ([`MinTtft`]);
//! * [`decode_load`]: a PD fleet's decode side ([`DecodeLoad`]).

pub mod cache_aware;
pub mod decode_load;
pub mod fleet_cost;
pub mod min_ttft;

pub use cache_aware::CacheAware;
pub use decode_load::DecodeLoad;
pub use min_ttft::{
    AdapterPricing, DEFAULT_HOST_LOAD_TOKENS_PER_S, FleetPricing, MinTtft, TierPricing,
};

use crate::book::prefill_rate::PRIOR_US_PER_TOKEN;

/// What a policy may look at.
pub trait View {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The load of worker `i` on the configured signal.
    fn load(&self, i: usize) -> i64;
    /// Whether worker `i` may take traffic now (healthy, breaker closed, not excluded).
    fn available(&self, i: usize) -> bool;
    /// Prompt tokens of the request being placed (0 when the router does not know them).
    fn prompt_tokens(&self) -> u64 {
        0
    }
    /// Tokens of this request's prompt believed cached on worker `i` (from the KV index, or the
    /// approximate tree for workers without KV events); 0 when unknown.
    fn cached_tokens(&self, _i: usize) -> u64 {
        0
    }
    /// Of [`View::cached_tokens`], the tokens held on a host tier only (HiCache's host pool,
    /// disk): a hit that is loaded back before prefill. 0 when unknown or without tiers.
    fn host_cached_tokens(&self, _i: usize) -> u64 {
        0
    }
    /// Seconds worker `i` needs to load one token's KV back from its host tier (the inverse of
    /// its advertised load bandwidth); `None`: not advertised, the policy's default applies.
    fn host_load_s_per_token(&self, _i: usize) -> Option<f64> {
        None
    }
    /// What this request's LoRA adapter costs on worker `i` ([`crate::adapters`]): nothing when
    /// it is resident or the request names none; else a load, the expected reload of the adapter
    /// the load evicts, and a wait when every resident adapter is in use. Only `min_ttft`
    /// (adapter-aware) reads it; `cache_aware` and the load-only policies place requests as if
    /// adapters were free (adapter-blind).
    fn adapter_cost(&self, _i: usize) -> crate::adapters::AdapterCost {
        crate::adapters::AdapterCost::RESIDENT
    }
    /// Tokens the router believes worker `i` caches in all (the size of its tree or index slot):
    /// `cache_aware` sends a request without a good match to the worker with the least.
    fn cache_size(&self, _i: usize) -> u64 {
        0
    }
    /// Seconds of prefill queued on worker `i`: the engine-reported backlog plus what this router
    /// dispatched there since the snapshot, at the worker's measured speed. `None` when its engine
    /// load is not usable (stale, no load range, or the in-flight signal).
    fn queued_prefill_s(&self, _i: usize) -> Option<f64> {
        None
    }
    /// Requests on worker `i` by its engine (running + waiting, plus dispatches since the
    /// snapshot); `None` as for [`View::queued_prefill_s`].
    fn engine_requests(&self, _i: usize) -> Option<i64> {
        None
    }
    /// Seconds worker `i` needs per uncached prompt token (measured; a prior until measured).
    fn prefill_s_per_token(&self, _i: usize) -> f64 {
        PRIOR_US_PER_TOKEN / 1e6
    }
    /// Worker `i`'s KV usage, 0–1 (its fullest rank; 0 when unknown).
    fn kv_usage(&self, _i: usize) -> f64 {
        0.0
    }
    /// This router's open requests on worker `i`.
    fn inflight(&self, _i: usize) -> i64 {
        0
    }
    /// Requests on worker `i` waiting for their KV to arrive (a PD decode engine's pre-allocation
    /// and transfer queues, its snapshot's `disaggregation` section, as last reported); `None`:
    /// not known. Read only where [`View::engine_requests`] says the load is fresh.
    fn pending_transfers(&self, _i: usize) -> Option<i64> {
        None
    }
    /// Worker i's utilisation ρ in [0, 1): the share of time its prefill is busy (1 while its
    /// queue does not drain), smoothed over the engine's rate window; None when unknown or its
    /// load is stale.
    fn utilisation(&self, _i: usize) -> Option<f64> {
        None
    }
    /// KV pool tokens free on worker i (capacity − used, its fullest rank); None when unknown.
    fn free_pool_tokens(&self, _i: usize) -> Option<u64> {
        None
    }
    /// A key of the request's prefix up to the page holding token `tokens` (its chained page
    /// hash), the same in every router replica; `None` when unknown or beyond the prompt.
    fn prefix_key(&self, _tokens: u64) -> Option<u64> {
        None
    }
    /// Whether the part of this request's prompt past `deepest` tokens (the deepest prefix any
    /// candidate caches) is likely to be wanted by another request before it is indexed
    /// ([`crate::cache::reuse`]). Without that evidence: whenever something is cached (the
    /// price before the evidence was kept).
    fn tail_reused(&self, deepest: u64) -> bool {
        deepest > 0
    }
    /// Whether the deepest `deepest` tokens of this request cached anywhere are its own context
    /// (a running session's: no other request recently branched from that prefix,
    /// [`crate::cache::reuse::TailReuse::branched`]) rather than a prefix a family shares.
    /// Without that evidence: no.
    fn prefix_private(&self, _deepest: u64) -> bool {
        false
    }
    /// A key of candidate i that every router replica computes alike (its URL and rank).
    fn worker_key(&self, i: usize) -> u64 {
        i as u64
    }
    /// Share, 0–1, of what worker i's cache evicted that was stored again within one pool
    /// turnover (regretted evictions); 0 when unknown.
    fn eviction_regret(&self, _i: usize) -> f64 {
        0.0
    }
    /// Everything a cost policy reads of worker `i`, in one call: a view that can read it in one
    /// go (the fleet's, per rank) overrides this, which composes the calls above.
    #[inline]
    fn price(&self, i: usize) -> Price {
        Price {
            queued_s: self.queued_prefill_s(i),
            engine_requests: self.engine_requests(i),
            s_per_token: self.prefill_s_per_token(i),
            kv_usage: self.kv_usage(i),
            inflight: self.inflight(i),
            utilisation: self.utilisation(i),
            free_pool_tokens: self.free_pool_tokens(i),
        }
    }
}

/// What [`View::price`] returns: the pricing inputs of one candidate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    /// [`View::queued_prefill_s`].
    pub queued_s: Option<f64>,
    /// [`View::engine_requests`].
    pub engine_requests: Option<i64>,
    /// [`View::prefill_s_per_token`].
    pub s_per_token: f64,
    /// [`View::kv_usage`].
    pub kv_usage: f64,
    /// [`View::inflight`].
    pub inflight: i64,
    /// [`View::utilisation`].
    pub utilisation: Option<f64>,
    /// [`View::free_pool_tokens`].
    pub free_pool_tokens: Option<u64>,
}

/// A routing policy and its parameters (`Copy`: it travels in the router's config).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    RoundRobin,
    Random,
    PowerOfTwo,
    LeastLoad,
    /// SGLang's cache-aware policy; its load is [`View::load`] (the configured signal).
    CacheAware(CacheAware),
    /// loadlink's cost policy: the least predicted time to first token.
    MinTtft(MinTtft),
    /// A PD decode side's load: requests, pending KV transfers, KV usage.
    DecodeLoad(DecodeLoad),
}

impl Policy {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "round_robin" => Ok(Policy::RoundRobin),
            "random" => Ok(Policy::Random),
            "power_of_two" => Ok(Policy::PowerOfTwo),
            "least_load" => Ok(Policy::LeastLoad),
            "cache_aware" => Ok(Policy::CacheAware(CacheAware::default())),
            "min_ttft" => Ok(Policy::MinTtft(MinTtft::default())),
            "decode_load" => Ok(Policy::DecodeLoad(DecodeLoad::default())),
            o => Err(format!(
                "unknown policy {o:?}; expected round_robin, random, power_of_two, least_load, \
                 cache_aware, min_ttft or decode_load"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round_robin",
            Policy::Random => "random",
            Policy::PowerOfTwo => "power_of_two",
            Policy::LeastLoad => "least_load",
            Policy::CacheAware(_) => "cache_aware",
            Policy::MinTtft(_) => "min_ttft",
            Policy::DecodeLoad(_) => "decode_load",
        }
    }

    /// Whether the policy reads cached prefixes (the router then looks each request up in its
    /// caches; load-only policies skip the tokenizer and the lookup).
    pub fn uses_cache(self) -> bool {
        matches!(self, Policy::CacheAware(_) | Policy::MinTtft(_))
    }

    /// The chosen worker, or `None` when none is available.
    pub fn pick(self, view: &impl View, entropy: u64) -> Option<usize> {
        let n = view.len();
        if n == 0 {
            return None;
        }
        let first = match self {
            Policy::RoundRobin => (entropy % n as u64) as usize,
            Policy::Random => (mix(entropy) % n as u64) as usize,
            Policy::PowerOfTwo => {
                let h = mix(entropy);
                let a = (h % n as u64) as usize;
                // A second, distinct index from the other half of the hash.
                let b = if n > 1 {
                    (a + 1 + ((h >> 32) % (n as u64 - 1)) as usize) % n
                } else {
                    a
                };
                match (view.available(a), view.available(b)) {
                    (true, true) => {
                        let (la, lb) = (view.load(a), view.load(b));
                        if la < lb || (la == lb && h & (1 << 63) == 0) {
                            a
                        } else {
                            b
                        }
                    }
                    (true, false) => a,
                    (false, true) => b,
                    (false, false) => return least_available(view, entropy),
                }
            }
            Policy::LeastLoad => return least_available(view, entropy),
            Policy::CacheAware(p) => return p.pick(view, entropy),
            Policy::MinTtft(p) => return p.pick(view, entropy),
            Policy::DecodeLoad(p) => return p.pick(view, entropy),
        };
        if view.available(first) {
            return Some(first);
        }
        // The natural choice is unavailable: walk on from it.
        (1..n).map(|k| (first + k) % n).find(|&i| view.available(i))
    }
}

/// The available worker with the least load; ties broken by rotating the start with `entropy`.
pub(crate) fn least_available(view: &impl View, entropy: u64) -> Option<usize> {
    let n = view.len();
    let start = (entropy % n as u64) as usize;
    let mut best: Option<(i64, usize)> = None;
    for i in rotated(start, n) {
        if !view.available(i) {
            continue;
        }
        let l = view.load(i);
        if best.is_none_or(|(bl, _)| l < bl) {
            best = Some((l, i));
        }
    }
    best.map(|(_, i)| i)
}

/// `start..n` then `0..start`: every index once, from a rotating start, without a division per step.
#[inline]
fn rotated(start: usize, n: usize) -> impl Iterator<Item = usize> {
    (start..n).chain(0..start.min(n))
}

/// splitmix64: a fast, well-mixed hash of the request sequence.
#[inline]
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The available worker with the smallest `key`; ties broken by rotating the start with
/// `entropy`.
pub(crate) fn argmin_by<K: PartialOrd>(
    view: &impl View,
    entropy: u64,
    key: impl Fn(usize) -> K,
) -> Option<usize> {
    let n = view.len();
    if n == 0 {
        return None;
    }
    let start = (entropy % n as u64) as usize;
    let mut best: Option<(K, usize)> = None;
    for i in rotated(start, n) {
        if !view.available(i) {
            continue;
        }
        let k = key(i);
        if best.as_ref().is_none_or(|(bk, _)| k < *bk) {
            best = Some((k, i));
        }
    }
    best.map(|(_, i)| i)
}

#[cfg(test)]
mod adapter_tests;
#[cfg(test)]
mod fleet_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tier_tests;
