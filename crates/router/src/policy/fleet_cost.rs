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
//! **Which ρ.** A worker's own utilisation ρ(i): the share of time its prefill is busy, since a
//! recompute delays the first tokens queued behind it and the engine schedules prefill first (1
//! while its queue does not drain, whatever the bottleneck; from its engine's published counters,
//! smoothed by the book, [`crate::book::utilisation`]), floored at the fleet's capacity-weighted mean ρ̄: a less busy worker's headroom is
//! what every other request would use, so taking it costs at least the fleet's price (the failure
//! above is exactly "move to the briefly less busy worker"); a worker above the mean pays its own.
//! Unknown ρ (stale load, an engine that publishes no counters) prices 0: today's behaviour.
//!
//! **Pollution.** A copy that does not fit the worker's free KV pool evicts other prefixes; the
//! share of that pool's evictions that were needed again ([`View::eviction_regret`]) will be
//! recomputed later, which is work at the same price: `(1 + M) · evicted · regret · s`.
//!
//! **Home.** The part of the prompt nobody caches yet (its tail) is where the next requests
//! extending it will want it. Near saturation those often arrive before this one is prefilled and
//! indexed, through other replicas that see no holder yet, and a replica that sends each to the
//! least busy worker scatters one session over the fleet, each copy recomputing its history (the
//! same collapse, started from a cold cache or a burst instead of a brief imbalance). So the
//! replicas agree on a home without talking: of the candidates holding the deepest prefix, the
//! one with the highest hash of (the prompt's first uncached page, the worker's URL and rank), a
//! rendezvous hash that every replica computes alike and that is the same for every request
//! extending the same prefix. Anywhere else, that uncached part is priced as moved work too: an
//! upper bound on the duplicate (it assumes the next request comes before this one is indexed),
//! negligible at low load, where `M` is. Where the holder is unique, it is the home.
//!
//! **Only where tails get reused** ([`View::tail_reused`], the router's
//! [`crate::cache::TailReuse`]). Where no request ever extends a tail (a prefix group's
//! questions), the home is a random per-request preference, and near saturation `M` turns it into
//! a wall that holds requests on busier workers: no home then. With nothing cached, a prompt
//! whose first page another request began recently has a home among all candidates (the cold
//! start of a group or an agent kind), so the first requests of a prefix are computed once.
//!
//! **Hysteresis.** Among the candidates within the tie band, the ones holding the deepest prefix
//! are preferred: a session (or a prefix group) moves only when the move gains more than the band
//! and the recompute it causes, so placements do not flap between near-equal prices. The router
//! keeps no session table: the holder of a request's deepest cached prefix stands for its session.

use super::{View, mix};

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
    /// Where the part of the prompt nobody caches belongs: of the candidates holding the deepest
    /// prefix, the one every replica picks for this prompt (rendezvous hashing of its first
    /// uncached page); `None` when the request's pages are unknown, or when that part is not
    /// likely to be wanted again before it is indexed ([`View::tail_reused`]).
    pub home: Option<usize>,
}

impl FleetCtx {
    /// No fleet term (fleet pricing blind).
    pub const NONE: FleetCtx = FleetCtx {
        max_cached: 0,
        rho_bar: None,
        home: None,
    };

    /// One pass over the available candidates; `held(i)` is what candidate i holds of the prompt
    /// (the cached tokens the TTFT term counts as hits).
    #[inline]
    pub fn of<V: View>(view: &V, held: impl Fn(&V, usize) -> u64) -> Self {
        let (mut max_cached, mut deepest_any, mut num, mut den) = (0u64, 0u64, 0.0, 0.0);
        for i in 0..view.len() {
            // What the index holds anywhere, as the router records it after the pick.
            deepest_any = deepest_any.max(view.cached_tokens(i));
            if !view.available(i) {
                continue;
            }
            max_cached = max_cached.max(held(view, i));
            if let Some(rho) = view.utilisation(i) {
                let w = 1.0 / view.prefill_s_per_token(i).max(1e-12);
                num += rho * w;
                den += w;
            }
        }
        let home = match view.tail_reused(deepest_any) {
            true => view.prefix_key(max_cached).and_then(|key| {
                let holders =
                    (0..view.len()).filter(|&i| view.available(i) && held(view, i) >= max_cached);
                holders.max_by_key(|&i| mix(key ^ view.worker_key(i)))
            }),
            false => None,
        };
        FleetCtx {
            max_cached,
            rho_bar: (den > 0.0).then(|| num / den),
            home,
        }
    }

    /// Whether there is anything to price: some ρ is known, and some candidate caches something
    /// or the request has a home.
    #[inline]
    pub fn active(&self) -> bool {
        self.rho_bar.is_some() && (self.max_cached > 0 || self.home.is_some())
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
        let deepest = self.max_cached.min(prompt);
        let moved = deepest.saturating_sub(cached);
        // Away from home, the part nobody caches yet is made where the next requests extending it
        // (placed by other replicas, before this one is indexed) will not look for it.
        let strayed = match self.home {
            Some(h) if h != i => prompt - deepest,
            _ => 0,
        };
        let mut work = (moved + strayed) as f64;
        let regret = view.eviction_regret(i);
        // The pool counts cached pages nobody uses as free; what a copy can fill without evicting
        // is what the index does not hold of it (low by the cached pages running requests pin).
        let room = view
            .free_pool_tokens(i)
            .map(|free| free.saturating_sub(view.cache_size(i)));
        if let (true, Some(room)) = (regret > 0.0, room) {
            let evicted = (prompt - cached.min(prompt)).saturating_sub(room);
            work += evicted as f64 * regret.min(1.0) * (1.0 + 1.0 / m.max(1e-9));
        }
        m * work * s_tok
    }
}
