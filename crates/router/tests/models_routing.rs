//! Routing by `model` across a fleet whose engines serve different models, proven from the
//! engines' own counters: every engine counts each request under the name it asked for, or under
//! `<unserved>` when it serves nothing of that name. A router that misroutes shows there, whatever
//! its own `/workers` or `/metrics` say.
//!
//! The fleet is built to tempt a wrong pick: every model is asked the same prompt, so the KV index
//! believes a beta prompt is cached on the alpha engines that served it first; workers join,
//! leave and rejoin through the admin API while requests for every model flow, so a router that
//! routes to a worker before it knows that worker's models (or after it left) is caught.

use loadlink_engine::served::UNSERVED;
use loadlink_engine::{Engine, LoraConfig};
use loadlink_router::{LoadSignal, RouterConfig, RouterHandle};
use loadlink_testkit::fleet_models::{
    Route, admin_add, admin_remove, ask, body, listed_models, refused_with,
};
use loadlink_testkit::served::{model_engine, model_requests, restart_on_same_port};
use loadlink_testkit::{publishing_engine, router, scrape, wait_until, workers};
use reqwest::{Client, StatusCode};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};

const TOKEN: &str = "models-admin";
const MODELS: [&str; 3] = ["alpha", "beta", "gamma"];
/// The router's model refresh interval in the re-registration test, in ms.
const REFRESH_MS: u64 = 1000;
/// Requests answered by each fleet state before the next membership change.
const PER_STATE: u64 = 24;
/// Requests in flight at once while traffic flows.
const CONCURRENCY: usize = 8;

/// A publishing engine (KV events and load) serving `model`, its model path `/models/<model>`.
async fn engine_serving(model: &str) -> Engine {
    publishing_engine(|c| {
        c.model_name = model.into();
        c.model_path = Some(format!("/models/{model}"));
    })
    .await
    .0
}

/// One counter of an engine's per-model requests, 0 when absent.
fn count(counts: &BTreeMap<String, u64>, label: &str) -> u64 {
    counts.get(label).copied().unwrap_or(0)
}

/// The router under test with its default policy (min_ttft on the engines' published loads and
/// KV events), the admin API on, and `urls` as its first workers.
async fn default_router(urls: Vec<String>) -> RouterHandle {
    let cfg = RouterConfig {
        port: 0,
        worker_urls: urls,
        admin_token: Some(TOKEN.into()),
        ..Default::default()
    };
    loadlink_router::start(cfg).await.expect("router starts")
}

/// Requests in flight: answered so far, and whether the lanes may stop once they sent their share.
#[derive(Default)]
struct Flow {
    answered: AtomicU64,
    may_stop: AtomicBool,
}

impl Flow {
    /// Waits (bounded) until `n` more requests have been answered.
    async fn wait_answered(&self, n: u64) {
        let target = self.answered.load(Relaxed) + n;
        wait_until("requests answered through the router", 30, || async {
            let answered = self.answered.load(Relaxed);
            if answered >= target {
                Ok(())
            } else {
                Err(format!("{answered} of {target}"))
            }
        })
        .await
    }
}

/// Sends requests numbered from `first` through `router_url`, `CONCURRENCY` at a time, over
/// `models`, completions and chat, JSON and streamed, each answered 200: at least `min`, and on
/// until `flow.may_stop`. Returns how many were sent per model.
async fn traffic(
    c: &Client,
    router_url: &str,
    models: &'static [&'static str],
    first: usize,
    min: usize,
    flow: Arc<Flow>,
) -> BTreeMap<String, u64> {
    let tasks = (0..CONCURRENCY).map(|lane| {
        let (c, url, flow) = (c.clone(), router_url.to_string(), flow.clone());
        tokio::spawn(async move {
            let mut sent = BTreeMap::<String, u64>::new();
            let mut i = first + lane;
            while i < first + min || !flow.may_stop.load(Relaxed) {
                let model = models[i % models.len()];
                let route = if (i / 2).is_multiple_of(2) {
                    Route::Completions
                } else {
                    Route::Chat
                };
                let b = body(route, Some(model), (i / 4) % 2 == 1);
                let (status, text) = ask(&c, &url, route, &b).await;
                assert_eq!(status, StatusCode::OK, "request {i} {b}: {text}");
                *sent.entry(model.to_string()).or_default() += 1;
                flow.answered.fetch_add(1, Relaxed);
                i += CONCURRENCY;
            }
            sent
        })
    });
    let mut sent = BTreeMap::new();
    for lane in futures_util::future::join_all(tasks).await {
        for (m, k) in lane.expect("a traffic lane") {
            *sent.entry(m).or_default() += k;
        }
    }
    sent
}

/// Waits until the router's `/v1/models` lists exactly `want` (model → number of workers).
async fn wait_listed(c: &Client, r: &RouterHandle, want: &[(&str, usize)]) {
    let want: BTreeMap<String, usize> = want.iter().map(|(m, k)| (m.to_string(), *k)).collect();
    wait_until("the router's /v1/models to list the fleet", 20, || async {
        let (listed, page) = listed_models(c, &r.url()).await;
        let seen: BTreeMap<String, usize> =
            listed.iter().map(|(m, w)| (m.clone(), w.len())).collect();
        if seen == want {
            Ok(())
        } else {
            Err(page.to_string())
        }
    })
    .await
}

/// Adds `sent_more` into `sent`.
fn add_into(sent: &mut BTreeMap<String, u64>, sent_more: BTreeMap<String, u64>) {
    for (m, k) in sent_more {
        *sent.entry(m).or_default() += k;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_is_misrouted_across_three_models_while_workers_come_and_go() {
    let mut engines: Vec<(Engine, &str)> = Vec::new();
    for model in ["alpha", "alpha", "alpha", "beta", "beta", "gamma"] {
        engines.push((engine_serving(model).await, model));
    }
    let url = |i: usize| engines[i].0.url();
    // The second beta engine joins later, and the third alpha engine leaves and comes back.
    let r = default_router(vec![url(0), url(1), url(2), url(3), url(5)]).await;
    let c = Client::new();
    wait_listed(&c, &r, &[("alpha", 3), ("beta", 1), ("gamma", 1)]).await;

    // Requests flow for the whole time the fleet changes: the lanes stop only after the last
    // change is listed (and after 150 requests).
    let flow = Arc::new(Flow::default());
    let flowing = tokio::spawn({
        let (c, r, flow) = (c.clone(), r.url(), flow.clone());
        async move { traffic(&c, &r, &MODELS, 0, 150, flow).await }
    });
    // Each change is made while requests are in flight, and each fleet it leaves serves
    // `PER_STATE` answered requests before the next change.
    flow.wait_answered(PER_STATE).await;
    assert_eq!(
        admin_add(&c, &r.url(), TOKEN, &url(4)).await,
        StatusCode::CREATED
    );
    wait_listed(&c, &r, &[("alpha", 3), ("beta", 2), ("gamma", 1)]).await;
    flow.wait_answered(PER_STATE).await;
    assert_eq!(
        admin_remove(&c, &r.url(), TOKEN, &url(2)).await,
        StatusCode::NO_CONTENT
    );
    wait_listed(&c, &r, &[("alpha", 2), ("beta", 2), ("gamma", 1)]).await;
    flow.wait_answered(PER_STATE).await;
    assert_eq!(
        admin_add(&c, &r.url(), TOKEN, &url(2)).await,
        StatusCode::CREATED
    );
    wait_listed(&c, &r, &[("alpha", 3), ("beta", 2), ("gamma", 1)]).await;
    flow.wait_answered(PER_STATE).await;
    flow.may_stop.store(true, Relaxed);
    let mut sent = flowing
        .await
        .expect("the traffic during membership changes");
    let done = Arc::new(Flow::default());
    done.may_stop.store(true, Relaxed);
    add_into(
        &mut sent,
        traffic(&c, &r.url(), &MODELS, 150, 90, done).await,
    );

    // The joined beta engine takes beta requests (bounded: until it has served one).
    let joined = url(4);
    let mut extra = 0;
    wait_until("the joined beta engine to serve a beta request", 30, || {
        extra += 1;
        let (c, r, joined) = (c.clone(), r.url(), joined.clone());
        async move {
            let b = body(Route::Completions, Some("beta"), false);
            let (status, text) = ask(&c, &r, Route::Completions, &b).await;
            assert_eq!(status, StatusCode::OK, "{text}");
            let served = count(&model_requests(&c, &joined).await, "beta");
            if served > 0 {
                Ok(())
            } else {
                Err("the joined beta engine served none")
            }
        }
    })
    .await;
    *sent.entry("beta".into()).or_default() += extra;
    let total: u64 = sent.values().sum();
    assert!(total >= 240, "only {total} requests sent: {sent:?}");

    // The engines' word: nothing unserved anywhere, and each model's requests all counted by
    // the engines that serve it.
    let mut served = BTreeMap::<String, u64>::new();
    for (e, model) in &engines {
        let counts = model_requests(&c, &e.url()).await;
        for (label, k) in &counts {
            assert!(
                label == model || *k == 0,
                "{} serves {model} but counted {k} request(s) for {label:?} (all: {counts:?})",
                e.url()
            );
        }
        assert_eq!(count(&counts, UNSERVED), 0, "{}: {counts:?}", e.url());
        *served.entry(model.to_string()).or_default() += count(&counts, model);
    }
    for m in MODELS {
        let want = sent.get(m).copied().unwrap_or(0);
        assert_eq!(
            served.get(m).copied().unwrap_or(0),
            want,
            "{m}: sent {sent:?}, engines counted {served:?}"
        );
    }

    // The router's views agree: each worker's models in /workers, per-model figures in /metrics.
    for w in workers(&c, &r.url()).await {
        let (_, model) = engines
            .iter()
            .find(|(e, _)| e.url() == w["url"])
            .unwrap_or_else(|| panic!("an unknown worker in /workers: {w}"));
        let names = w["models"]["names"].as_array();
        let names = names.unwrap_or_else(|| panic!("no models.names: {w}"));
        assert!(names.iter().any(|m| m == model), "{w}");
    }
    let page = scrape(&c, &r.url()).await;
    for (m, k) in [("alpha", 3.0), ("beta", 2.0), ("gamma", 1.0)] {
        let workers = page.value("loadlink_model_workers", &[("model", m)]);
        assert_eq!(workers, Some(k), "loadlink_model_workers{{model={m:?}}}");
        let requests = page.value("loadlink_model_requests_total", &[("model", m)]);
        assert_eq!(
            requests,
            Some(sent[m] as f64),
            "loadlink_model_requests_total{{model={m:?}}}"
        );
    }
    r.stop().await;
    for (e, _) in engines {
        e.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_changes_its_model_is_re_registered() {
    let c = Client::new();
    let off = LoraConfig::default();
    let first = model_engine(&["alpha"], &[], off, |_| {}).await;
    let other = model_engine(&["beta"], &[], off, |_| {}).await;
    let r = router(
        vec![first.url(), other.url()],
        LoadSignal::Inflight,
        |cfg| {
            cfg.model_refresh_ms = REFRESH_MS;
        },
    )
    .await;
    let alpha = body(Route::Completions, Some("alpha"), false);
    let gamma = body(Route::Completions, Some("gamma"), false);
    let (status, text) = ask(&c, &r.url(), Route::Completions, &alpha).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let (status, text) = ask(&c, &r.url(), Route::Completions, &gamma).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "no worker serves gamma yet: {text}"
    );

    // The same address now serves gamma instead of alpha.
    let second = restart_on_same_port(first, |cfg| cfg.model_name = "gamma".into()).await;
    // Bounded by a few refreshes and the health check that sees the address answer again.
    let bound = 20;
    wait_until(
        "gamma to be routed to the re-registered worker",
        bound,
        || async {
            let (status, text) = ask(&c, &r.url(), Route::Completions, &gamma).await;
            if status == StatusCode::OK {
                Ok(())
            } else {
                Err(format!("{status}: {text}"))
            }
        },
    )
    .await;
    wait_until("alpha to be no longer routed there", bound, || async {
        let (status, text) = ask(&c, &r.url(), Route::Completions, &alpha).await;
        if status == StatusCode::NOT_FOUND {
            Ok(text)
        } else {
            Err(format!("{status}: {text}"))
        }
    })
    .await;
    let (status, text) = ask(&c, &r.url(), Route::Completions, &alpha).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    refused_with(&text, "model_not_found", "alpha");
    let counts = model_requests(&c, &second.url()).await;
    assert_eq!(
        count(&counts, UNSERVED),
        0,
        "the new engine got a request for alpha: {counts:?}"
    );
    assert!(count(&counts, "gamma") >= 1, "{counts:?}");
    let counts = model_requests(&c, &other.url()).await;
    assert_eq!(
        count(&counts, UNSERVED),
        0,
        "the beta engine got another model's request: {counts:?}"
    );
    let (listed, page) = listed_models(&c, &r.url()).await;
    assert!(
        listed.contains_key("gamma") && !listed.contains_key("alpha"),
        "{page}"
    );
    r.stop().await;
    second.stop().await;
    other.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ranks_of_a_worker_are_candidates_for_its_model_only() {
    // Two DP ranks per engine, routed per rank: the candidates of a model are the ranks of its
    // workers, never a rank of another model's worker.
    let ranked = |model: &'static str| {
        publishing_engine(move |c| {
            c.model_name = model.into();
            c.dp_size = 2;
        })
    };
    let (alpha, _) = ranked("alpha").await;
    let (beta, _) = ranked("beta").await;
    let r = default_router(vec![alpha.url(), beta.url()]).await;
    let c = Client::new();
    wait_listed(&c, &r, &[("alpha", 1), ("beta", 1)]).await;
    let flow = Arc::new(Flow::default());
    flow.may_stop.store(true, Relaxed);
    let sent = traffic(&c, &r.url(), &["alpha", "beta"], 0, 48, flow).await;
    for (e, model) in [(&alpha, "alpha"), (&beta, "beta")] {
        let counts = model_requests(&c, &e.url()).await;
        assert_eq!(count(&counts, UNSERVED), 0, "{model}: {counts:?}");
        let want = sent.get(model).copied().unwrap_or(0);
        assert_eq!(count(&counts, model), want, "{model}: {counts:?}");
    }
    let w = workers(&c, &r.url()).await;
    assert!(
        w.iter().all(|w| w["rank_routing"]["mode"] == "per-rank"),
        "{w:?}"
    );
    r.stop().await;
    alpha.stop().await;
    beta.stop().await;
}
