//! Adapter affinity through the real router, counted by the engines: with few adapter slots per
//! engine, a router that prices adapter loads keeps each adapter on the engines that hold it, so the
//! engines load adapters a few times, not once every other request. The adapter-blind router on
//! the same sequence is run beside it and its count shown, not asserted (its ties decide it).

use loadlink_engine::{Engine, LoraConfig};
use loadlink_router::policy::{AdapterPricing, MinTtft};
use loadlink_router::{Policy, RouterConfig};
use loadlink_testkit::fleet_models::{Route, ask, body};
use loadlink_testkit::publishing_engine;
use loadlink_testkit::served::{adapters, lora_loads};
use reqwest::{Client, StatusCode};

/// Adapters, and requests sent one at a time over them.
const ADAPTERS: [&str; 4] = ["a1", "a2", "a3", "a4"];
const REQUESTS: usize = 48;

/// A fixed, shuffled sequence of adapters (a small LCG), so no rotation of the engines matches it.
fn sequence() -> Vec<&'static str> {
    let mut x: u64 = 7;
    (0..REQUESTS)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ADAPTERS[(x >> 33) as usize % ADAPTERS.len()]
        })
        .collect()
}

/// Two fresh publishing engines of `base` with the four adapters, two resident at most; the
/// sequence sent through a `min_ttft` router with `pricing`; the engines' adapter loads.
async fn loads_with(pricing: AdapterPricing) -> u64 {
    let specs: Vec<String> = ADAPTERS
        .iter()
        .map(|a| format!("{a}=/adapters/{a}"))
        .collect();
    let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
    let mut engines: Vec<Engine> = Vec::new();
    for _ in 0..2 {
        let specs = adapters(&specs);
        let (e, _) = publishing_engine(move |c| {
            c.model_name = "base".into();
            c.adapters = specs;
            c.model.lora = LoraConfig {
                max_loaded: 2,
                load_time_s: 0.05,
            };
        })
        .await;
        engines.push(e);
    }
    let cfg = RouterConfig {
        port: 0,
        worker_urls: engines.iter().map(Engine::url).collect(),
        policy: Policy::MinTtft(MinTtft {
            adapter_pricing: pricing,
            ..Default::default()
        }),
        ..Default::default()
    };
    let r = loadlink_router::start(cfg).await.expect("router starts");
    let c = Client::new();
    for (i, a) in sequence().into_iter().enumerate() {
        let b = body(Route::Completions, Some(&format!("base:{a}")), i % 2 == 1);
        let (status, text) = ask(&c, &r.url(), Route::Completions, &b).await;
        assert_eq!(status, StatusCode::OK, "{b}: {text}");
    }
    let mut loads = 0;
    for e in &engines {
        loads += lora_loads(&c, &e.url()).await;
    }
    r.stop().await;
    for e in engines {
        e.stop().await;
    }
    loads
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_aware_router_keeps_adapters_where_they_are_resident() {
    let blind = loads_with(AdapterPricing::Blind).await;
    let aware = loads_with(AdapterPricing::Aware).await;
    // Four adapters, four slots on two engines: once each is placed, none needs loading again.
    assert!(
        aware <= 2 * ADAPTERS.len() as u64,
        "{aware} adapter loads for {REQUESTS} requests (adapter-blind: {blind})"
    );
}
