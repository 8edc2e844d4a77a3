//! The clairvoyant router (simulation only): it sees every engine's exact scheduler state (queue,
//! running batch, prefix cache, a step in progress) and sends each request where its first token
//! comes soonest.
//!
//! How, exactly: for each engine it clones the production `Scheduler`, submits the request as the
//! engine would take it in, and runs the clone forward step by step (the same step function, the
//! same clock) until the request's first token. The prediction is exact **given no later
//! arrivals**: requests that arrive afterwards can still delay it (they may join a prefill batch or
//! a retraction may hit it), and a greedy choice per request is not a global optimum. It is the
//! bound routing alone reaches with perfect information and no knowledge of the future; the
//! family of oracles around it (greedy is one member) is in [`super::oracle`].
//!
//! A fork stops as soon as it can no longer beat the best engine found so far (the step that ends
//! past that time cannot carry a sooner first token), so the pick is the same as running every
//! fork to its first token, at a fraction of the steps near saturation.

use super::engine::SimEngine;
use loadlink_engine::model::{Event, StepKind, Submit};
use loadlink_engine::radix::PageChain;

/// Steps a forward simulation may take before the engine counts as never answering.
pub(crate) const MAX_STEPS: usize = 200_000;

/// A request with its prompt's page chain hashed once for each page size in the fleet: a decision
/// submits the request to a fork of every engine, and hashing the prompt again for each fork cost
/// more than the forks' steps.
pub(crate) struct Hashed<'a> {
    pub submit: &'a Submit,
    chains: Vec<(usize, PageChain)>,
}

impl<'a> Hashed<'a> {
    pub(crate) fn new(submit: &'a Submit, engines: &[SimEngine]) -> Self {
        let mut chains: Vec<(usize, PageChain)> = Vec::with_capacity(1);
        for e in engines {
            let page = e.model().page_size;
            if chains.iter().all(|(p, _)| *p != page) {
                chains.push((page, submit.page_chain(page)));
            }
        }
        Hashed { submit, chains }
    }

    /// The chain at `page` tokens per page (`None`: no engine of that page size was given).
    pub(crate) fn chain(&self, page: usize) -> Option<&PageChain> {
        self.chains.iter().find(|(p, _)| *p == page).map(|(_, c)| c)
    }
}

/// Seconds from `now` to the first token of `submit` on `engine` (the unpruned fork the tests
/// check the routers' pruned ones against).
#[cfg(test)]
pub(crate) fn first_token_in(engine: &SimEngine, submit: &Submit, now: f64) -> f64 {
    let p = Hashed::new(submit, std::slice::from_ref(engine));
    first_token_within(engine, &p, now, f64::INFINITY)
}

/// [`first_token_in`], or infinity once it is known to be `limit` seconds or more.
pub(crate) fn first_token_within(engine: &SimEngine, p: &Hashed<'_>, now: f64, limit: f64) -> f64 {
    let (mut sched, mut t) = engine.fork(now);
    let id = p.submit.id;
    match p.chain(engine.model().page_size) {
        Some(c) => sched.submit_hashed(p.submit.clone(), c.clone()),
        None => sched.submit(p.submit.clone()),
    }
    for _ in 0..MAX_STEPS {
        let step = sched.step(t);
        t += step.duration;
        if step.kind == StepKind::Idle {
            return f64::INFINITY;
        }
        let first = step.events.iter().any(|e| match *e {
            Event::FirstToken { id: i } => i == id,
            Event::Finished { id: i, .. } => i == id,
            Event::Token { .. } => false,
        });
        if first {
            return t - now;
        }
        if t - now >= limit {
            return f64::INFINITY; // its first token comes at a later step's end
        }
    }
    f64::INFINITY
}

/// The engine where `submit`'s first token comes soonest (ties rotate with the request id). The
/// engine holding most of the prompt is forked first: it is usually the soonest, and the forks
/// after it stop as soon as they fall behind it.
pub(crate) fn pick(engines: &[SimEngine], p: &Hashed<'_>, now: f64) -> usize {
    let n = engines.len().max(1);
    let start = (p.submit.id % n as u64) as usize;
    let m = super::oracle::matches(engines, p);
    let rotation = (0..n).map(|k| (start + k) % n);
    let deepest = rotation.max_by_key(|&e| (m.get(e), std::cmp::Reverse((e + n - start) % n)));
    let first = deepest.filter(|&e| m.get(e).is_some_and(|&t| t > 0));
    soonest(engines, 0..engines.len(), p, now, (f64::INFINITY, first)).map_or(start, |b| b.1)
}

/// Of the engines `among`, the one where `submit`'s first token comes soonest and sooner than
/// `limit` seconds from `now`, with that TTFT (ties go to the first in the rotation that starts at
/// the request id); `None` when no engine beats `limit`. Engine `first`, when given, is forked
/// first (the result is the same; the other forks stop sooner when it is a good one).
pub(crate) fn soonest(
    engines: &[SimEngine],
    among: impl IntoIterator<Item = usize>,
    p: &Hashed<'_>,
    now: f64,
    (limit, first): (f64, Option<usize>),
) -> Option<(f64, usize)> {
    let n = engines.len().max(1);
    let start = (p.submit.id % n as u64) as usize;
    let rot = |e: usize| (e + n - start) % n;
    let mut order: Vec<usize> = among.into_iter().collect();
    order.sort_unstable_by_key(|&e| (Some(e) != first, rot(e)));
    let mut best: (f64, Option<usize>) = (limit, None);
    for e in order {
        let t = first_token_within(&engines[e], p, now, best.0);
        let tie_first = t == best.0 && best.1.is_some_and(|b| rot(e) < rot(b));
        if t < best.0 || tie_first {
            best = (t, Some(e));
        }
    }
    best.1.map(|e| (best.0, e))
}
