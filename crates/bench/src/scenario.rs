//! Named scenarios. S1 is the standard one: 4 engines, 2 router replicas, 25% direct traffic,
//! streaming, 85% of nominal fleet capacity, log-normal lengths. S0 is the fairness check (one
//! router, no direct traffic: engine load must not be worse than in-flight). S2 is S1 with the
//! direct traffic pinned to one engine (a hot tenant no router sees).

use crate::sim::{DirectTarget, Outcome, SimConfig, simulate};
use crate::workload::{Pattern, WorkloadSpec, generate};
use loadlink_engine::PublishPoint;
use loadlink_engine::model::ModelConfig;
use loadlink_router::{LoadSignal, Policy};

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    pub engines: usize,
    pub routers: usize,
    pub direct_fraction: f64,
    pub direct: DirectTarget,
    pub load: f64,
    pub duration_s: f64,
    pub model: ModelConfig,
    /// Where the engines publish in their cycle (`--publish-point`; default: loadlink's choice).
    pub publish_point: PublishPoint,
}

pub fn by_name(name: &str) -> Result<Scenario, String> {
    let model = ModelConfig {
        max_running_requests: 64,
        ..ModelConfig::default()
    };
    let s1 = Scenario {
        name: "s1",
        about: "4 engines, 2 routers, 25% direct (uniform), streaming, 85% load, log-normal lengths",
        engines: 4,
        routers: 2,
        direct_fraction: 0.25,
        direct: DirectTarget::Uniform,
        load: 0.85,
        duration_s: 600.0,
        model,
        publish_point: PublishPoint::default(),
    };
    match name {
        "s1" => Ok(s1),
        "s0" => Ok(Scenario {
            name: "s0",
            about: "fairness: 4 engines, 1 router, no direct traffic, 85% load",
            routers: 1,
            direct_fraction: 0.0,
            ..s1
        }),
        "s2" => Ok(Scenario {
            name: "s2",
            about: "S1 with the direct traffic pinned to engine 0",
            direct: DirectTarget::Pinned,
            ..s1
        }),
        o => Err(format!("unknown scenario {o:?}; expected s0, s1 or s2")),
    }
}

/// Lengths used by every scenario: prompts median 512 (σ 0.8), outputs median 128 (σ 0.8).
pub fn workload_spec(s: &Scenario, seed: u64, load: f64) -> WorkloadSpec {
    let mut w = WorkloadSpec {
        seed,
        duration_s: s.duration_s,
        rate: 1.0,
        pattern: Pattern::Poisson,
        prompt_median: 512.0,
        prompt_sigma: 0.8,
        output_median: 128.0,
        output_sigma: 0.8,
        max_tokens: 8192,
        stream_fraction: 1.0,
        direct_fraction: s.direct_fraction,
    };
    w.rate = load * s.engines as f64 * engine_capacity(&s.model, &w);
    w
}

/// Nominal requests/s one engine sustains at a full batch: prefill time of a mean prompt plus a
/// mean output's share of full-batch decode steps.
pub fn engine_capacity(m: &ModelConfig, w: &WorkloadSpec) -> f64 {
    let t = m.timing;
    let b = m.max_running_requests as f64;
    let ctx = w.mean_prompt() + w.mean_output() / 2.0;
    let step_us = t.base_us + t.per_batch_req_us * b + t.per_kv_token_us * b * ctx;
    let per_req_us = w.mean_prompt() * (t.per_prefill_token_us + t.per_kv_token_us)
        + w.mean_output() * step_us / b;
    1e6 / per_req_us
}

/// The policy × signal combinations every report compares.
pub const VARIANTS: [(Policy, LoadSignal); 7] = [
    (Policy::RoundRobin, LoadSignal::Inflight),
    (Policy::PowerOfTwo, LoadSignal::Inflight),
    (Policy::PowerOfTwo, LoadSignal::Engine),
    (Policy::PowerOfTwo, LoadSignal::Backlog),
    (Policy::LeastLoad, LoadSignal::Inflight),
    (Policy::LeastLoad, LoadSignal::Engine),
    (Policy::LeastLoad, LoadSignal::Backlog),
];

/// Runs one variant of a scenario at `load` (fraction of nominal capacity).
pub fn run(s: &Scenario, seed: u64, load: f64, policy: Policy, signal: LoadSignal) -> Outcome {
    let arrivals = generate(&workload_spec(s, seed, load));
    let cfg = SimConfig {
        engines: vec![s.model; s.engines],
        routers: s.routers,
        policy,
        signal,
        freshness_ms: 3000,
        net_delay_s: 0.001,
        publish_every: 1,
        publish_point: s.publish_point,
        direct: s.direct,
    };
    simulate(&cfg, &arrivals, s.duration_s * 4.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulation_is_deterministic_for_a_seed() {
        let mut s = by_name("s1").unwrap();
        s.duration_s = 60.0;
        let a = run(&s, 7, 0.85, Policy::PowerOfTwo, LoadSignal::Engine);
        let b = run(&s, 7, 0.85, Policy::PowerOfTwo, LoadSignal::Engine);
        assert_eq!(a.ttft, b.ttft);
        assert_eq!(
            (a.completed, a.decisions, a.fallback_decisions),
            (b.completed, b.decisions, b.fallback_decisions)
        );
        assert!(
            a.completed > 100 && a.completed == a.submitted,
            "everything finishes: {} of {}",
            a.completed,
            a.submitted
        );
        let c = run(&s, 8, 0.85, Policy::PowerOfTwo, LoadSignal::Engine);
        assert_ne!(a.ttft, c.ttft, "another seed, another run");
    }

    #[test]
    fn engine_load_sees_the_pinned_direct_traffic() {
        let mut s = by_name("s2").unwrap();
        s.duration_s = 120.0;
        let inflight = run(&s, 3, 0.85, Policy::PowerOfTwo, LoadSignal::Inflight);
        let engine = run(&s, 3, 0.85, Policy::PowerOfTwo, LoadSignal::Engine);
        let p99 = |o: &Outcome| crate::sim::quantile(&o.ttft, 0.99);
        assert!(
            p99(&engine) < p99(&inflight),
            "engine {} vs inflight {}",
            p99(&engine),
            p99(&inflight)
        );
        assert_eq!(
            engine.fallback_decisions, 0,
            "every engine reports, nothing goes stale"
        );
    }

    #[test]
    fn publishing_before_scheduling_shows_routers_the_prefill_ahead() {
        let mut s = by_name("s1").unwrap();
        s.duration_s = 120.0;
        let mut p99 = |point| {
            s.publish_point = point;
            let o = run(&s, 3, 0.85, Policy::PowerOfTwo, LoadSignal::Backlog);
            crate::sim::quantile(&o.ttft, 0.99)
        };
        let ingest = p99(PublishPoint::Ingest);
        let (scheduled, batch_end) = (p99(PublishPoint::Scheduled), p99(PublishPoint::BatchEnd));
        assert!(
            ingest < 0.8 * scheduled && ingest < 0.8 * batch_end,
            "ingest {ingest} vs scheduled {scheduled} vs batch-end {batch_end}"
        );
    }
}
