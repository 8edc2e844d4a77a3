//! The bound: a family of oracle routers (simulation only), each with perfect knowledge of every
//! engine's scheduler, and the best of them per metric is what no production policy should beat.
//!
//! Why a family and not one oracle: the greedy one ([`clairvoyant`], soonest first token for this
//! request) is the best choice per request and can be a bad one for the fleet. Near saturation a
//! session whose holder is briefly busier moves, recomputes its whole history elsewhere, and that
//! recompute takes capacity from everyone, so more sessions move; greedy collapses there and a
//! production policy that keeps locality beats it. No single rule is best on every workload and
//! load, so the bound runs several and takes, per metric, the best ([`ORACLES`]).
//!
//! * [`Oracle::Greedy`]: the clairvoyant router, unchanged.
//! * [`Oracle::Sticky`]: locality first. The **holder** is the engine that has, or will have once
//!   the requests it holds finish, the longest prefix of the prompt cached
//!   ([`SimEngine::will_match`]: exact, from the engine's own cache and queues). A request leaves
//!   its holder h for engine o only when o's exact first token beats h's by more than κ × the
//!   exact seconds o spends recomputing what h has and o has not:
//!   `ttft_o + κ·(m_h − m_o)·s_o < ttft_h` (m: matched tokens, s_o: o's prefill µs per token);
//!   among the engines that qualify it takes the lowest `ttft_o + κ·(m_h − m_o)·s_o`. κ = 1 moves
//!   only when the request itself gains more than the recompute; κ = 4 charges the recompute as
//!   the queueing it inflicts on others near saturation; κ = ∞ never leaves a holder. Without a
//!   holder (nothing of the prompt anywhere) it is greedy. Tied holders: the soonest of them.
//!
//! * [`Oracle::Priced`]: the lowest exact TTFT plus the rest of `min_ttft`'s price: the
//!   per-request weight of the requests running or waiting there (`REQUEST_TOKENS_WEIGHT` tokens
//!   of prefill each: the batch the request will share, which its own first token does not see)
//!   and the fleet's seconds `min_ttft --fleet-pricing aware` charges a placement
//!   ([`FleetCtx::extra_s`]: the recompute it causes, at the congestion externality `M(ρ̃)` of
//!   the engine's utilisation as the routers' books measure it), with the exact will-be-cached
//!   prefixes (no eviction regret: see [`Sim::fleet_seconds`]) and the home only where the
//!   replica's tail-reuse meter expects the tail to be reused (the meter learns from the oracle's
//!   own placements). It is the production policy's own pricing on an exact TTFT, so a production
//!   policy that beats the bound does it by predicting worse, which an oracle must not lose to.
//! * [`Oracle::Lookahead`]: where greedy's engine g and the holder h differ, it rolls the fleet
//!   forward both ways over the window the decision weighs on — the time h's queue takes to serve
//!   the request (its exact TTFT there, the longer of the two), at most
//!   [`lookahead::MAX_WINDOW_S`] — with the window's known arrivals, and keeps the choice whose
//!   window costs less ([`lookahead`]: summed TTFT plus the queue debt left at its end). Elsewhere
//!   it is greedy (which then is a holder, or there is none).
//!
//! * [`Oracle::Marginal`]: the least it adds to the summed first-token time of every request
//!   owed one on the engine, its own included ([`super::marginal`]). The others price only this
//!   request's first token; SGLang's longest-prefix-first queue lets a request whose prefix an
//!   engine holds pass the requests waiting there, and what that costs them is what the wait tail
//!   is made of past cache-blind capacity.
//! * [`Oracle::Rule`]: `min_ttft`'s whole decision rule on exact inputs: Priced's price plus
//!   the penalty of a nearly full pool (the engine's exact `token_usage`), then every engine
//!   within the tie band of the best is a tie, the ties holding the deepest prefix go first, and
//!   one of them is drawn. An engine **holds what it has cached now** (what its KV events tell
//!   the routers), not what it will have: every other member counts a prefix as held from the
//!   moment its first request is queued, so a group's next requests all follow that one queue,
//!   no second copy is ever made, and a transient on the one holder has nowhere to spill. That
//!   lock-in is why the exact members swung between 0.05 s and seconds of p99 at GSP 1.05 while
//!   `min_ttft` held 0.09 s (measured: the rule holding the will-be-cached prefix reads 1.8 s
//!   there, holding the cached one 0.063 s).
//! * [`Oracle::Queue`]: the same rule on the engines' exact *state* instead of a fork: each
//!   engine's exact queued prefill plus the prompt's uncached part, at its prefill speed. It is
//!   `min_ttft` with perfect information (no publish delay, no approximate tree), so a production
//!   policy that beats it gains from its view's error, which the bound must not lose to; it costs
//!   no fork, so it runs over every point of a sweep.
//!
//! Forks are bounded as in [`clairvoyant`]: an engine whose recompute charge alone reaches the
//! best cost so far is not forked, and a fork stops once it cannot beat that cost, so Sticky costs
//! at most what Greedy does and Sticky(∞) forks only when there is no single holder.

use super::clairvoyant::{self, Hashed, first_token_within, soonest};
use super::engine::SimEngine;
use super::lookahead::{self, Window};
use super::{DirectTarget, Sim, SimRouter};
use loadlink_engine::model::{ModelConfig, Submit};
use loadlink_engine::radix::PageChain;
use loadlink_router::book::REQUEST_TOKENS_WEIGHT;
use loadlink_router::fleet::FleetView;
use loadlink_router::policy::fleet_cost::FleetCtx;
use loadlink_router::policy::{MinTtft, mix};

/// One oracle router of the family (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Oracle {
    /// The soonest first token for each request ([`SimRouter::Clairvoyant`]).
    Greedy,
    /// The holder of the prompt's longest (will-be-)cached prefix, unless another engine's first
    /// token beats it by more than `kappa` × the recompute the move causes (`f64::INFINITY`:
    /// never leave a holder).
    Sticky { kappa: f64 },
    /// The lowest exact TTFT plus the rest of `min_ttft`'s price: the per-request weight of the
    /// requests there, and the seconds `--fleet-pricing aware` charges the fleet for the
    /// placement (the recompute it causes at the congestion externality, read from the routers'
    /// books): the production pricing on an exact TTFT.
    Priced,
    /// Greedy, except where greedy's engine is not the holder: then the better of the two by a
    /// rollout of the fleet over the window with its known arrivals ([`lookahead`]).
    Lookahead,
    /// The least added summed TTFT of everyone owed a first token on the engine, this request's
    /// own included ([`marginal`]).
    Marginal,
    /// `min_ttft`'s whole rule on exact inputs: [`Oracle::Priced`]'s price plus the KV-pressure
    /// penalty of the engine's exact pool usage, then the tie band, the holders of the deepest
    /// prefix first within it, and the draw among them; an engine holds what it has cached now.
    Rule,
    /// `min_ttft`'s rule on the engines' exact state rather than their published one: the
    /// exact queued prefill and requests, the prefix cached now, the pool's usage; no fork.
    Queue,
}

/// The family the bound is the per-metric best of, with the labels sweeps print.
pub const ORACLES: [(&str, SimRouter); 11] = [
    ("oracle greedy", SimRouter::Oracle(Oracle::Greedy)),
    (
        "oracle sticky k=1",
        SimRouter::Oracle(Oracle::Sticky { kappa: 1.0 }),
    ),
    (
        "oracle sticky k=4",
        SimRouter::Oracle(Oracle::Sticky { kappa: 4.0 }),
    ),
    (
        "oracle sticky k=16",
        SimRouter::Oracle(Oracle::Sticky { kappa: 16.0 }),
    ),
    (
        "oracle sticky k=64",
        SimRouter::Oracle(Oracle::Sticky { kappa: 64.0 }),
    ),
    (
        "oracle sticky k=inf",
        SimRouter::Oracle(Oracle::Sticky {
            kappa: f64::INFINITY,
        }),
    ),
    ("oracle priced", SimRouter::Oracle(Oracle::Priced)),
    ("oracle lookahead", SimRouter::Oracle(Oracle::Lookahead)),
    ("oracle marginal", SimRouter::Oracle(Oracle::Marginal)),
    ("oracle rule", SimRouter::Oracle(Oracle::Rule)),
    ("oracle queue", SimRouter::Oracle(Oracle::Queue)),
];

/// Per arrival, its prompt's page chain at the fleet's first page size, hashed once when a
/// lookahead window first needs it (empty: a prompt known only by its length).
#[derive(Default)]
pub(crate) struct ChainMemo(Vec<Option<PageChain>>);

impl Sim<'_> {
    /// The unit `oracle` sends routed request `i` to at `t`.
    pub(super) fn oracle_pick(
        &mut self,
        oracle: Oracle,
        i: usize,
        submit: &Submit,
        t: f64,
    ) -> usize {
        self.out.decisions += 1;
        let p = Hashed::new(submit, &self.engines);
        if matches!(oracle, Oracle::Priced | Oracle::Rule | Oracle::Queue) {
            let rule = (oracle != Oracle::Priced).then(MinTtft::default);
            // Priced holds what will be cached; the rule holds what is, as `min_ttft` does.
            let future = oracle == Oracle::Priced;
            let (mut extra, deepest) = self.fleet_seconds(i, &p, t, future);
            // The rest of the production price: each running or waiting request weighs
            // `REQUEST_TOKENS_WEIGHT` tokens of prefill there (the batch slots and decode steps
            // this request will share), which an exact first token does not see; and, for the
            // whole rule, the penalty of a nearly full pool.
            for (x, e) in extra.iter_mut().zip(&self.engines) {
                let requests = (e.num_running() + e.num_waiting()) as f64;
                *x += requests * recompute_s_of(e.model(), REQUEST_TOKENS_WEIGHT as u64);
                *x += rule
                    .as_ref()
                    .map_or(0.0, |r| r.kv_penalty_s(e.token_usage()));
            }
            let pick = match (oracle, &rule) {
                (Oracle::Queue, Some(r)) => queue_pick(&self.engines, &p, &extra, r, i as u64),
                _ => priced(&self.engines, &p, t, &extra, rule.as_ref(), i as u64),
            };
            // The replica's tail-reuse meter learns from the oracle's placements as it does from
            // the production policy's ([`super::cache::RouterCache::dispatched`]).
            let r = i % self.caches.len().max(1);
            if let (Some((chain, page)), Some(c)) =
                (meter_chain(&self.engines, &p), self.caches.get(r))
            {
                c.reuse().record(chain, page, deepest, super::ms(t));
            }
            return pick;
        }
        if oracle != Oracle::Lookahead {
            return pick(oracle, &self.engines, &p, t);
        }
        let Some((h, th, g)) = holder_or_sooner(&self.engines, &p, t, &|_| 0.0) else {
            return clairvoyant::pick(&self.engines, &p, t);
        };
        let Some(g) = g else {
            return h; // greedy's engine is a holder
        };
        let window_s = th.min(lookahead::MAX_WINDOW_S);
        let later = self.arrivals[i + 1..].iter();
        let end = later.take_while(|a| a.t <= t + window_s).count();
        let arrivals = &self.arrivals[i + 1..i + 1 + end];
        let page = self.engines.first().map_or(16, |e| e.model().page_size);
        let memo = &mut self.chains.0;
        memo.resize(memo.len().max(self.arrivals.len()), None);
        for (k, a) in arrivals.iter().enumerate() {
            memo[i + 1 + k].get_or_insert_with(|| match a.prompt.as_deref() {
                Some(tokens) if !tokens.is_empty() => {
                    PageChain::of(&tokens[..tokens.len() - 1], page)
                }
                _ => PageChain::default(),
            });
        }
        let chains: Vec<&PageChain> = (memo[i + 1..i + 1 + end].iter())
            .map(|c| c.as_ref().expect("filled above"))
            .collect();
        let (layout, direct) = (self.layout, self.cfg.direct);
        let direct_unit = |j: usize| match direct {
            DirectTarget::Pinned => 0,
            DirectTarget::Uniform => layout.unit(
                (mix(j as u64 ^ 0xd1ec7) % layout.engines as u64) as usize,
                0,
            ),
        };
        let w = Window {
            arrivals,
            first_index: i + 1,
            page,
            chains: &chains,
            direct_unit: &direct_unit,
        };
        let score = |u| lookahead::score(&self.engines, &p, u, t, window_s, &w);
        if score(g) < score(h) { g } else { h }
    }

    /// Per unit, the fleet's seconds `min_ttft` charges for placing `p` there
    /// ([`FleetCtx::extra_s`]), on request `i`'s router replica's books and tail-reuse meter at
    /// `t` and the exact will-be-cached prefixes (0 everywhere while no utilisation is known);
    /// and the deepest of those prefixes, tokens.
    fn fleet_seconds(&self, i: usize, p: &Hashed<'_>, t: f64, future: bool) -> (Vec<f64>, u64) {
        let r = i % self.books.len().max(1);
        let m = held(&self.engines, p, future);
        // The books are per engine; a unit stands for its engine (its deepest rank's prefix).
        let mut cached = vec![0u64; self.books[r].len()];
        for (u, &mu) in m.iter().enumerate() {
            let e = self.layout.engine_of(u);
            if let Some(c) = cached.get_mut(e) {
                *c = (*c).max(mu);
            }
        }
        let prompt = p.submit.prompt_tokens;
        // No eviction regret: the simulator's router caches fill it per lookup, and an oracle
        // looks nothing up, so the pollution term stays 0 here (the recompute term is exact).
        let mut view = FleetView::new(&self.books[r], self.cfg.signal, self.cfg.freshness_ms)
            .with_prefix(prompt, &cached);
        if let (Some((chain, page)), Some(c)) = (meter_chain(&self.engines, p), self.caches.get(r))
        {
            view = view.with_reuse(c.reuse()).with_chain(chain, page);
        }
        view.now_ms = super::ms(t);
        let ctx = FleetCtx::of(&view, |v, e| {
            loadlink_router::policy::View::cached_tokens(v, e)
        });
        let extra = (0..self.engines.len())
            .map(|u| {
                let s_tok = recompute_s(&self.engines[u], 1);
                let e = self.layout.engine_of(u);
                ctx.extra_s(&view, e, prompt, m[u], s_tok)
            })
            .collect();
        (extra, m.iter().copied().max().unwrap_or(0))
    }
}

/// The prompt's page hashes at the fleet's first page size and that size: what the routers'
/// tail-reuse meters key on (`None`: a prompt known only by its length).
fn meter_chain<'p>(engines: &[SimEngine], p: &'p Hashed<'_>) -> Option<(&'p [i64], u64)> {
    let page = engines.first()?.model().page_size;
    p.chain(page).map(|c| (c.hashes.as_slice(), page as u64))
}

/// The engine minimising its exact TTFT plus `extra` seconds (the engines holding most of the
/// prompt forked first). Without a `rule`, ties rotate with the request id; with one, as
/// [`banded`].
pub(crate) fn priced(
    engines: &[SimEngine],
    p: &Hashed<'_>,
    now: f64,
    extra: &[f64],
    rule: Option<&MinTtft>,
    entropy: u64,
) -> usize {
    let ttft = |o: usize, _: u64, limit: f64| first_token_within(&engines[o], p, now, limit);
    banded(engines, p, extra, rule, entropy, ttft)
}

/// The engine minimising `time(engine, the prompt tokens it holds, limit)` plus `extra` seconds
/// (`time` may answer infinity once it reaches `limit`; the engines holding most of the prompt
/// are priced first). Without a `rule`, an engine holds what it will have cached, and the strict
/// minimum wins, ties rotating with the request id. With one, it holds what it has cached now
/// (as `min_ttft`'s KV index sees it), every engine within the tie band of the best is a tie,
/// and the draw (`entropy`) takes one of the ties holding the deepest prefix, else one of all
/// the ties, as `min_ttft` does.
fn banded(
    engines: &[SimEngine],
    p: &Hashed<'_>,
    extra: &[f64],
    rule: Option<&MinTtft>,
    entropy: u64,
    time: impl Fn(usize, u64, f64) -> f64,
) -> usize {
    let n = engines.len().max(1);
    let start = (p.submit.id % n as u64) as usize;
    let m = held(engines, p, rule.is_none());
    let rot = |e: usize| (e + n - start) % n;
    let mut order: Vec<usize> = (0..engines.len()).collect();
    order.sort_unstable_by_key(|&e| (std::cmp::Reverse(m[e]), rot(e)));
    let band = |best: f64| match rule {
        Some(r) => r.tie_band(best),
        None => best,
    };
    let mut best: (f64, Option<usize>) = (f64::INFINITY, None);
    let mut costs = vec![f64::INFINITY; engines.len()];
    for o in order {
        let charge = extra.get(o).copied().unwrap_or(0.0);
        let limit = band(best.0);
        if charge > limit || (rule.is_none() && charge >= limit) {
            continue; // even an instant first token would not pay for it
        }
        let t = time(o, m[o], limit - charge) + charge;
        costs[o] = t;
        let tie_first = t == best.0 && best.1.is_some_and(|b| rot(o) < rot(b));
        if t < best.0 || tie_first {
            best = (t, Some(o));
        }
    }
    if rule.is_none() || !best.0.is_finite() {
        return best.1.unwrap_or(start);
    }
    let limit = band(best.0);
    let ties: Vec<usize> = (0..engines.len()).filter(|&e| costs[e] <= limit).collect();
    let top = m.iter().copied().max().unwrap_or(0);
    let held: Vec<usize> = (ties.iter().copied())
        .filter(|&e| top > 0 && m[e] == top)
        .collect();
    let pool = if held.is_empty() { &ties } else { &held };
    pool.get((mix(entropy) % pool.len().max(1) as u64) as usize)
        .copied()
        .or(best.1)
        .unwrap_or(start)
}

/// [`Oracle::Queue`]'s pick: `min_ttft`'s rule with each engine's exact queue in place of its
/// published one (`extra` holds the rest of the price).
pub(crate) fn queue_pick(
    engines: &[SimEngine],
    p: &Hashed<'_>,
    extra: &[f64],
    rule: &MinTtft,
    entropy: u64,
) -> usize {
    let prompt = p.submit.prompt_tokens;
    let queue = |o: usize, m: u64, _: f64| {
        let e = &engines[o];
        recompute_s(e, e.queued_uncached_tokens() + prompt.saturating_sub(m))
    };
    banded(engines, p, extra, Some(rule), entropy, queue)
}

/// The engine (scheduler unit) `oracle` sends `submit` to at `now`.
pub(crate) fn pick(oracle: Oracle, engines: &[SimEngine], p: &Hashed<'_>, now: f64) -> usize {
    match oracle {
        Oracle::Greedy => clairvoyant::pick(engines, p, now),
        Oracle::Sticky { kappa } => sticky(engines, p, now, kappa),
        Oracle::Marginal => super::marginal::pick(engines, p, now),
        // Without the routers' books or the future arrivals (a caller outside the simulation):
        // greedy.
        Oracle::Priced | Oracle::Lookahead | Oracle::Rule | Oracle::Queue => {
            clairvoyant::pick(engines, p, now)
        }
    }
}

/// Per engine, the prompt tokens it holds: those it has cached now ([`SimEngine::cached_match`])
/// or, `future`, also those it will have cached once the requests it holds are computed
/// ([`matches`]).
pub(crate) fn held(engines: &[SimEngine], p: &Hashed<'_>, future: bool) -> Vec<u64> {
    if future {
        return matches(engines, p);
    }
    let chain = |e: &SimEngine| p.chain(e.model().page_size);
    (engines.iter())
        .map(|e| chain(e).map_or(0, |c| e.cached_match(c)))
        .collect()
}

/// Per engine, the prompt tokens it has or will have cached ([`SimEngine::will_match`]); all 0
/// for a prompt known only by its length.
pub(crate) fn matches(engines: &[SimEngine], p: &Hashed<'_>) -> Vec<u64> {
    let chain = |e: &SimEngine| p.chain(e.model().page_size);

    (engines.iter())
        .map(|e| chain(e).map_or(0, |c| e.will_match(c)))
        .collect()
}

/// Seconds engine `e` spends prefilling `tokens` tokens.
pub(crate) fn recompute_s(e: &SimEngine, tokens: u64) -> f64 {
    recompute_s_of(e.model(), tokens)
}

/// Seconds an engine of `model` spends prefilling `tokens` tokens.
pub(crate) fn recompute_s_of(model: &ModelConfig, tokens: u64) -> f64 {
    tokens as f64 * model.timing.per_prefill_token_us * 1e-6
}

/// The holder h (the soonest of the engines with the deepest will-be-cached prefix), its exact
/// TTFT, and the engine o minimising `ttft_o + kappa(o) × recompute_o` if that beats h's TTFT
/// (`None`: h stays best). `None` when no engine holds any of the prompt.
fn holder_or_sooner(
    engines: &[SimEngine],
    p: &Hashed<'_>,
    now: f64,
    kappa: &dyn Fn(usize) -> f64,
) -> Option<(usize, f64, Option<usize>)> {
    let m = matches(engines, p);
    let top = m.iter().copied().max().filter(|&t| t > 0)?;
    let holders = (0..engines.len()).filter(|&e| m[e] == top);
    let n = engines.len().max(1);
    let start = (p.submit.id % n as u64) as usize;
    let first_holder = (0..n).map(|k| (start + k) % n).find(|&e| m[e] == top)?;
    let (th, h) = soonest(engines, holders, p, now, (f64::INFINITY, None))
        .unwrap_or((f64::INFINITY, first_holder));
    let mut best = (th, None);
    for o in (0..engines.len()).map(|k| (start + k) % n) {
        if m[o] == top {
            continue;
        }
        let charge = kappa(o) * recompute_s(&engines[o], top - m[o]);
        if charge >= best.0 {
            continue; // even an instant first token would not pay for the move
        }
        let t = first_token_within(&engines[o], p, now, best.0 - charge);
        if t + charge < best.0 {
            best = (t + charge, Some(o));
        }
    }
    Some((h, th, best.1))
}

fn sticky(engines: &[SimEngine], p: &Hashed<'_>, now: f64, kappa: f64) -> usize {
    if kappa == f64::INFINITY {
        let m = matches(engines, p);
        let top = m.iter().copied().max().unwrap_or(0);
        let mut holders = (0..engines.len()).filter(|&e| top > 0 && m[e] == top);
        if let (Some(h), None) = (holders.next(), holders.next()) {
            return h; // the one holder: no fork needed
        }
    }
    match holder_or_sooner(engines, p, now, &|_| kappa) {
        None => clairvoyant::pick(engines, p, now),
        Some((h, _, moved)) => moved.unwrap_or(h),
    }
}
