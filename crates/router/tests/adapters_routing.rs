//! LoRA adapters behind one router: a request selects an adapter as SGLang does
//! (`model: "base:adapter"`, or `lora_path` in the body) or as vLLM does (the adapter's name as
//! `model`), and only the engines of the base model that have that adapter are candidates. Proven
//! from the engines' own request counters, phase by phase: during a phase only the engines that
//! have the adapter count anything.

use loadlink_engine::served::UNSERVED;
use loadlink_engine::{Engine, LoraConfig};
use loadlink_router::LoadSignal;
use loadlink_testkit::fleet_models::{Route, ask, body, listed_models, refused_with};
use loadlink_testkit::served::{
    adapters, lora_loads, model_engine, model_requests, restart_on_same_port,
};
use loadlink_testkit::{router, wait_until};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

/// Requests per phase.
const PER_PHASE: usize = 12;

/// Every request each engine counted so far, whatever it named.
async fn totals(c: &Client, engines: &[Engine]) -> Vec<u64> {
    let mut t = Vec::with_capacity(engines.len());
    for e in engines {
        t.push(model_requests(c, &e.url()).await.values().sum());
    }
    t
}

/// Sends `PER_PHASE` copies of `b` (completions and chat, JSON and streamed); each must be 200.
/// Returns how many each engine counted during the phase.
async fn phase(c: &Client, router_url: &str, engines: &[Engine], b: &Value) -> Vec<u64> {
    let before = totals(c, engines).await;
    for i in 0..PER_PHASE {
        let route = if i % 2 == 0 {
            Route::Completions
        } else {
            Route::Chat
        };
        let mut one = body(route, None, i % 4 >= 2);
        for (k, v) in b.as_object().expect("a phase body is an object") {
            one[k] = v.clone();
        }
        let (status, text) = ask(c, router_url, route, &one).await;
        assert_eq!(status, StatusCode::OK, "{one}: {text}");
    }
    let after = totals(c, engines).await;
    after.iter().zip(&before).map(|(a, b)| a - b).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_reach_only_the_engines_that_have_them() {
    // e0: a1 and a2; e1: a2 and a3; e2: the base model alone.
    let lora = LoraConfig {
        max_loaded: 1,
        load_time_s: 0.01,
    };
    let engines = vec![
        model_engine(
            &["base"],
            &["a1=/adapters/a1", "a2=/adapters/a2"],
            lora,
            |_| {},
        )
        .await,
        model_engine(
            &["base"],
            &["a2=/adapters/a2", "a3=/adapters/a3"],
            lora,
            |_| {},
        )
        .await,
        model_engine(&["base"], &[], LoraConfig::default(), |_| {}).await,
    ];
    let urls: Vec<String> = engines.iter().map(Engine::url).collect();
    let r = router(urls.clone(), LoadSignal::Inflight, |_| {}).await;
    let c = Client::new();
    let n = PER_PHASE as u64;

    let got = phase(&c, &r.url(), &engines, &json!({ "model": "base:a1" })).await;
    assert_eq!(
        got,
        [n, 0, 0],
        "base:a1 (SGLang) reached an engine without a1"
    );
    let got = phase(
        &c,
        &r.url(),
        &engines,
        &json!({ "model": "base", "lora_path": "a1" }),
    )
    .await;
    assert_eq!(got, [n, 0, 0], "lora_path a1 reached an engine without a1");
    let got = phase(&c, &r.url(), &engines, &json!({ "model": "a3" })).await;
    assert_eq!(
        got,
        [0, n, 0],
        "a3 (vLLM style) reached an engine without a3"
    );
    let got = phase(&c, &r.url(), &engines, &json!({ "model": "base:a2" })).await;
    assert_eq!(got[2], 0, "base:a2 reached the engine without adapters");
    assert_eq!(got[0] + got[1], n);
    let got = phase(&c, &r.url(), &engines, &json!({ "model": "base" })).await;
    assert_eq!(
        got.iter().sum::<u64>(),
        n,
        "the base model is served by all three"
    );

    // An adapter nobody has: refused, and no engine counts it.
    let before = totals(&c, &engines).await;
    let b = body(Route::Completions, Some("base:zz"), false);
    let (status, text) = ask(&c, &r.url(), Route::Completions, &b).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    refused_with(&text, "model_not_found", "zz");
    assert_eq!(totals(&c, &engines).await, before);

    for e in &engines {
        let counts = model_requests(&c, &e.url()).await;
        assert_eq!(counts.get(UNSERVED), Some(&0), "{}: {counts:?}", e.url());
    }
    assert!(lora_loads(&c, &urls[0]).await >= 1, "e0 loaded a1");
    assert_eq!(
        lora_loads(&c, &urls[2]).await,
        0,
        "e2 has no adapter to load"
    );

    // /v1/models: the base once with all three, each adapter once with its parent and its engines.
    let (listed, page) = listed_models(&c, &r.url()).await;
    let mut all = urls.clone();
    all.sort();
    assert_eq!(listed.get("base"), Some(&all), "{page}");
    let sorted = |v: &[&String]| {
        let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    };
    assert_eq!(listed.get("a1"), Some(&sorted(&[&urls[0]])), "{page}");
    assert_eq!(
        listed.get("a2"),
        Some(&sorted(&[&urls[0], &urls[1]])),
        "{page}"
    );
    assert_eq!(listed.get("a3"), Some(&sorted(&[&urls[1]])), "{page}");
    for m in page["data"].as_array().expect("a data array") {
        let parent = if m["id"] == "base" {
            Value::Null
        } else {
            json!("base")
        };
        assert_eq!(m["parent"], parent, "{m}");
    }
    r.stop().await;
    for e in engines {
        e.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_engines_adapters_are_learned_from_their_model_list() {
    // vLLM has no /server_info: what each engine serves comes from its /v1/models alone.
    let lora = LoraConfig {
        max_loaded: 1,
        load_time_s: 0.01,
    };
    let vllm = |c: &mut loadlink_engine::EngineConfig| c.flavor = loadlink_engine::Flavor::Vllm;
    let engines = vec![
        model_engine(&["m"], &["x1=/adapters/x1"], lora, vllm).await,
        model_engine(&["m"], &["x2=/adapters/x2"], lora, vllm).await,
    ];
    let urls: Vec<String> = engines.iter().map(Engine::url).collect();
    let r = router(urls.clone(), LoadSignal::Inflight, |_| {}).await;
    let c = Client::new();
    let n = PER_PHASE as u64;
    let got = phase(&c, &r.url(), &engines, &json!({ "model": "x1" })).await;
    assert_eq!(got, [n, 0], "x1 reached the engine without it");
    let got = phase(&c, &r.url(), &engines, &json!({ "model": "x2" })).await;
    assert_eq!(got, [0, n], "x2 reached the engine without it");
    let got = phase(&c, &r.url(), &engines, &json!({ "model": "m" })).await;
    assert_eq!(got.iter().sum::<u64>(), n);
    for e in &engines {
        let counts = model_requests(&c, &e.url()).await;
        assert_eq!(counts.get(UNSERVED), Some(&0), "{}: {counts:?}", e.url());
    }
    let (listed, page) = listed_models(&c, &r.url()).await;
    assert_eq!(listed.get("x1"), Some(&vec![urls[0].clone()]), "{page}");
    assert_eq!(listed.get("x2"), Some(&vec![urls[1].clone()]), "{page}");
    r.stop().await;
    for e in engines {
        e.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_drops_an_adapter_is_re_registered_without_it() {
    let lora = LoraConfig {
        max_loaded: 2,
        load_time_s: 0.01,
    };
    let specs = ["a1=/adapters/a1", "a2=/adapters/a2"];
    let first = model_engine(&["base"], &specs, lora, |_| {}).await;
    let other = model_engine(&["base"], &specs, lora, |_| {}).await;
    let r = router(
        vec![first.url(), other.url()],
        LoadSignal::Inflight,
        |cfg| {
            cfg.model_refresh_ms = 1000;
        },
    )
    .await;
    let c = Client::new();
    // The first address comes back with a2 only.
    let port = first.addr.port();
    let again = restart_on_same_port(first, |cfg| {
        cfg.model_name = "base".into();
        cfg.adapters = adapters(&["a2=/adapters/a2"]);
        cfg.model.lora = lora;
    })
    .await;
    assert_eq!(again.addr.port(), port);
    let (again_url, other_url) = (again.url(), other.url());
    wait_until("a1 listed on the other engine alone", 20, || async {
        let (listed, page) = listed_models(&c, &r.url()).await;
        let a2_on_both = listed.get("a2").is_some_and(|w| w.len() == 2);
        if listed.get("a1") == Some(&vec![other_url.clone()]) && a2_on_both {
            Ok(())
        } else {
            Err(page.to_string())
        }
    })
    .await;
    let engines = [again, other];
    let n = PER_PHASE as u64;
    let got = phase(&c, &r.url(), &engines, &json!({ "model": "base:a1" })).await;
    assert_eq!(
        got,
        [0, n],
        "a1 reached {again_url}, which no longer has it"
    );
    let got = phase(
        &c,
        &r.url(),
        &engines,
        &json!({ "model": "base", "lora_path": "a2" }),
    )
    .await;
    assert_eq!(got.iter().sum::<u64>(), n);
    for e in &engines {
        let counts = model_requests(&c, &e.url()).await;
        assert_eq!(counts.get(UNSERVED), Some(&0), "{}: {counts:?}", e.url());
    }
    r.stop().await;
    for e in engines {
        e.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_adapter_name_under_two_base_models_is_never_mixed() {
    // Two tenants' adapters share a name ("sql") but are different adapters of different models.
    let lora = LoraConfig {
        max_loaded: 2,
        load_time_s: 0.01,
    };
    let engines = vec![
        model_engine(&["m1"], &["sql=/adapters/m1-sql"], lora, |_| {}).await,
        model_engine(&["m2"], &["sql=/adapters/m2-sql"], lora, |_| {}).await,
    ];
    let urls: Vec<String> = engines.iter().map(Engine::url).collect();
    let r = router(urls.clone(), LoadSignal::Inflight, |_| {}).await;
    let c = Client::new();
    let n = PER_PHASE as u64;
    // Named with its base, each reaches its own model's engine.
    assert_eq!(
        phase(&c, &r.url(), &engines, &json!({ "model": "m1:sql" })).await,
        [n, 0]
    );
    assert_eq!(
        phase(
            &c,
            &r.url(),
            &engines,
            &json!({ "model": "m2", "lora_path": "sql" })
        )
        .await,
        [0, n]
    );
    // Each listed adapter's workers are engines of its parent, with that adapter's path.
    let (_, page) = listed_models(&c, &r.url()).await;
    for m in page["data"].as_array().expect("a data array") {
        if m["id"] == "sql" {
            let parent = m["parent"].as_str().expect("an adapter has a parent");
            let own = if parent == "m1" { &urls[0] } else { &urls[1] };
            assert_eq!(
                m["workers"],
                json!([own]),
                "sql of {parent} listed on another model's engine: {page}"
            );
        }
    }
    // The bare name is ambiguous: never served by both models' engines (a refusal is fine).
    let before = totals(&c, &engines).await;
    let mut answered = Vec::new();
    for _ in 0..PER_PHASE {
        let b = body(Route::Completions, Some("sql"), false);
        answered.push(ask(&c, &r.url(), Route::Completions, &b).await.0);
    }
    let after = totals(&c, &engines).await;
    let got: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(
        got[0] == 0 || got[1] == 0,
        "bare `sql` was served by m1's and m2's adapters: {got:?} {answered:?}"
    );
    r.stop().await;
    for e in engines {
        e.stop().await;
    }
}
