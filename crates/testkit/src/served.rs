//! Engines that serve named models and LoRA adapters, for the tests that route by model: start one
//! with its names and adapters, read what it was asked for per model, and replace it by an engine
//! serving other names **on the same port** (a worker that re-registers under a new model, as
//! when an operator redeploys one address with another model).

use crate::engine::engine;
use crate::metrics::scrape;
use crate::wait::wait_until;
use loadlink_engine::served::UNSERVED;
use loadlink_engine::{AdapterSpec, Engine, EngineConfig, LoraConfig};
use std::collections::BTreeMap;

/// `name=path` adapters for [`EngineConfig::adapters`].
pub fn adapters(specs: &[&str]) -> Vec<AdapterSpec> {
    specs
        .iter()
        .map(|s| AdapterSpec::parse(s).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// An engine serving `names` (the first primary) and the adapters `specs` (`name=path`), at
/// most `max_loaded` resident, each load taking `load_time_s`; `tweak` adjusts the rest.
pub async fn model_engine(
    names: &[&str],
    specs: &[&str],
    lora: LoraConfig,
    tweak: impl FnOnce(&mut EngineConfig),
) -> Engine {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let adapters = adapters(specs);
    engine(move |c| {
        if let Some((first, rest)) = names.split_first() {
            c.model_name = first.clone();
            c.extra_served_names = rest.to_vec();
        }
        c.adapters = adapters;
        c.model.lora = lora;
        tweak(c);
    })
    .await
}

/// Stops `old` and starts the engine `tweak` describes on the same port, retrying the bind for a
/// bounded time (the old listener is gone once `stop` returns; the retry covers a slow close).
pub async fn restart_on_same_port(old: Engine, tweak: impl Fn(&mut EngineConfig)) -> Engine {
    let port = old.addr.port();
    old.stop().await;
    wait_until(&format!("rebinding port {port}"), 10, || {
        let tweak = &tweak;
        async move {
            let mut cfg = EngineConfig {
                port,
                model: loadlink_engine::ModelConfig {
                    max_running_requests: 16,
                    ..Default::default()
                },
                ..Default::default()
            };
            tweak(&mut cfg);
            cfg.port = port;
            Engine::start(cfg).await.map_err(|e| e.to_string())
        }
    })
    .await
}

/// `loadlink_engine_model_requests_total` by `model` label, read from `/metrics` (strictly
/// parsed); [`UNSERVED`] is requests for something the engine does not serve.
pub async fn model_requests(c: &reqwest::Client, base_url: &str) -> BTreeMap<String, u64> {
    let page = scrape(c, base_url).await;
    page.samples("loadlink_engine_model_requests_total")
        .filter_map(|s| Some((s.label("model")?.to_string(), s.value as u64)))
        .collect()
}

/// Requests this engine was asked for under a name it does not serve.
pub async fn unserved_requests(c: &reqwest::Client, base_url: &str) -> u64 {
    model_requests(c, base_url)
        .await
        .get(UNSERVED)
        .copied()
        .unwrap_or(0)
}

/// `loadlink_engine_lora_loads_total` summed over ranks.
pub async fn lora_loads(c: &reqwest::Client, base_url: &str) -> u64 {
    let page = scrape(c, base_url).await;
    page.samples("loadlink_engine_lora_loads_total")
        .map(|s| s.value as u64)
        .sum()
}
