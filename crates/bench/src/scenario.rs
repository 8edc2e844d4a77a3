//! Named scenarios. S1 is the standard one: 4 engines, 2 router replicas, 25% direct traffic,
//! streaming, 85% of nominal fleet capacity, log-normal lengths. S0 is the fairness check (one
//! router, no direct traffic: engine load must not be worse than in-flight). S2 is S1 with the
//! direct traffic pinned to one engine (a hot tenant no router sees).
//!
//! S3 and S4 reuse prefixes (S1's fleet and direct traffic): S3 is half multi-turn chat sessions,
//! half tenants' shared system prompts; S4 has one tenant send half of all requests. Their rate is
//! calibrated on the prompt tokens engines still compute when routing ignores the caches
//! ([`blind_reuse`]), so "85% load" is 85% of what a cache-blind fleet sustains: the baseline a
//! cache-aware router must beat.
//!
//! `tiers` prices a host KV tier ([`tiers`]); `models` spreads S1's prompts over three models and
//! 32 LoRA adapters of one of them ([`models`]).
//!
//! S6 is S3 on 2 prefill + 2 decode engines against S3's 4 aggregated engines ([`pd`]).
//!
//! S5 is S3's mix on 8 schedulers, run as 8 one-rank engines and as 2 engines of 4 DP ranks, routed
//! per rank and whole ([`ranks`]). Calibration counts schedulers (engines × ranks), so both fleets
//! get the same arrivals.

use crate::sim::{
    CacheView, DirectTarget, LoadDelivery, Outcome, QueueStats, RankRouting, SimConfig, SimRouter,
    simulate_with_queues,
};
use crate::workload::{
    Arrival, ChatSessions, HotPrefix, Len, Pattern, ReuseEstimate, Shape, SharedSystem, Traffic,
    WorkloadSpec, blind_reuse, generate, generate_mix,
};
use loadlink_engine::PublishPoint;
use loadlink_engine::model::ModelConfig;
use loadlink_router::admission::AdmissionConfig;
use loadlink_router::policy::{CacheAware, MinTtft};
use loadlink_router::{LoadSignal, Policy};

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    pub engines: usize,
    /// DP ranks per engine, each a scheduler of its own (1: none).
    pub ranks: usize,
    pub routers: usize,
    pub direct_fraction: f64,
    pub direct: DirectTarget,
    pub load: f64,
    pub duration_s: f64,
    pub model: ModelConfig,
    /// Where the engines publish in their cycle (`--publish-point`; default: loadlink's choice).
    pub publish_point: PublishPoint,
    pub workload: Workload,
    /// How engine load reaches the routers (push by default).
    pub delivery: LoadDelivery,
}

/// What a scenario sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    /// Unique prompts of log-normal lengths ([`workload_spec`]).
    Lengths,
    /// Prefix-sharing shapes, each with its share of the requests.
    Prefix(Vec<(f64, Shape)>),
    /// S1's unique prompts spread over several models and LoRA adapters, on the fleet of
    /// [`models::fleet`] ([`models`]).
    Models,
}

pub const NAMES: [&str; 7] = ["s0", "s1", "s2", "s3", "s4", "s5", "s6"];

impl Scenario {
    /// Schedulers over the fleet: what the offered load is calibrated on.
    pub fn schedulers(&self) -> usize {
        self.engines * self.ranks.max(1)
    }
}

/// The named scenario (`s0`–`s6`, in either case).
pub fn by_name(name: &str) -> Result<Scenario, String> {
    let model = ModelConfig {
        max_running_requests: 64,
        ..ModelConfig::default()
    };
    let s1 = Scenario {
        name: "s1",
        about: "4 engines, 2 routers, 25% direct (uniform), streaming, 85% load, log-normal lengths",
        engines: 4,
        ranks: 1,
        routers: 2,
        direct_fraction: 0.25,
        direct: DirectTarget::Uniform,
        load: 0.85,
        duration_s: 600.0,
        model,
        publish_point: PublishPoint::default(),
        workload: Workload::Lengths,
        delivery: LoadDelivery::Push,
    };
    let s3_mix = Workload::Prefix(vec![
        (0.5, Shape::Chat(ChatSessions::default())),
        (0.5, Shape::SharedSystem(SharedSystem::default())),
    ]);
    match name.to_ascii_lowercase().as_str() {
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
        "s3" => Ok(Scenario {
            name: "s3",
            about: "S1 with prefix reuse: half multi-turn chat sessions (5 turns), half shared \
                    system prompts (16 tenants, Zipf 1.1); 85% of cache-blind capacity",
            workload: s3_mix,
            ..s1
        }),
        "s6" => Ok(Scenario {
            name: "s6",
            about: "S3's mix and rate (4 engines' worth, 2 routers, 25% direct) on 2 prefill + 2 \
                    decode engines against 4 aggregated engines of the same hardware",
            workload: s3_mix,
            ..s1
        }),
        "s5" => Ok(Scenario {
            name: "s5",
            about: "S3's mix on 8 schedulers (2 routers, 25% direct): 8 engines × 1 rank, or 2 \
                    engines × 4 DP ranks routed per rank or whole; 85% of cache-blind capacity",
            engines: 8,
            workload: s3_mix,
            ..s1
        }),
        "s4" => Ok(Scenario {
            name: "s4",
            about: "S3 with a hot prefix: one tenant sends 50% of requests, the rest is S3's mix; \
                    85% of cache-blind capacity",
            workload: Workload::Prefix(vec![
                (0.25, Shape::Chat(ChatSessions::default())),
                (
                    0.75,
                    Shape::HotPrefix(HotPrefix {
                        hot_fraction: 2.0 / 3.0,
                        hot_system: Len::new(1024.0, 0.0),
                        others: SharedSystem::default(),
                    }),
                ),
            ]),
            ..s1
        }),
        "agentic" => Ok(saturation::agentic(s1)),
        "gsp" => Ok(saturation::gsp(s1)),
        "agentic-closed" => Ok(saturation::agentic_closed(s1)),
        "tiers" => Ok(tiers::scenario()),
        "models" => Ok(models::scenario()),
        o => Err(format!(
            "unknown scenario {o:?}; expected one of {}, agentic, agentic-closed, gsp, tiers, models",
            NAMES.join(", ")
        )),
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
    w.rate = load * s.schedulers() as f64 * engine_capacity(&s.model, &w);
    w
}

/// Nominal requests/s one engine sustains at a full batch: prefill time of a mean prompt plus a
/// mean output's share of full-batch decode steps.
pub fn engine_capacity(m: &ModelConfig, w: &WorkloadSpec) -> f64 {
    let t = m.timing;
    let prefill_us = w.mean_prompt() * (t.per_prefill_token_us + t.per_kv_token_us);
    capacity(m, prefill_us, w.mean_prompt(), w.mean_output())
}

/// [`engine_capacity`] when prefill computes only the uncached part of each prompt (the whole
/// prompt still counts in the KV the batch attends to).
pub fn cached_engine_capacity(m: &ModelConfig, r: &ReuseEstimate) -> f64 {
    let t = m.timing;
    let prefill_us = r.mean_uncached * t.per_prefill_token_us + r.mean_prompt * t.per_kv_token_us;
    capacity(m, prefill_us, r.mean_prompt, r.mean_output)
}

/// Requests/s given a request's prefill time and its mean output's share of full-batch decode. A
/// full batch is `max_running_requests`, or fewer when that many mean contexts do not fit in the
/// KV pool (long agentic contexts: the pool, not the slot count, bounds the batch).
fn capacity(m: &ModelConfig, prefill_us: f64, mean_prompt: f64, mean_output: f64) -> f64 {
    let t = m.timing;
    let ctx = mean_prompt + mean_output / 2.0;
    let b = (m.max_running_requests as f64).min(m.max_total_tokens as f64 / ctx.max(1.0));
    let step_us = t.base_us + t.per_batch_req_us * b + t.per_kv_token_us * b * ctx;
    let per_req_us = prefill_us + mean_output * step_us / b;
    1e6 / per_req_us
}

/// Requests/s per engine used to probe a prefix workload's reuse before calibrating its rate.
const PROBE_RATE_PER_ENGINE: f64 = 5.0;

/// A prefix workload's traffic at `rate` (S1's output lengths and direct fraction).
pub(crate) fn prefix_traffic(s: &Scenario, seed: u64, rate: f64) -> Traffic {
    Traffic {
        direct_fraction: s.direct_fraction,
        ..Traffic::new(seed, s.duration_s, rate)
    }
}

/// What a cache-blind fleet would reuse of a prefix workload (probed at a fixed rate on the same
/// seed); `None` for unique prompts.
pub fn blind_estimate(s: &Scenario, seed: u64) -> Option<ReuseEstimate> {
    let Workload::Prefix(parts) = &s.workload else {
        return None;
    };
    let probe_rate = PROBE_RATE_PER_ENGINE * s.schedulers() as f64;
    let probe = generate_mix(&prefix_traffic(s, seed, probe_rate), parts);
    Some(blind_reuse(&probe, s.schedulers(), s.model.page_size, seed))
}

/// The offered requests/s at `load`: nominal capacity for unique prompts; for prefix workloads,
/// capacity on the tokens a cache-blind fleet still computes ([`blind_estimate`]).
pub fn offered_rate(s: &Scenario, seed: u64, load: f64) -> f64 {
    match blind_estimate(s, seed) {
        None => workload_spec(s, seed, load).rate,
        Some(reuse) => load * s.schedulers() as f64 * cached_engine_capacity(&s.model, &reuse),
    }
}

/// The scenario's arrivals at `load` over its duration (deterministic for the seed).
pub fn arrivals(s: &Scenario, seed: u64, load: f64) -> Vec<Arrival> {
    match &s.workload {
        Workload::Lengths => generate(&workload_spec(s, seed, load)),
        Workload::Models => models::arrivals(s, seed, load),
        Workload::Prefix(parts) => {
            let rate = offered_rate(s, seed, load);
            generate_mix(&prefix_traffic(s, seed, rate), parts)
        }
    }
}

/// The arrivals a name stands for: a scenario (`s0`–`s6`, at `load` or its own, over `duration_s`
/// or its own) or a prefix shape (`chat`, `shared-system`, `generated-shared-prefix`,
/// `hot-prefix`, with its defaults, at `rate` requests/s, default 10, over `duration_s`, default
/// 600).
pub fn named_arrivals(
    name: &str,
    seed: u64,
    (load, rate, duration_s): (Option<f64>, Option<f64>, Option<f64>),
) -> Result<Vec<Arrival>, String> {
    if let Some(shape) = Shape::by_name(name) {
        let traffic = Traffic::new(seed, duration_s.unwrap_or(600.0), rate.unwrap_or(10.0));
        return Ok(generate_mix(&traffic, &[(1.0, shape)]));
    }
    let mut s =
        by_name(name).map_err(|e| format!("{e}, or a shape: {}", Shape::NAMES.join(", ")))?;
    if let Some(d) = duration_s {
        s.duration_s = d;
    }
    let load = load.unwrap_or(s.load);
    Ok(arrivals(&s, seed, load))
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

/// One router variant of a comparison: who routes, on which load signal, with which cache view.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Variant {
    pub label: &'static str,
    pub router: SimRouter,
    pub signal: LoadSignal,
    pub cache: CacheView,
}

pub(crate) const fn variant(
    label: &'static str,
    router: SimRouter,
    signal: LoadSignal,
    cache: CacheView,
) -> Variant {
    Variant {
        label,
        router,
        signal,
        cache,
    }
}

/// SGLang-router 0.3.2's `cache_aware` defaults (see [`CacheAware`]).
pub(crate) const CACHE_AWARE: Policy = Policy::CacheAware(CacheAware {
    cache_threshold: 0.3,
    balance_abs_threshold: 64,
    balance_rel_threshold: 1.5,
});

/// `min_ttft` with its defaults (see [`MinTtft`]).
pub const MIN_TTFT: Policy = Policy::MinTtft(MinTtft {
    per_request_tokens: loadlink_router::book::REQUEST_TOKENS_WEIGHT as f64,
    kv_pressure_s: 0.5,
    kv_pressure_from: 0.9,
    tie_rel: 0.05,
    tie_abs_s: 0.002,
    tier_pricing: loadlink_router::policy::TierPricing::Aware,
    host_load_tokens_per_s: loadlink_router::policy::DEFAULT_HOST_LOAD_TOKENS_PER_S,
    adapter_pricing: loadlink_router::policy::AdapterPricing::Aware,
    fleet_pricing: loadlink_router::policy::FleetPricing::Aware,
});

/// `min_ttft` as it was before fleet pricing (issue 24's "today"): this request's TTFT only.
pub const MIN_TTFT_TODAY: Policy = match MIN_TTFT {
    Policy::MinTtft(p) => Policy::MinTtft(MinTtft {
        fleet_pricing: loadlink_router::policy::FleetPricing::Blind,
        ..p
    }),
    p => p,
};

/// The cache-aware comparison (issue 13): load-only baselines, SGLang's `cache_aware` on in-flight
/// load with its approximate tree and on engine load with the KV index (#28600), `min_ttft` on
/// either cache view, and the clairvoyant bound.
pub const CACHE_VARIANTS: [Variant; 7] = [
    variant(
        "round_robin",
        SimRouter::Policy(Policy::RoundRobin),
        LoadSignal::Inflight,
        CacheView::Blind,
    ),
    variant(
        "power_of_two / backlog",
        SimRouter::Policy(Policy::PowerOfTwo),
        LoadSignal::Backlog,
        CacheView::Blind,
    ),
    variant(
        "cache_aware / inflight",
        SimRouter::Policy(CACHE_AWARE),
        LoadSignal::Inflight,
        CacheView::Approx,
    ),
    variant(
        "cache_aware / engine",
        SimRouter::Policy(CACHE_AWARE),
        LoadSignal::Engine,
        CacheView::Index,
    ),
    variant(
        "min_ttft / approx",
        SimRouter::Policy(MIN_TTFT),
        LoadSignal::Backlog,
        CacheView::Approx,
    ),
    variant(
        "min_ttft / kv-index",
        SimRouter::Policy(MIN_TTFT),
        LoadSignal::Backlog,
        CacheView::Index,
    ),
    variant(
        "clairvoyant",
        SimRouter::Clairvoyant,
        LoadSignal::Backlog,
        CacheView::Blind,
    ),
];

/// Runs one variant of a scenario at `load` (fraction of nominal capacity).
pub fn run(s: &Scenario, seed: u64, load: f64, policy: Policy, signal: LoadSignal) -> Outcome {
    let v = variant("", SimRouter::Policy(policy), signal, CacheView::Blind);
    run_variant(s, seed, load, &v)
}

/// Runs `v` on the scenario at `load`.
pub fn run_variant(s: &Scenario, seed: u64, load: f64, v: &Variant) -> Outcome {
    run_arrivals(s, &arrivals(s, seed, load), v).0
}

/// Runs `v` on the scenario's fleet with given arrivals (generate them once for many variants).
pub fn run_arrivals(s: &Scenario, arrivals: &[Arrival], v: &Variant) -> (Outcome, QueueStats) {
    run_admitted(s, arrivals, v, (None, 0))
}

/// [`run_arrivals`] with the routers' admission control (`None`: none) and how many times a
/// client sends a refused request again ([`SimConfig::client_retries`]).
pub fn run_admitted(
    s: &Scenario,
    arrivals: &[Arrival],
    v: &Variant,
    (admission, client_retries): (Option<AdmissionConfig>, u32),
) -> (Outcome, QueueStats) {
    let cfg = SimConfig {
        client_retries,
        ..sim_config(s, v, admission)
    };
    simulate_with_queues(&cfg, arrivals, s.duration_s * 4.0)
}

/// The simulator's configuration for variant `v` on the scenario's fleet (the one place a
/// scenario's fixed settings — freshness, network delay, publish cadence — are written). Ranks of
/// multi-rank engines are routed per rank, as `loadlink route` does by default. A fleet of several
/// models has each engine's own model config and served name ([`models::fleet`]).
pub fn sim_config(s: &Scenario, v: &Variant, admission: Option<AdmissionConfig>) -> SimConfig {
    let (engines, served) = match s.workload {
        Workload::Models => models::fleet()
            .into_iter()
            .map(|(n, m)| (m, n.into()))
            .unzip(),
        _ => (vec![s.model; s.engines], Vec::new()),
    };
    SimConfig {
        engines,
        served,
        adapter_book: loadlink_router::adapters::AdapterBookConfig::default(),
        adapter_reports_s: None,
        ranks: s.ranks.max(1),
        rank_routing: RankRouting::PerRank,
        routers: s.routers,
        router: v.router,
        signal: v.signal,
        cache: v.cache,
        freshness_ms: 3000,
        net_delay_s: 0.001,
        publish_every: 1,
        publish_point: s.publish_point,
        direct: s.direct,
        delivery: s.delivery,
        admission,
        pd: None,
        client_retries: 0,
    }
}

pub mod models;
pub mod pd;
pub mod ranks;
pub mod saturation;
#[cfg(test)]
mod tests;
pub mod tiers;
