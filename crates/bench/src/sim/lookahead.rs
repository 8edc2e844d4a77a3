//! The lookahead oracle's rollout: what the fleet would do over the next seconds if a request went
//! to one engine or another, with the arrivals of that window known (an oracle knows the future
//! workload; a router never does).
//!
//! Every engine's scheduler is forked ([`SimEngine::fork`]) and stepped by the production step
//! function; the request goes to the engine under test; each later arrival of the window goes
//! where the cheap locality rule sends it — the holder of its longest (will-be-)cached prefix,
//! else the engine with the least uncached prompt work queued — and a direct arrival where the
//! simulator sends it. No fork inside the rollout: its cost is one forward simulation of the
//! fleet over the window.
//!
//! The score is what the choice costs the window's requests: the sum of their TTFTs (a request
//! without a first token by the window's end counts the time it has waited), plus the debt the
//! window leaves: each engine's n waiting requests still face, on average, half of its queued
//! prefill seconds W, so n·W/2 (FCFS over the queue's order).

use super::clairvoyant::Hashed;
use super::engine::SimEngine;
use super::oracle::recompute_s_of;
use crate::workload::Arrival;
use loadlink_engine::model::{Event, Scheduler, StepKind, Submit};
use loadlink_engine::radix::PageChain;

/// The longest window a rollout simulates (seconds): the burst length, and a bound on the
/// cost of one decision.
pub const MAX_WINDOW_S: f64 = 30.0;

/// What a rollout needs to know of the window's arrivals.
pub(crate) struct Window<'a> {
    /// The arrivals after the decided one, in time order, with their indices.
    pub arrivals: &'a [Arrival],
    pub first_index: usize,
    /// Per arrival (same order): its page chain at `page` tokens per page (empty: nothing to
    /// match), and the unit a direct arrival goes to.
    pub page: usize,
    pub chains: &'a [&'a PageChain],
    pub direct_unit: &'a dyn Fn(usize) -> usize,
}

/// Tokens of `chain` the scheduler has cached or will have once its queued requests finish.
fn will_match(s: &Scheduler, chain: &PageChain) -> u64 {
    s.prefix_cache()
        .matched_tokens(chain)
        .max(s.queued_match(chain))
}

/// The cheap locality rule: the deepest holder (ties and no holder: least queued uncached work,
/// then fewest requests, then the lowest index).
fn cheap_pick(scheds: &[Scheduler], chain: &PageChain) -> usize {
    let key = |(e, s): (usize, &Scheduler)| {
        let m = will_match(s, chain);
        let work = s.waiting_uncached_tokens();
        (
            std::cmp::Reverse(m),
            work,
            s.num_waiting() + s.num_running(),
            e,
        )
    };
    scheds
        .iter()
        .enumerate()
        .min_by_key(|&x| key(x))
        .map_or(0, |(e, _)| e)
}

/// `s` arrives at unit `u` at `t` (an idle unit starts stepping then); its prompt's chain, when
/// hashed at the unit's page size, is not hashed again.
fn send(
    scheds: &mut [Scheduler],
    next: &mut [Option<f64>],
    (u, s, chain): (usize, Submit, Option<(usize, &PageChain)>),
    t: f64,
) {
    match chain.filter(|(page, _)| *page == scheds[u].config().page_size) {
        Some((_, c)) => scheds[u].submit_hashed(s, c.clone()),
        None => scheds[u].submit(s),
    }
    next[u].get_or_insert(t);
}

/// The score of sending `submit` to `unit` at `now` and rolling the fleet forward to `now +
/// window_s` with `w`'s arrivals (lower is better).
pub(crate) fn score(
    engines: &[SimEngine],
    p: &Hashed<'_>,
    unit: usize,
    now: f64,
    window_s: f64,
    w: &Window<'_>,
) -> f64 {
    let end = now + window_s;
    let (mut scheds, mut next): (Vec<Scheduler>, Vec<Option<f64>>) = engines
        .iter()
        .map(|e| {
            let (s, at) = e.fork(now);
            let idle = s.is_idle();
            (s, (!idle).then_some(at))
        })
        .unzip();
    // Tracked: the decided request (slot 0) and the window's arrivals; arrival time, first token.
    let mut tracked: Vec<(f64, Option<f64>)> = vec![(now, None)];
    let page = engines[unit].model().page_size;
    let chain = p.chain(page).map(|c| (page, c));
    send(&mut scheds, &mut next, (unit, p.submit.clone(), chain), now);
    let mut k = 0;
    loop {
        let step_at = (next.iter().enumerate())
            .filter_map(|(e, at)| at.map(|t| (t, e)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let arrival_at = w.arrivals.get(k).map(|a| a.t).filter(|&t| t <= end);
        match (arrival_at, step_at) {
            (Some(ta), s) if s.is_none_or(|(ts, _)| ta <= ts) => {
                let a = &w.arrivals[k];
                let id = (w.first_index + k) as u64;
                let u = match a.direct {
                    true => (w.direct_unit)(w.first_index + k),
                    false => cheap_pick(&scheds, w.chains[k]),
                };
                let s = match &a.prompt {
                    Some(p) => Submit::tokens(id, p.clone(), a.output_tokens),
                    None => Submit::counted(id, a.prompt_tokens, a.output_tokens),
                };
                let chain = Some((w.page, w.chains[k]));
                send(&mut scheds, &mut next, (u, s, chain), ta);
                tracked.push((ta, None));
                k += 1;
            }
            (_, Some((ts, e))) if ts <= end => {
                let step = scheds[e].step(ts);
                let done = ts + step.duration;
                next[e] = (step.kind != StepKind::Idle).then_some(done);
                for ev in &step.events {
                    let id = match *ev {
                        Event::FirstToken { id } | Event::Finished { id, .. } => id,
                        Event::Token { .. } => continue,
                    };
                    let slot = match id {
                        id if id == p.submit.id => Some(0),
                        id => (id as usize)
                            .checked_sub(w.first_index)
                            .map(|j| j + 1)
                            .filter(|&j| j < tracked.len()),
                    };
                    if let Some((_, first)) = slot.and_then(|j| tracked.get_mut(j)) {
                        first.get_or_insert(done.min(end));
                    }
                }
            }
            _ => break,
        }
    }
    let waited: f64 = tracked.iter().map(|(a, f)| f.unwrap_or(end) - a).sum();
    let debt: f64 = (scheds.iter().zip(engines))
        .map(|(s, e)| {
            let queued_s = recompute_s_of(e.model(), s.waiting_uncached_tokens());
            s.num_waiting() as f64 * queued_s / 2.0
        })
        .sum();
    waited + debt
}
