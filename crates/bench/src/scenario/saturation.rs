//! The workloads of the placement-near-saturation comparison (issue 24): where a router that picks
//! each request's soonest first token can lose its caches as the load rises, because a request that
//! leaves the worker holding its prefix makes another worker recompute it, and that work takes
//! capacity from everyone.
//!
//! * `agentic`: long agentic sessions ([`AgentSessions`]: 4 agent kinds with 2,048-token
//!   system-and-tools prompts, ~12 turns of a ~120-token tool call and a ~400-token tool result, so
//!   contexts grow to several thousand tokens) on a larger fleet: 8 engines, 4 router replicas, no
//!   direct traffic.
//! * `agentic-closed`: the same sessions closed-loop (a turn waits for the previous answer and the
//!   tool), the faithful form; under a backlog it does not pile turns up, it keeps more sessions
//!   alive at once.
//! * `gsp`: SGLang bench_serving's `generated-shared-prefix` defaults (64 groups, 2,048-token
//!   system prompts, 128-token questions, 256 output tokens), enough prompts per group for the
//!   run, on S1's fleet with every request through the routers (bench_serving targets the router).
//!
//! Both are calibrated as S3 is: the load is a fraction of what a cache-blind fleet sustains. The
//! sweep offers each from 50% to 105% of that ([`SWEEP_LOADS`]); [`burst_arrivals`] adds a burst.

use super::{
    CACHE_VARIANTS, MIN_TTFT_TODAY, Scenario, Variant, Workload, arrivals, offered_rate,
    prefix_traffic, variant,
};
use crate::sim::{CacheView, SimRouter};
use crate::workload::burst::Burst;
use crate::workload::{AgentSessions, Arrival, GeneratedSharedPrefix, Len, Shape, generate_mix};
use loadlink_router::LoadSignal;

/// The sweep's offered loads: 50% to 105% of cache-blind capacity in 5% steps.
pub const SWEEP_LOADS: [f64; 12] = [
    0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.80, 0.85, 0.90, 0.95, 1.00, 1.05,
];

/// The production policies the sweep compares (every one a router users pick today, on the signal
/// and cache view it runs with): backlog P2C, SGLang's `cache_aware` on in-flight load with its
/// approximate tree and on engine load with the KV index, `min_ttft` on either view, and
/// `min_ttft` without fleet pricing (what it was before issue 24).
pub const SWEEP_VARIANTS: [Variant; 6] = [
    CACHE_VARIANTS[1],
    CACHE_VARIANTS[2],
    CACHE_VARIANTS[3],
    CACHE_VARIANTS[4],
    CACHE_VARIANTS[5],
    variant(
        "min_ttft fleet-blind / kv-index",
        SimRouter::Policy(MIN_TTFT_TODAY),
        LoadSignal::Backlog,
        CacheView::Index,
    ),
];

/// The label of the default policy in [`SWEEP_VARIANTS`], whose acceptance the sweep checks.
pub const DEFAULT_LABEL: &str = "min_ttft / kv-index";

/// The oracles (simulation only, [`crate::sim::oracle::ORACLES`]) whose best figures make the
/// bound.
pub fn sweep_oracles() -> Vec<Variant> {
    crate::sim::oracle::ORACLES
        .iter()
        .map(|&(label, router)| variant(label, router, LoadSignal::Backlog, CacheView::Blind))
        .collect()
}

/// Long agentic sessions on 8 engines behind 4 routers.
pub fn agentic(s1: Scenario) -> Scenario {
    Scenario {
        name: "agentic",
        about: "long agentic sessions (4 agent kinds, 2,048-token system+tools prompts, ~12 turns \
                of tool call + tool result, contexts growing to thousands of tokens) on 8 \
                engines, 4 routers, no direct traffic; 85% of cache-blind capacity",
        engines: 8,
        routers: 4,
        direct_fraction: 0.0,
        workload: Workload::Prefix(vec![(1.0, Shape::Agentic(AgentSessions::default()))]),
        ..s1
    }
}

/// [`agentic`] with closed-loop sessions: each turn is sent when the previous one has been
/// answered, after the tool's latency (an agent cannot call the model again before it has read the
/// answer). Same sessions, same fleet, same calibration; what differs under a backlog is that the
/// sessions slow down instead of piling their turns up, and more of them are alive at once.
pub fn agentic_closed(s1: Scenario) -> Scenario {
    Scenario {
        name: "agentic-closed",
        about: "agentic, closed loop: each turn is sent once the previous one finished, after the \
                tool latency; 8 engines, 4 routers, no direct traffic; 85% of cache-blind capacity",
        workload: Workload::Prefix(vec![(
            1.0,
            Shape::Agentic(AgentSessions {
                closed_loop: true,
                ..AgentSessions::default()
            }),
        )]),
        ..agentic(s1)
    }
}

/// SGLang's generated-shared-prefix benchmark on S1's fleet, every request routed.
pub fn gsp(s1: Scenario) -> Scenario {
    Scenario {
        name: "gsp",
        about: "SGLang bench_serving generated-shared-prefix defaults (64 groups, 2,048-token \
                system prompts, 128-token questions, 256 output tokens) on 4 engines, 2 routers, \
                no direct traffic; 85% of cache-blind capacity",
        direct_fraction: 0.0,
        workload: Workload::Prefix(vec![(
            1.0,
            Shape::GeneratedSharedPrefix(GeneratedSharedPrefix {
                output: Some(Len::new(256.0, 0.0)),
                fill: true,
                ..GeneratedSharedPrefix::default()
            }),
        )]),
        ..s1
    }
}

/// The scenario's arrivals with `burst`: drawn at `burst.base` over the scenario's duration plus
/// what the burst packs in, then warped onto the burst's clock.
/// The rate is calibrated on the scenario as it is, so the arrivals before the burst are the base
/// run's.
pub fn burst_arrivals(s: &Scenario, seed: u64, burst: &Burst) -> Vec<Arrival> {
    let longer = Scenario {
        duration_s: s.duration_s + burst.extra_s(),
        ..s.clone()
    };
    let base = match &s.workload {
        Workload::Prefix(parts) => {
            let rate = offered_rate(s, seed, burst.base);
            generate_mix(&prefix_traffic(&longer, seed, rate), parts)
        }
        _ => arrivals(&longer, seed, burst.base),
    };
    let mut a = burst.apply(base);
    a.retain(|x| x.t < s.duration_s);
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{by_name, engine_capacity, workload_spec};

    #[test]
    fn a_full_batch_is_bounded_by_the_pool_only_when_contexts_are_long() {
        // S1's mean context (~680 tokens × 64 requests) fits the 200k pool: 64 slots bound it,
        // as before the pool bound existed.
        let s = by_name("s1").unwrap();
        let w = workload_spec(&s, 1, 0.85);
        let (m, t) = (s.model, s.model.timing);
        let ctx = w.mean_prompt() + w.mean_output() / 2.0;
        let step = t.base_us + t.per_batch_req_us * 64.0 + t.per_kv_token_us * 64.0 * ctx;
        let prefill = w.mean_prompt() * (t.per_prefill_token_us + t.per_kv_token_us);
        let slots_only = 1e6 / (prefill + w.mean_output() * step / 64.0);
        assert!((engine_capacity(&m, &w) / slots_only - 1.0).abs() < 1e-12);
        // 8,000-token contexts: 25 fit, so capacity is lower than 64 slots would say.
        let long = crate::workload::ReuseEstimate {
            mean_prompt: 8_000.0,
            mean_uncached: 500.0,
            mean_output: 120.0,
        };
        let c = crate::scenario::cached_engine_capacity(&m, &long);
        let step64 = t.base_us + t.per_batch_req_us * 64.0 + t.per_kv_token_us * 64.0 * 8_060.0;
        let slots = 1e6
            / (500.0 * t.per_prefill_token_us
                + 8_000.0 * t.per_kv_token_us
                + 120.0 * step64 / 64.0);
        assert!(c < slots, "{c} vs {slots}");
    }

    #[test]
    fn gsp_fills_every_group_for_the_run_with_bench_serving_outputs() {
        let mut s = by_name("gsp").unwrap();
        s.duration_s = 120.0;
        let a = arrivals(&s, 1, 0.8);
        assert!(
            a.len() > 64 * 16,
            "{} arrivals: the fixed set would run out",
            a.len()
        );
        assert!(a.iter().all(|x| x.output_tokens == 256 && !x.direct));
        assert!(a.iter().all(|x| x.prompt_tokens > 2048 + 128));
    }

    #[test]
    fn the_burst_keeps_the_base_run_before_it_and_packs_more_into_it() {
        let mut s = by_name("gsp").unwrap();
        s.duration_s = 200.0;
        let b = Burst {
            start_s: 100.0,
            len_s: 30.0,
            base: 0.8,
            peak: 1.2,
        };
        let warped = burst_arrivals(&s, 2, &b);
        let base = arrivals(&s, 2, 0.8);
        let before = |v: &[Arrival]| v.iter().filter(|x| x.t < 100.0).count();
        assert_eq!(before(&warped), before(&base));
        let in_burst = warped
            .iter()
            .filter(|x| (100.0..130.0).contains(&x.t))
            .count() as f64;
        let base_burst = base
            .iter()
            .filter(|x| (100.0..130.0).contains(&x.t))
            .count() as f64;
        assert!(in_burst > 1.3 * base_burst, "{in_burst} vs {base_burst}");
        assert!(warped.iter().all(|x| x.t < 200.0));
    }
}
