//! What a placement costs the rest of the fleet (`min_ttft --fleet-pricing aware`): the part of
//! a request's price that its own time to first token does not show.
//!
//! **Why.** Sending a request away from the worker that caches its prefix makes another worker
//! recompute that prefix. The request may still get its first token sooner, but the recompute is
//! capacity taken from every other request; near saturation that capacity is what keeps queues
//! short, so holders get busier, more requests move and recompute, and the fleet falls into a
//! state where nobody hits the cache (a metastable failure: it persists after the load that caused
//! it has gone). Pricing only this request's TTFT is greedy; the fleet needs the externality.
//!
//! **The externality.** One more second of work on a queue at utilisation ρ adds
//! `M(ρ) = ρ / (1 − ρ)²` seconds of waiting to the other requests (the congestion cost of an M/M/1
//! queue, Naor 1969: the derivative of the queue's total waiting in its load). It is about ρ at
//! low load, so the policy stays as greedy as the plain TTFT there, and it grows without bound
//! near saturation, where protecting locality is what keeps capacity. Engines do not share work,
//! so the recompute lands in the chosen worker's own queue: a per-queue M/M/1, not M/M/c. Service
//! times here are far from exponential, but the Pollaczek–Khinchine factor `(1 + c²) / 2` of
//! log-normal prompts of σ 0.8 is 0.95, within 5% of 1: no constant to fit.
//!
//! **The work a placement adds**, over what the request costs anyway: the prefix the deepest
//! holder among the candidates has cached and this worker has not, `Δu(i) = c_max − c(i)`
//! tokens, at the worker's measured prefill speed. A prefix nobody caches is work wherever the
//! request goes, so it is not the placement's doing; without any hit the term is 0 everywhere and
//! the policy is exactly the plain TTFT (S0–S2 unchanged by construction).
//!
//! **Which ρ.** A worker's own utilisation ρ(i) (from its engine's published counters, smoothed by
//! the book), floored at the fleet's capacity-weighted mean ρ̄: a less busy worker's headroom is
//! what every other request would use, so taking it costs at least the fleet's price (the failure
//! above is exactly "move to the briefly less busy worker"); a worker above the mean pays its own.
//! Unknown ρ (stale load, an engine that publishes no counters) prices 0: today's behaviour.
//!
//! **Pollution.** A copy that does not fit the worker's free KV pool evicts other prefixes; the
//! share of that pool's evictions that were needed again ([`View::eviction_regret`]) will be
//! recomputed later, which is work at the same price: `(1 + M) · evicted · regret · s`.
//!
//! **Hysteresis.** Among the candidates within the tie band, the ones holding the deepest prefix
//! are preferred: a session (or a prefix group) moves only when the move gains more than the band
//! and the recompute it causes, so placements do not flap between near-equal prices. The router
//! keeps no session table: the holder of a request's deepest cached prefix stands for its session.

use super::View;

/// Utilisation above which the externality is no longer growing: a queue at 99% is saturated
/// whatever the estimate's noise says (and `M` stays finite).
pub const RHO_CAP: f64 = 0.99;

/// Seconds of others' waiting that one second of added work costs on a queue at utilisation `rho`.
#[inline]
pub fn externality(rho: f64) -> f64 {
    let r = rho.clamp(0.0, RHO_CAP);
    r / ((1.0 - r) * (1.0 - r))
}

/// What the fleet term needs of the whole candidate set, read once per pick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FleetCtx {
    /// The deepest prefix any available candidate caches, tokens.
    pub max_cached: u64,
    /// The fleet's utilisation: the mean of the known ρ, weighted by prefill speed (capacity).
    pub rho_bar: Option<f64>,
}

impl FleetCtx {
    /// No fleet term (fleet pricing blind).
    pub const NONE: FleetCtx = FleetCtx {
        max_cached: 0,
        rho_bar: None,
    };

    /// One pass over the available candidates.
    #[inline]
    pub fn of(view: &impl View) -> Self {
        let (mut max_cached, mut num, mut den) = (0u64, 0.0, 0.0);
        for i in 0..view.len() {
            if !view.available(i) {
                continue;
            }
            max_cached = max_cached.max(view.cached_tokens(i));
            if let Some(rho) = view.utilisation(i) {
                let w = 1.0 / view.prefill_s_per_token(i).max(1e-12);
                num += rho * w;
                den += w;
            }
        }
        FleetCtx {
            max_cached,
            rho_bar: (den > 0.0).then(|| num / den),
        }
    }

    /// Whether there is anything to price: some candidate caches something and some ρ is known.
    #[inline]
    pub fn active(&self) -> bool {
        self.max_cached > 0 && self.rho_bar.is_some()
    }

    /// The fleet's seconds of candidate `i`: the recompute it causes and the evictions it
    /// regrets, at the externality of its utilisation (floored at the fleet's). `prompt` and
    /// `cached` as the TTFT term saw them.
    #[inline]
    pub fn extra_s(&self, view: &impl View, i: usize, prompt: u64, cached: u64, s_tok: f64) -> f64 {
        let (Some(rho_bar), Some(rho)) = (self.rho_bar, view.utilisation(i)) else {
            return 0.0;
        };
        let m = externality(rho.max(rho_bar));
        let moved = self.max_cached.min(prompt).saturating_sub(cached);
        let mut work = moved as f64;
        let regret = view.eviction_regret(i);
        if regret > 0.0 {
            if let Some(free) = view.free_pool_tokens(i) {
                let evicted = (prompt - cached.min(prompt)).saturating_sub(free);
                work += evicted as f64 * regret.min(1.0) * (1.0 + 1.0 / m.max(1e-9));
            }
        }
        m * work * s_tok
    }
}
