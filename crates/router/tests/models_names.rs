//! Which names a router resolves, and what it answers for the rest: the model path is an alias of
//! the served name, an unknown model is a 404 with OpenAI's error object (what the `openai` client
//! turns into `NotFoundError`), a request without a model goes to the default model or is refused
//! naming the field, and no refused request reaches an engine. Checked on the engines' own
//! counters, not only on the router's answer.

use loadlink_engine::{Engine, LoraConfig};
use loadlink_router::LoadSignal;
use loadlink_testkit::fleet_models::{Route, ask, body, refused_with};
use loadlink_testkit::served::{model_engine, model_requests};
use loadlink_testkit::{router, scrape};
use reqwest::{Client, StatusCode};

/// Every request an engine counted, whatever it named.
async fn total(c: &Client, e: &Engine) -> u64 {
    model_requests(c, &e.url()).await.values().sum()
}

/// An engine serving `name` alone, no adapters.
async fn serving(name: &str) -> Engine {
    model_engine(&[name], &[], LoraConfig::default(), |_| {}).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_path_and_every_served_name_reach_that_model_only() {
    let a = model_engine(&["alpha", "alpha-chat"], &[], LoraConfig::default(), |c| {
        c.model_path = Some("/models/alpha-7b".into());
    })
    .await;
    let b = serving("beta").await;
    let r = router(vec![a.url(), b.url()], LoadSignal::Inflight, |_| {}).await;
    let c = Client::new();
    for name in ["/models/alpha-7b", "alpha-chat", "alpha"] {
        for route in [Route::Completions, Route::Chat] {
            let (status, text) = ask(&c, &r.url(), route, &body(route, Some(name), false)).await;
            assert_eq!(status, StatusCode::OK, "{name} on {route:?}: {text}");
        }
    }
    assert_eq!(
        total(&c, &a).await,
        6,
        "{:?}",
        model_requests(&c, &a.url()).await
    );
    assert_eq!(
        total(&c, &b).await,
        0,
        "an alias of alpha reached the beta engine"
    );
    r.stop().await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_model_is_a_404_with_the_openai_error_object() {
    let a = serving("alpha").await;
    let b = serving("beta").await;
    let r = router(vec![a.url(), b.url()], LoadSignal::Inflight, |_| {}).await;
    let c = Client::new();
    for (route, stream) in [
        (Route::Completions, false),
        (Route::Completions, true),
        (Route::Chat, false),
        (Route::Chat, true),
    ] {
        let (status, text) = ask(&c, &r.url(), route, &body(route, Some("nope"), stream)).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "{route:?} stream={stream}: {text}"
        );
        refused_with(&text, "model_not_found", "nope");
    }
    // Many distinct unknown names: each refused, none a label of its own in /metrics.
    for i in 0..40 {
        let name = format!("nope-{i}");
        let b = body(Route::Completions, Some(&name), false);
        let (status, text) = ask(&c, &r.url(), Route::Completions, &b).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
        refused_with(&text, "model_not_found", &name);
    }
    let page = scrape(&c, &r.url()).await;
    for f in page
        .families
        .iter()
        .filter(|f| f.name.starts_with("loadlink_model_"))
    {
        for s in &f.samples {
            let label = s.label("model").unwrap_or_default();
            assert!(
                !label.starts_with("nope"),
                "an unbounded label: {} {label}",
                s.name
            );
        }
    }
    assert_eq!(
        total(&c, &a).await + total(&c, &b).await,
        0,
        "a refused request reached an engine"
    );
    r.stop().await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_model_goes_to_the_only_model() {
    let engines = [serving("alpha").await, serving("alpha").await];
    let urls = engines.iter().map(Engine::url).collect();
    let r = router(urls, LoadSignal::Inflight, |_| {}).await;
    let c = Client::new();
    for (route, model) in [
        (Route::Generate, None),
        (Route::Generate, Some("default")),
        (Route::Completions, None),
        (Route::Chat, Some("default")),
    ] {
        let (status, text) = ask(&c, &r.url(), route, &body(route, model, false)).await;
        assert_eq!(status, StatusCode::OK, "{route:?} model={model:?}: {text}");
    }
    let mut served = 0;
    for e in &engines {
        served += total(&c, e).await;
    }
    assert_eq!(
        served, 4,
        "the four requests, each served by an alpha engine"
    );
    r.stop().await;
    for e in engines {
        e.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_default_model_several_models_refuse_a_request_without_one() {
    let a = serving("alpha").await;
    let b = serving("beta").await;
    let r = router(vec![a.url(), b.url()], LoadSignal::Inflight, |_| {}).await;
    let c = Client::new();
    for (route, model) in [
        (Route::Generate, None),
        (Route::Completions, None),
        (Route::Completions, Some("default")),
    ] {
        let (status, text) = ask(&c, &r.url(), route, &body(route, model, false)).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{route:?} model={model:?}: {text}"
        );
        // Named in the message, as `param`, and by code; the message lists the models served.
        let v = refused_with(&text, "model_required", "model");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("alpha") && message.contains("beta"), "{v}");
    }
    assert_eq!(
        total(&c, &a).await + total(&c, &b).await,
        0,
        "a refused request reached an engine"
    );
    r.stop().await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_model_takes_requests_without_one() {
    let a = serving("alpha").await;
    let b = serving("beta").await;
    let r = router(vec![a.url(), b.url()], LoadSignal::Inflight, |cfg| {
        cfg.default_model = Some("beta".into());
    })
    .await;
    let c = Client::new();
    let asks = [
        (Route::Generate, None),
        (Route::Completions, Some("default")),
        (Route::Chat, None),
        (Route::Completions, Some("alpha")),
    ];
    for (route, model) in asks {
        let (status, text) = ask(&c, &r.url(), route, &body(route, model, false)).await;
        assert_eq!(status, StatusCode::OK, "{route:?} model={model:?}: {text}");
    }
    // Three for the default model, one named alpha: each on an engine of its model.
    assert_eq!(
        total(&c, &b).await,
        3,
        "{:?}",
        model_requests(&c, &b.url()).await
    );
    let on_alpha = model_requests(&c, &a.url()).await;
    assert_eq!(on_alpha.values().sum::<u64>(), 1, "{on_alpha:?}");
    assert_eq!(on_alpha.get("alpha"), Some(&1), "{on_alpha:?}");
    r.stop().await;
    a.stop().await;
    b.stop().await;
}
