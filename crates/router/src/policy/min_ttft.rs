//! `min_ttft`: loadlink's cost policy. For every available worker it predicts this request's time
//! to first token in seconds and picks the least:
//!
//! ```text
//! ttft(i) = (queued(i) + uncached(i) + per_request_tokens · requests(i)) · s_per_token(i)
//!           + host_load(i) + adapter(i) + kv_penalty(i)
//! ```
//! * `queued(i)`: the engine-reported prefill backlog plus the tokens this router dispatched there
//!   since the snapshot (both from the book, [`View::queued_prefill_s`]);
//! * `uncached(i)`: this request's prompt minus its prefix cached there (KV index or approximate
//!   tree), on any tier: the cache's whole effect is to make this term small;
//! * `host_load(i)` (with `--tier-pricing aware`, the default): the part of that prefix held on a
//!   host tier only is loaded back before prefill, at the worker's advertised load bandwidth (else
//!   `host_load_tokens_per_s`), and never priced above recomputing it. So a host-tier hit ranks
//!   between a device hit and a miss. `blind` prices it as a device hit (free), as routers do
//!   today; SGLang #39108 is what that costs once sessions outlive their device pages;
//! * `adapter(i)` (with `--adapter-pricing aware`, the default): for a request naming a LoRA
//!   adapter, 0 where the router believes it resident; else the worker's adapter load time plus
//!   the expected reload of the adapter the load evicts ([`crate::adapters`]), times the requests
//!   the load delays (this one, `requests(i)`, and as many again arriving before those leave: the
//!   engine pauses its batch for a load, and a busy engine keeps the shift;
//!   [`PAUSED_LIFETIMES`]), plus
//!   the wait for a slot when every resident adapter is in use. So at equal load a request goes
//!   where its adapter is, and stops going there once that worker's queue costs more than a load
//!   elsewhere. `blind` leaves the term out, as routers do today;
//! * `requests(i)`: queued and running requests; each costs decode steps interleaved with the
//!   prefill (the backlog signal's per-request weight);
//! * `s_per_token(i)`: that engine's measured prefill speed, so a slow engine is priced as slow;
//! * `kv_penalty(i)`: grows linearly from `kv_pressure_from` to full KV usage, up to
//!   `kv_pressure_s` (a full pool delays admission and risks retraction).
//!
//! When a worker's engine load is stale, it is priced on this router's in-flight count instead
//! (each open request as [`DISPATCH_TOKENS_GUESS`] tokens plus its per-request weight).
//!
//! **Herding.** Router replicas see the same snapshots, and a hot prefix makes one worker the
//! cheapest for many requests. What keeps them apart: (1) the price is in seconds and includes the
//! queue, so the cached worker stops being cheapest exactly when waiting there costs more than
//! recomputing the prefix elsewhere; the prefix then spreads; (2) each dispatch is added to the
//! worker's queue at once, in tokens (the book's dispatched-since-snapshot correction), so one
//! replica does not send a burst to one worker between snapshots; (3) workers whose price is within
//! a small band of the best (`tie_rel` of it, at least `tie_abs_s`) are ties, and one of them is
//! drawn with `entropy`, so replicas that see the same numbers still spread their picks.

use super::fleet_cost::FleetCtx;
use super::{View, mix};
use crate::book::DISPATCH_TOKENS_GUESS;

/// Host-to-device KV load bandwidth assumed for a worker that does not advertise its own, in
/// tokens per second. A Llama-3-8B-class model (GQA, 32 layers, 8 KV heads of 128, bf16) keeps
/// 128 KiB of KV per token; PCIe 4.0 x16 moves about 25 GB/s at best, and HiCache's copy kernels
/// reach a good part of that: 100k tokens/s is about 13 GB/s, a conservative half. Against the
/// simulated engine's 10k prefill tokens/s, a host-tier hit costs a tenth of recomputing it,
/// close to the 72% TTFT saving SGLang #26305 measures for 8k-token prompts hitting the host.
pub const DEFAULT_HOST_LOAD_TOKENS_PER_S: f64 = 100_000.0;

/// How `min_ttft` prices the part of a hit held on a host tier only (`--tier-pricing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TierPricing {
    /// At its load-back time.
    #[default]
    Aware,
    /// As a device hit: free (what routers that ignore tiers do).
    Blind,
    /// As a miss: recomputed (what a router that indexes the device tier only believes).
    Miss,
}

impl TierPricing {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "aware" => Ok(TierPricing::Aware),
            "blind" => Ok(TierPricing::Blind),
            "miss" => Ok(TierPricing::Miss),
            o => Err(format!(
                "--tier-pricing {o:?}: expected aware, blind or miss"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TierPricing::Aware => "aware",
            TierPricing::Blind => "blind",
            TierPricing::Miss => "miss",
        }
    }
}

/// Whether `min_ttft` prices LoRA adapter loads (`--adapter-pricing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AdapterPricing {
    /// A load (and the reload its eviction causes) where the adapter is not resident.
    #[default]
    Aware,
    /// Adapters are free everywhere (what routers that ignore them do).
    Blind,
}

impl AdapterPricing {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "aware" => Ok(AdapterPricing::Aware),
            "blind" => Ok(AdapterPricing::Blind),
            o => Err(format!("--adapter-pricing {o:?}: expected aware or blind")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AdapterPricing::Aware => "aware",
            AdapterPricing::Blind => "blind",
        }
    }
}

/// Whether `min_ttft` prices what a placement costs the rest of the fleet (`--fleet-pricing`;
/// [`super::fleet_cost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FleetPricing {
    /// The recompute a move away from a prefix's holder causes, at the queueing externality of
    /// the worker's utilisation, plus regretted evictions; holders preferred within the tie band.
    #[default]
    Aware,
    /// This request's predicted TTFT only (loadlink before issue 24; greedy near saturation).
    Blind,
}

impl FleetPricing {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "aware" => Ok(FleetPricing::Aware),
            "blind" => Ok(FleetPricing::Blind),
            o => Err(format!("--fleet-pricing {o:?}: expected aware or blind")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FleetPricing::Aware => "aware",
            FleetPricing::Blind => "blind",
        }
    }
}

/// Request lifetimes over which an adapter load's batch pause delays the requests on the engine:
/// the ones present when it starts, and as many again arriving before they leave
/// ([`MinTtft::adapter_s`]).
pub const PAUSED_LIFETIMES: f64 = 2.0;

/// `min_ttft`'s parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MinTtft {
    /// Prompt tokens each running or waiting request adds to a worker's price.
    pub per_request_tokens: f64,
    /// Seconds added at full KV usage.
    pub kv_pressure_s: f64,
    /// KV usage (0–1) from which the penalty starts.
    pub kv_pressure_from: f64,
    /// Relative width of the tie band around the best price.
    pub tie_rel: f64,
    /// Absolute width of the tie band, seconds.
    pub tie_abs_s: f64,
    /// How a host-tier hit is priced.
    pub tier_pricing: TierPricing,
    /// Load-back bandwidth of workers that do not advertise theirs, tokens per second.
    pub host_load_tokens_per_s: f64,
    /// How a LoRA adapter's load is priced.
    pub adapter_pricing: AdapterPricing,
    /// Whether the fleet's work is priced besides this request's TTFT.
    pub fleet_pricing: FleetPricing,
}

impl Default for MinTtft {
    fn default() -> Self {
        MinTtft {
            per_request_tokens: crate::book::REQUEST_TOKENS_WEIGHT as f64,
            kv_pressure_s: 0.5,
            kv_pressure_from: 0.9,
            tie_rel: 0.05,
            tie_abs_s: 0.002,
            tier_pricing: TierPricing::Aware,
            host_load_tokens_per_s: DEFAULT_HOST_LOAD_TOKENS_PER_S,
            adapter_pricing: AdapterPricing::Aware,
            fleet_pricing: FleetPricing::Aware,
        }
    }
}

impl MinTtft {
    /// The predicted seconds to this request's first token on worker `i`.
    #[inline]
    pub fn predicted_ttft_s(&self, view: &impl View, i: usize) -> f64 {
        self.cost_s(view, i, &FleetCtx::NONE)
    }

    /// Candidate `i`'s price: its predicted TTFT plus, with `fleet` active, what the placement
    /// costs the rest of the fleet ([`FleetCtx::extra_s`]).
    #[inline]
    pub fn cost_s(&self, view: &impl View, i: usize, fleet: &FleetCtx) -> f64 {
        let p = view.price(i);
        let s_tok = p.s_per_token;
        let prompt = match view.prompt_tokens() {
            0 => DISPATCH_TOKENS_GUESS as u64,
            p => p,
        };
        let cached = view.cached_tokens(i).min(prompt);
        let uncached = prompt - cached;
        let host_load_s = self.host_load_s(view, i, cached, s_tok);
        let queued_s = match (p.queued_s, p.engine_requests) {
            (Some(q), Some(r)) => q + r.max(0) as f64 * self.per_request_tokens * s_tok,
            _ => {
                let f = p.inflight.max(0) as f64;
                f * (DISPATCH_TOKENS_GUESS as f64 + self.per_request_tokens) * s_tok
            }
        };
        let kv_penalty = self.kv_penalty_s(p.kv_usage);
        let adapter_s = match self.adapter_pricing {
            AdapterPricing::Aware => self.adapter_s(view, i, &p),
            AdapterPricing::Blind => 0.0,
        };
        let fleet_s = match fleet.active() {
            true => fleet.extra_s(view, i, prompt, self.held(view, i).min(prompt), s_tok),
            false => 0.0,
        };
        queued_s + uncached as f64 * s_tok + host_load_s + adapter_s + kv_penalty + fleet_s
    }

    /// Seconds added for a KV pool `usage` full (0–1): 0 up to `kv_pressure_from`, then linear
    /// up to `kv_pressure_s` at a full pool.
    #[inline]
    pub fn kv_penalty_s(&self, usage: f64) -> f64 {
        // Only above the threshold (rare): the division stays off the common path. A NaN usage
        // is not above it, so it adds nothing.
        if usage > self.kv_pressure_from {
            let over = (usage - self.kv_pressure_from) / (1.0 - self.kv_pressure_from);
            self.kv_pressure_s * over.clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    /// The highest price that ties with `best`: `tie_rel` of it above, at least `tie_abs_s`.
    #[inline]
    pub fn tie_band(&self, best: f64) -> f64 {
        best + (best * self.tie_rel).max(self.tie_abs_s)
    }

    /// What candidate `i` holds of the prompt for the fleet term, in tokens of recompute it saves:
    /// its device hits, and its host-tier hits less their load-back time in tokens of prefill (as
    /// the TTFT term prices them: free when blind, worthless when priced as misses).
    #[inline]
    fn held(&self, view: &impl View, i: usize) -> u64 {
        let cached = view.cached_tokens(i);
        let host = view.host_cached_tokens(i).min(cached);
        if host == 0 || self.tier_pricing == TierPricing::Blind {
            return cached;
        }
        let s_tok = view.prefill_s_per_token(i);
        let load = self.host_load_s(view, i, cached, s_tok);
        let saved = (host as f64 - load / s_tok.max(1e-12)).max(0.0);
        cached - host + saved as u64
    }

    /// The adapter term: the request's wait for a slot, plus the engine's load time for every
    /// request it delays; 0 on the common path without adapters.
    ///
    /// A load pauses the whole batch, so it delays this request, the `others` running and waiting
    /// there, and, because a busy engine never catches the pause up (continuous batching keeps it
    /// busy: the shift stays until the requests present then have left, about one request
    /// lifetime), also the requests that arrive in that time: by Little's law, arrivals over one
    /// mean time in the system number the mean in the system, `others` again
    /// ([`PAUSED_LIFETIMES`]). Counting only the requests present counts about half the
    /// requests a load delays: `bench sim --scenario models` seeds 1-3 load 150 / 166 / 158 per
    /// 1,000 requests pricing one lifetime and 142 / 152 / 146 pricing two, at TTFT p99
    /// 0.62 / 0.71 / 0.60 s and 0.64 / 0.62 / 0.56 s; `bench live` (60 virtual s) 186 / 164 /
    /// 177 and 178 / 161 / 149 (docs/results.md, "Models and LoRA adapters").
    #[inline]
    fn adapter_s(&self, view: &impl View, i: usize, p: &super::Price) -> f64 {
        let c = view.adapter_cost(i);
        if c.resident {
            return 0.0;
        }
        let others = p.engine_requests.unwrap_or(p.inflight).max(0) as f64;
        c.load_s * (1.0 + PAUSED_LIFETIMES * others) + c.wait_s
    }

    /// Seconds to load back the host-tier part of candidate `i`'s `cached` tokens (0 when blind,
    /// and on the common path without tiers); never more than recomputing them at `s_tok`
    /// (which is what `miss` prices).
    #[inline]
    fn host_load_s(&self, view: &impl View, i: usize, cached: u64, s_tok: f64) -> f64 {
        if self.tier_pricing == TierPricing::Blind {
            return 0.0;
        }
        let host = view.host_cached_tokens(i).min(cached);
        if host == 0 {
            return 0.0;
        }
        let per_token = match self.tier_pricing {
            TierPricing::Miss => s_tok,
            _ => view
                .host_load_s_per_token(i)
                .unwrap_or(1.0 / self.host_load_tokens_per_s.max(1.0)),
        };
        host as f64 * per_token.min(s_tok)
    }

    /// The chosen worker, or `None` when none is available. Each candidate is priced once: the
    /// prices of up to [`PRICED_ON_STACK`] candidates are kept on the stack for the tie draw
    /// (beyond that, the tie pass prices again), so a pick allocates nothing. With fleet pricing,
    /// ties holding the deepest cached prefix are drawn first (hysteresis, [`super::fleet_cost`]).
    pub fn pick(&self, view: &impl View, entropy: u64) -> Option<usize> {
        let n = view.len();
        let fleet = match self.fleet_pricing {
            FleetPricing::Aware => FleetCtx::of(view, |v, i| self.held(v, i)),
            FleetPricing::Blind => FleetCtx::NONE,
        };
        let fleet = if fleet.active() {
            fleet
        } else {
            FleetCtx::NONE
        };
        let mut prices = [f64::INFINITY; PRICED_ON_STACK];
        let (mut best, mut best_i) = (f64::INFINITY, None);
        for i in 0..n {
            if !view.available(i) {
                continue;
            }
            let t = self.cost_s(view, i, &fleet);
            if let Some(slot) = prices.get_mut(i) {
                *slot = t;
            }
            if t < best {
                (best, best_i) = (t, Some(i));
            }
        }
        if !best.is_finite() {
            return (0..n).find(|&i| view.available(i)); // no price (NaN input): any available
        }
        let band = self.tie_band(best);
        let within = |i: usize| match prices.get(i) {
            Some(&t) => t <= band, // unavailable candidates kept +inf
            None => view.available(i) && self.cost_s(view, i, &fleet) <= band,
        };
        // Reservoir sampling over the ties (and, with fleet pricing, over the ties holding the
        // deepest prefix): each is drawn with equal chance, with no allocation.
        let (mut any, mut held) = (Reservoir::default(), Reservoir::default());
        for i in (0..n).filter(|&i| within(i)) {
            any.offer(i, entropy);
            if fleet.max_cached > 0 && self.held(view, i) >= fleet.max_cached {
                held.offer(i, entropy);
            }
        }
        // Beyond the stack the tie pass prices again, and a price that moved meanwhile (a
        // snapshot or a dispatch in between) can leave the band empty: the best stands then.
        held.chosen.or(any.chosen).or(best_i)
    }
}

/// One uniform draw over a stream of candidates, without storing them.
#[derive(Default)]
struct Reservoir {
    chosen: Option<usize>,
    seen: u64,
}

impl Reservoir {
    #[inline]
    fn offer(&mut self, i: usize, entropy: u64) {
        self.seen += 1;
        if mix(entropy ^ self.seen.wrapping_mul(0x2545_f491_4f6c_dd1d)).is_multiple_of(self.seen) {
            self.chosen = Some(i);
        }
    }
}

/// Candidates whose prices a pick keeps on the stack (8 KiB).
pub const PRICED_ON_STACK: usize = 1024;
