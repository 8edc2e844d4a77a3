//! Many models behind one router (`bench sim --scenario models`, issue 22). Eight engines, three
//! models, one router:
//!
//! * `big` on 3 engines, prefilling at half the default speed (a larger model);
//! * `small` on 1 engine, at twice the default speed;
//! * `base` on 4 engines with 32 LoRA adapters, at most 4 resident per engine, a load taking
//!   0.05 s (the batch pauses for it). Every `base` request names an adapter, drawn by Zipf
//!   popularity, s = 1.1 (S3's tenant skew; S-LoRA and Punica draw adapter popularity from power
//!   laws of exponent about 1): the top adapter takes 28% of them, the top 4 56%, the top 16 86%.
//!   So 16 resident slots over 4 engines can hold nearly all of the traffic if each engine keeps
//!   its own few adapters, and hardly any of it if every engine sees every adapter.
//!
//! Each request's candidates are the engines serving its model; each model's share of the traffic
//! is its engines' share of the fleet's capacity, so every model runs at the same load. Prompts
//! are unique (S1's lengths): what differs between routers is where the adapters are.
//!
//! **Load.** 30% of nominal capacity. An engine never evicts an adapter a running request uses,
//! and a full batch of requests for 32 adapters nearly always uses all 4 slots, so a request for
//! a fifth adapter waits until one drains: adapter serving sustains far less than the nominal
//! (adapter-free) capacity the rate is calibrated on. At 30% adapter-blind routing already pays
//! seconds at p99; at 50% and above it collapses (TTFT p50 of seconds), and so, later, does any
//! router; docs/results.md has the sweep.
//!
//! The comparison: round robin and `cache_aware` (load-only and prefix-only baselines), `min_ttft`
//! adapter-blind, and `min_ttft` adapter-aware. Reported per row: adapter loads per 1,000
//! requests, TTFT p50/p99, the prefix hit rate.

use super::{
    CACHE_AWARE, MIN_TTFT, Scenario, Variant, Workload, engine_capacity, sim_config, variant,
    workload_spec,
};
use crate::report::{Row, row_json};
use crate::sim::{
    CacheView, DirectTarget, LoadDelivery, Outcome, SimConfig, SimRouter, quantile, simulate,
};
use crate::workload::{Arrival, ModelShare, adapter_name, assign_models, generate};
use loadlink_engine::PublishPoint;
use loadlink_engine::model::{LoraConfig, ModelConfig};
use loadlink_router::policy::{AdapterPricing, MinTtft};
use loadlink_router::{LoadSignal, Policy};
use serde_json::{Value, json};
use std::fmt::Write;

/// The models' served names.
pub const BIG: &str = "big";
pub const SMALL: &str = "small";
pub const BASE: &str = "base";
/// LoRA adapters of `base`, and how many an engine keeps resident.
pub const ADAPTERS: usize = 32;
pub const MAX_LOADED: usize = 4;
pub const LOAD_TIME_S: f64 = 0.05;
pub const ZIPF_S: f64 = 1.1;

fn model(prefill_speed: f64, lora: LoraConfig) -> ModelConfig {
    let mut m = ModelConfig {
        max_running_requests: 64,
        lora,
        ..ModelConfig::default()
    };
    m.timing.per_prefill_token_us /= prefill_speed;
    m
}

/// Every engine's served model and model config, in engine order.
pub fn fleet() -> Vec<(&'static str, ModelConfig)> {
    let lora = LoraConfig {
        max_loaded: MAX_LOADED,
        load_time_s: LOAD_TIME_S,
    };
    let mut f = vec![(BIG, model(0.5, LoraConfig::default())); 3];
    f.push((SMALL, model(2.0, LoraConfig::default())));
    f.extend(vec![(BASE, model(1.0, lora)); 4]);
    f
}

/// The `loadlink engine` flags of engine `e` of [`fleet`] beyond the ones every live engine gets:
/// its served name, its prefill speed, and, for `base`, its adapters (`--lora-paths
/// tenant-00=/adapters/tenant-00 …`), how many it keeps loaded and how long a load takes.
pub fn engine_args(e: usize) -> Vec<String> {
    let Some((name, m)) = fleet().get(e).copied() else {
        return Vec::new();
    };
    let mut a = vec![
        "--served-model-name".to_string(),
        name.to_string(),
        "--step-per-prefill-token-us".to_string(),
        m.timing.per_prefill_token_us.to_string(),
    ];
    if m.lora.max_loaded > 0 {
        a.push("--lora-paths".into());
        a.extend(
            (0..ADAPTERS).map(|k| format!("{}=/adapters/{}", adapter_name(k), adapter_name(k))),
        );
        a.extend([
            "--max-loaded-loras".to_string(),
            m.lora.max_loaded.to_string(),
            "--lora-load-time".to_string(),
            m.lora.load_time_s.to_string(),
        ]);
    }
    a
}

/// The scenario: the fleet's first engine's model stands for `model` (the other engines' are in
/// [`fleet`]).
pub fn scenario() -> Scenario {
    Scenario {
        name: "models",
        about: "3 models on 8 engines, 1 router: big (3 engines, half-speed prefill), small (1, \
                double speed), base (4, 32 LoRA adapters of Zipf 1.1 popularity, 4 resident per \
                engine, 0.05 s loads); unique prompts; 30% of nominal capacity",
        engines: 8,
        ranks: 1,
        routers: 1,
        direct_fraction: 0.0,
        direct: DirectTarget::Uniform,
        load: 0.3,
        duration_s: 600.0,
        model: fleet()[0].1,
        publish_point: PublishPoint::default(),
        workload: Workload::Models,
        delivery: LoadDelivery::Push,
    }
}

/// The model mix: each model's share is its engines' share of the fleet's capacity.
pub fn mix(s: &Scenario, seed: u64) -> Vec<ModelShare> {
    let spec = workload_spec(s, seed, 1.0);
    let capacity = |name: &str| -> f64 {
        let engines = fleet().into_iter().filter(|(n, _)| *n == name);
        engines.map(|(_, m)| engine_capacity(&m, &spec)).sum()
    };
    [BIG, SMALL, BASE]
        .into_iter()
        .map(|name| ModelShare {
            name,
            share: capacity(name),
            adapters: if name == BASE { ADAPTERS } else { 0 },
            zipf_s: ZIPF_S,
            base_share: 0.0,
        })
        .collect()
}

/// The arrivals at `load` of the whole fleet's capacity, each tagged with its model and adapter.
pub fn arrivals(s: &Scenario, seed: u64, load: f64) -> Vec<Arrival> {
    let mut spec = workload_spec(s, seed, load);
    let total: f64 = fleet().iter().map(|(_, m)| engine_capacity(m, &spec)).sum();
    spec.rate = load * total;
    let mut a = generate(&spec);
    assign_models(&mut a, &mix(s, seed), seed);
    a
}

const fn min_ttft(adapter_pricing: AdapterPricing) -> Policy {
    let Policy::MinTtft(p) = MIN_TTFT else {
        unreachable!()
    };
    Policy::MinTtft(MinTtft {
        adapter_pricing,
        ..p
    })
}

const fn row(label: &'static str, policy: Policy, reports_s: Option<f64>) -> ModelVariant {
    let (signal, cache) = match policy {
        Policy::RoundRobin => (LoadSignal::Inflight, CacheView::Blind),
        Policy::CacheAware(_) => (LoadSignal::Inflight, CacheView::Approx),
        _ => (LoadSignal::Backlog, CacheView::Index),
    };
    ModelVariant {
        router: variant(label, SimRouter::Policy(policy), signal, cache),
        reports_s,
    }
}

/// One row: the router, and how often it reads the engines' loaded adapters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelVariant {
    pub router: Variant,
    /// Every this many seconds the router reads each engine's `loaded_loras` (`None`: never, its
    /// adapter book runs on its dispatch history alone).
    pub reports_s: Option<f64>,
}

impl ModelVariant {
    pub fn label(&self) -> String {
        match self.reports_s {
            None => self.router.label.to_string(),
            Some(s) => format!("{} + reports {s} s", self.router.label),
        }
    }
}

/// The rows' routers, adapter-blind and adapter-aware (the acceptance compares these two).
pub const BLIND: &str = "min_ttft adapter-blind";
pub const AWARE: &str = "min_ttft adapter-aware";

/// The comparison's rows, in report order: the baselines, `min_ttft` adapter-blind and
/// adapter-aware on dispatch history alone, and adapter-aware reading the engines' reports at the
/// router's default model refresh (`--model-refresh-interval`, 30 s).
pub const MODEL_VARIANTS: [ModelVariant; 5] = [
    row("round_robin", Policy::RoundRobin, None),
    row("cache_aware / inflight", CACHE_AWARE, None),
    row(BLIND, min_ttft(AdapterPricing::Blind), None),
    row(AWARE, min_ttft(AdapterPricing::Aware), None),
    row(AWARE, min_ttft(AdapterPricing::Aware), Some(30.0)),
];

/// One row's result.
pub struct ModelRow {
    pub variant: ModelVariant,
    pub outcome: Outcome,
}

/// Every row of `variants` on the same arrivals; `progress` hears each label before it runs.
pub fn comparison(
    s: &Scenario,
    seed: u64,
    load: f64,
    variants: &[ModelVariant],
    progress: impl Fn(&str),
) -> Vec<ModelRow> {
    let arrivals = arrivals(s, seed, load);
    variants
        .iter()
        .map(|v| {
            progress(&v.label());
            let cfg = SimConfig {
                adapter_reports_s: v.reports_s,
                ..sim_config(s, &v.router, None)
            };
            let outcome = simulate(&cfg, &arrivals, s.duration_s * 4.0);
            ModelRow {
                variant: *v,
                outcome,
            }
        })
        .collect()
}

fn loads(o: &Outcome) -> f64 {
    o.adapter_loads_per_1k().unwrap_or(0.0)
}

/// The fraction of adapter requests that found their adapter resident (no load).
pub fn adapter_hit_rate(o: &Outcome) -> Option<f64> {
    (o.adapter_requests > 0)
        .then(|| 1.0 - (o.adapter_loads as f64 / o.adapter_requests as f64).min(1.0))
}

/// The table: adapter loads per 1,000 requests, the adapter hit rate, TTFT, the prefix hit rate
/// (0 with unique prompts; kept so the row reads like the other comparisons').
pub fn table(rows: &[ModelRow]) -> String {
    let mut t = format!(
        "{:<36} {:>12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "router", "loads/1k req", "adapter %", "TTFT p50", "TTFT p99", "wait p99", "hit %", "done"
    );
    for r in rows {
        let o = &r.outcome;
        let _ = writeln!(
            t,
            "{:<36} {:>12.1} {:>9.1} {:>8.3}s {:>8.3}s {:>8.3}s {:>9.1} {:>9}",
            r.variant.label(),
            loads(o),
            adapter_hit_rate(o).unwrap_or(0.0) * 100.0,
            quantile(&o.ttft, 0.5),
            quantile(&o.ttft, 0.99),
            quantile(&o.waits(), 0.99),
            o.cache_hit_rate().unwrap_or(0.0) * 100.0,
            o.completed
        );
    }
    t
}

/// Issue 22's bound: adapter-aware `min_ttft` at most 0.5× the adapter-blind one's loads per
/// 1,000 requests, with a TTFT p99 no worse.
pub fn acceptance(rows: &[ModelRow]) -> String {
    let by = |l: &str| {
        rows.iter()
            .find(|r| r.variant.label() == l)
            .map(|r| &r.outcome)
    };
    let (Some(aware), Some(blind)) = (by(AWARE), by(BLIND)) else {
        return String::new();
    };
    let (l, p) = (
        loads(aware) / loads(blind).max(1e-9),
        quantile(&aware.ttft, 0.99) / quantile(&blind.ttft, 0.99).max(1e-9),
    );
    let verdict = match l <= 0.5 && p <= 1.0 {
        true => "within the bounds",
        false => "OUTSIDE the bounds (loads ≤ 0.5×, p99 ≤ 1.0×)",
    };
    format!(
        "min_ttft adapter-aware: {l:.3}× the adapter loads and {p:.3}× the TTFT p99 of adapter-blind: {verdict}\n"
    )
}

/// The rows as JSON: each row's usual fields plus its adapter figures.
pub fn rows_json(rows: &[ModelRow], load: f64) -> Vec<Value> {
    rows.iter()
        .map(|r| {
            let mut v = row_json(&Row {
                label: r.variant.label(),
                load,
                outcome: r.outcome.clone(),
            });
            v["adapter_loads"] = json!(r.outcome.adapter_loads);
            v["adapter_requests"] = json!(r.outcome.adapter_requests);
            v["adapter_loads_per_1k_requests"] = json!(loads(&r.outcome));
            v["adapter_hit_rate"] = json!(adapter_hit_rate(&r.outcome));
            v["adapter_reports_s"] = json!(r.variant.reports_s);
            v
        })
        .collect()
}

#[cfg(test)]
mod tests;
