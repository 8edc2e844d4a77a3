//! The router book's utilisation ρ against the work the arrivals bring: a cache-blind fleet must
//! read the share of time its engines spend in prefill (`book::utilisation`), bounded by what the
//! prompts' tokens cost and what they cost with one prefill step's overhead each; otherwise a
//! price built on ρ would mean something else than the prefill queue it is meant to price.

use crate::scenario::{CACHE_VARIANTS, Scenario, arrivals, by_name, run_arrivals};
use crate::workload::Arrival;

/// Mean ρ the first router measured over the arrivals, cache-blind routing.
fn measured_rho(s: &Scenario, a: &[Arrival]) -> f64 {
    let blind = CACHE_VARIANTS
        .iter()
        .find(|v| v.label == "power_of_two / backlog")
        .expect("the cache-blind baseline");
    let (_, queues) = run_arrivals(s, a, blind);
    queues.mean_utilisation.expect("ρ measured")
}

/// The prefill share these very arrivals bring per engine-second: their prompt tokens' compute
/// (the lower bound: prefill steps batched without overhead) and the same with a step's fixed
/// cost per request (the upper bound: every request prefilled alone).
fn prefill_share(s: &Scenario, a: &[Arrival]) -> (f64, f64) {
    let t = s.model.timing;
    let n = a.len() as f64;
    let prompt = a.iter().map(|x| x.prompt_tokens as f64).sum::<f64>() / n;
    let tokens_us = prompt * (t.per_prefill_token_us + t.per_kv_token_us);
    let alone_us = tokens_us + t.base_us + t.per_batch_req_us;
    let span = a.last().map_or(1.0, |x| x.t);
    let per_engine_s = n / 1e6 / span / s.schedulers() as f64;
    (tokens_us * per_engine_s, alone_us * per_engine_s)
}

#[test]
fn a_cache_blind_fleet_reads_its_prefill_share() {
    let mut s = by_name("s1").expect("s1");
    s.duration_s = 60.0;
    for load in [0.5, 0.8] {
        let a = arrivals(&s, 1, load);
        let (rho, (low, high)) = (measured_rho(&s, &a), prefill_share(&s, &a));
        eprintln!(
            "s1 seed 1, 60 s, load {load}: prefill share {low:.3}–{high:.3}, mean ρ {rho:.3}"
        );
        assert!(
            rho >= low - 0.03 && rho <= high + 0.03,
            "load {load}: ρ {rho} outside {low}–{high}"
        );
        assert!(rho < load, "load {load}: ρ {rho} counts more than prefill");
    }
}
