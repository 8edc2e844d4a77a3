//! The marginal-cost oracle (simulation only): each request goes where it adds the least to the
//! summed time to first token of everyone already there, its own first token included.
//!
//! Why it belongs in the bound's family: every other exact oracle prices a placement by this
//! request's own first token. SGLang's scheduler serves its queue longest-prefix-first, so a
//! request whose prefix an engine holds is admitted ahead of the requests already waiting there:
//! its own first token comes soon, and theirs come later by the time its prefill takes. Near and
//! past cache-blind capacity that cost, borne by others, is the one that sets the wait tail, and
//! an oracle blind to it loses to a production policy that charges the whole queue.
//!
//! How, exactly: for each engine two forks of its scheduler (as [`super::clairvoyant`] makes
//! them) run until every request owed a first token at the fork has it — one fork as it is, one
//! with the request submitted. The marginal cost is the second sum minus the first. As there, the
//! prediction is exact given no later arrivals. A fork with the request stops once its sum cannot
//! beat the best engine so far (every request still owed answers at a step's end or later).

use super::clairvoyant::{Hashed, MAX_STEPS};
use super::engine::SimEngine;
use loadlink_engine::model::{Event, Scheduler, StepKind};
use std::collections::HashSet;

/// Seconds `p` adds, placed on `engine` at `now`, to the summed time to first token of the
/// requests owed one there (its own included); infinity once it is known to be `limit` or more.
pub(crate) fn cost_within(engine: &SimEngine, p: &Hashed<'_>, now: f64, limit: f64) -> f64 {
    let (sched, t) = engine.fork(now);
    let mut owed: HashSet<u64> = sched.awaiting_first_token().collect();
    let base = owed_seconds(sched.clone(), t, now, owed.clone(), f64::INFINITY);
    if !base.is_finite() {
        return f64::INFINITY;
    }
    let mut with = sched;
    match p.chain(engine.model().page_size) {
        Some(c) => with.submit_hashed(p.submit.clone(), c.clone()),
        None => with.submit(p.submit.clone()),
    }
    owed.insert(p.submit.id);
    owed_seconds(with, t, now, owed, base + limit) - base
}

/// The engine where `p` adds the least summed TTFT (ties rotate with the request id). Engines
/// holding most of the prompt are priced first: they are usually the cheapest, and the forks
/// after them stop sooner.
pub(crate) fn pick(engines: &[SimEngine], p: &Hashed<'_>, now: f64) -> usize {
    let n = engines.len().max(1);
    let start = (p.submit.id % n as u64) as usize;
    let m = super::oracle::matches(engines, p);
    let rot = |e: usize| (e + n - start) % n;
    let mut order: Vec<usize> = (0..engines.len()).collect();
    order.sort_unstable_by_key(|&e| (std::cmp::Reverse(m[e]), rot(e)));
    let mut best: (f64, Option<usize>) = (f64::INFINITY, None);
    for e in order {
        let c = cost_within(&engines[e], p, now, best.0);
        let tie_first = c == best.0 && best.1.is_some_and(|b| rot(e) < rot(b));
        if c < best.0 || tie_first {
            best = (c, Some(e));
        }
    }
    best.1.unwrap_or(start)
}

/// Summed seconds from `now` to the first token of each request in `owed`, stepping `sched` from
/// `t`; infinity once the sum is known to reach `limit`, or if the engine would never answer.
fn owed_seconds(
    mut sched: Scheduler,
    mut t: f64,
    now: f64,
    mut owed: HashSet<u64>,
    limit: f64,
) -> f64 {
    let mut sum = 0.0;
    for _ in 0..MAX_STEPS {
        if owed.is_empty() {
            return sum;
        }
        let step = sched.step(t);
        t += step.duration;
        if step.kind == StepKind::Idle {
            return f64::INFINITY;
        }
        for e in &step.events {
            let (Event::FirstToken { id } | Event::Finished { id, .. }) = *e else {
                continue;
            };
            if owed.remove(&id) {
                sum += t - now;
            }
        }
        // Whoever is still owed answers at this step's end or later.
        if sum + owed.len() as f64 * (t - now) >= limit {
            return f64::INFINITY;
        }
    }
    f64::INFINITY
}
