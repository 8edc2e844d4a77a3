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
//! Forks are bounded as in [`clairvoyant`]: an engine whose recompute charge alone reaches the
//! best cost so far is not forked, and a fork stops once it cannot beat that cost, so Sticky costs
//! at most what Greedy does and Sticky(∞) forks only when there is no single holder.

use super::SimRouter;
use super::clairvoyant::{self, first_token_within};
use super::engine::SimEngine;
use loadlink_engine::model::Submit;
use loadlink_engine::radix::PageChain;

/// One oracle router of the family (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Oracle {
    /// The soonest first token for each request ([`SimRouter::Clairvoyant`]).
    Greedy,
    /// The holder of the prompt's longest (will-be-)cached prefix, unless another engine's first
    /// token beats it by more than `kappa` × the recompute the move causes (`f64::INFINITY`:
    /// never leave a holder).
    Sticky { kappa: f64 },
}

/// The family the bound is the per-metric best of, with the labels sweeps print.
pub const ORACLES: [(&str, SimRouter); 4] = [
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
        "oracle sticky k=inf",
        SimRouter::Oracle(Oracle::Sticky {
            kappa: f64::INFINITY,
        }),
    ),
];

/// The engine (scheduler unit) `oracle` sends `submit` to at `now`.
pub(crate) fn pick(oracle: Oracle, engines: &[SimEngine], submit: &Submit, now: f64) -> usize {
    match oracle {
        Oracle::Greedy => clairvoyant::pick(engines, submit, now),
        Oracle::Sticky { kappa } => sticky(engines, submit, now, kappa),
    }
}

/// Per engine, the prompt tokens it has or will have cached ([`SimEngine::will_match`]); all 0
/// for a prompt known only by its length.
pub(crate) fn matches(engines: &[SimEngine], submit: &Submit) -> Vec<u64> {
    let Some(tokens) = submit.prompt.as_deref().filter(|p| !p.is_empty()) else {
        return vec![0; engines.len()];
    };
    let hashed = &tokens[..tokens.len() - 1]; // the engine computes the last token always
    let mut chains: Vec<(usize, PageChain)> = Vec::with_capacity(1);
    engines
        .iter()
        .map(|e| {
            let page = e.model().page_size;
            let k = match chains.iter().position(|(p, _)| *p == page) {
                Some(k) => k,
                None => {
                    let ns = submit.namespace.clone();
                    chains.push((page, PageChain::in_namespace(hashed, page, ns)));
                    chains.len() - 1
                }
            };
            e.will_match(&chains[k].1)
        })
        .collect()
}

/// Seconds engine `e` spends prefilling `tokens` tokens.
pub(crate) fn recompute_s(e: &SimEngine, tokens: u64) -> f64 {
    tokens as f64 * e.model().timing.per_prefill_token_us * 1e-6
}

fn sticky(engines: &[SimEngine], submit: &Submit, now: f64, kappa: f64) -> usize {
    let m = matches(engines, submit);
    let top = m.iter().copied().max().unwrap_or(0);
    if top == 0 {
        return clairvoyant::pick(engines, submit, now);
    }
    let holders = (0..engines.len()).filter(|&e| m[e] == top);
    if kappa == f64::INFINITY && holders.clone().count() == 1 {
        return m.iter().position(|&x| x == top).unwrap_or(0);
    }
    let mut best = clairvoyant::pick_among(engines, holders, submit, now);
    if kappa == f64::INFINITY {
        return best.1;
    }
    let n = engines.len().max(1);
    let start = (submit.id % n as u64) as usize;
    for o in (0..engines.len()).map(|k| (start + k) % n) {
        if m[o] == top {
            continue;
        }
        let charge = kappa * recompute_s(&engines[o], top - m[o]);
        if charge >= best.0 {
            continue; // even an instant first token would not pay for the move
        }
        let t = first_token_within(&engines[o], submit, now, best.0 - charge);
        if t + charge < best.0 {
            best = (t + charge, o);
        }
    }
    best.1
}
