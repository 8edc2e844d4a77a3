//! Load sources end to end, on loopback with real engines: a worker without a load socket is
//! priced from `GET /v1/loads` (SGLang) or `GET /metrics` (`--flavor vllm`), polled by the fleet;
//! `/workers` and `/metrics` show each worker's source and age; a poll target that dies leaves its
//! worker on in-flight, with the reason.
//!
//! Load changes come from direct clients (requests sent to the engine, not through the router),
//! so only the polled snapshots can show them to the router.

use loadlink_engine::{Engine, Flavor};
use loadlink_router::{LoadSignal, RouterHandle};
use loadlink_testkit::{
    get_json, http_worker, publishing_engine, router, scrape, wait_until, wait_worker, worker_json,
};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::task::JoinHandle;

/// `n` long requests sent straight to the engine, held open until aborted.
fn direct_clients(engine_url: &str, n: usize) -> Vec<JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let url = format!("{engine_url}/v1/completions");
            tokio::spawn(async move {
                let body = json!({"prompt": format!("direct client {i}"), "max_tokens": 20_000});
                let _ = reqwest::Client::new().post(url).json(&body).send().await;
            })
        })
        .collect()
}

fn polls(w: &Value) -> u64 {
    w["load_polls"]["polls"].as_u64().unwrap_or(0)
}

async fn stop(engine: Engine, clients: Vec<JoinHandle<()>>) {
    clients.iter().for_each(JoinHandle::abort);
    engine.stop_within(Duration::from_millis(200)).await;
}

/// Waits until the engine's own load (read by `read`) is `n`, then until the router has
/// completed a poll that started after that; the router must then show `n`.
async fn router_follows_engine(
    r: &RouterHandle,
    engine_url: &str,
    n: i64,
    read: impl AsyncFn(&reqwest::Client) -> Result<i64, String>,
) {
    let c = reqwest::Client::new();
    wait_until("the engine to report the direct clients", 20, || async {
        match read(&c).await? {
            got if got == n => Ok(()),
            got => Err(format!("engine load {got}")),
        }
    })
    .await;
    let seen = polls(&worker_json(&c, &r.url(), engine_url).await);
    // The poll in flight when the engine changed may predate the change; the next one cannot.
    let w = wait_worker(r, engine_url, "two more polls", |w| polls(w) >= seen + 2).await;
    assert_eq!(w["load"], n, "{w}");
    assert_eq!(w["source"], "engine", "{w}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_without_a_load_socket_is_priced_from_v1_loads_within_one_interval() {
    let engine = loadlink_testkit::engine(|_| {}).await;
    let url = engine.url();
    let r = router(vec![url.clone()], LoadSignal::Engine, |c| {
        c.load_poll_interval_ms = 100;
    })
    .await;
    let w = wait_worker(&r, &url, "a polled, engine-priced worker", |w| {
        w["source"] == "engine"
    })
    .await;
    assert_eq!(w["load_source"], "poll_loads", "{w}");
    assert_eq!(w["load_source_configured"], "poll_loads");
    assert!(w["load_source_reason"].is_null(), "{w}");
    assert!(w["age_ms"].as_u64().is_some_and(|a| a <= 3000), "{w}");
    assert_eq!(w["load"], 0);
    let clients = direct_clients(&url, 20);
    router_follows_engine(&r, &url, 20, async |c: &reqwest::Client| {
        let v = get_json(c, &format!("{url}/v1/loads")).await;
        let l = &v["loads"][0];
        Ok(l["num_running_reqs"].as_i64().unwrap_or(0)
            + l["num_waiting_reqs"].as_i64().unwrap_or(0))
    })
    .await;
    r.stop().await;
    stop(engine, clients).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_flavor_engine_is_priced_from_metrics() {
    let engine = loadlink_testkit::engine(|c| {
        c.flavor = Flavor::Vllm;
        c.dp_size = 2;
    })
    .await;
    let url = engine.url();
    let r = router(vec![url.clone()], LoadSignal::Engine, |c| {
        c.load_poll_interval_ms = 100;
    })
    .await;
    let w = wait_worker(&r, &url, "a scraped worker", |w| w["source"] == "engine").await;
    assert_eq!(w["load_source"], "scrape_metrics", "{w}");
    assert_eq!(w["dp_size"], 2, "{w}");
    let clients = direct_clients(&url, 24);
    router_follows_engine(&r, &url, 24, async |c: &reqwest::Client| {
        let page = scrape(c, &url).await;
        let sum = |name: &str| page.samples(name).map(|s| s.value).sum::<f64>() as i64;
        Ok(sum("vllm:num_requests_running") + sum("vllm:num_requests_waiting"))
    })
    .await;
    r.stop().await;
    stop(engine, clients).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_shows_each_workers_source_and_age() {
    let (pushing, _) = publishing_engine(|_| {}).await;
    let polled = loadlink_testkit::engine(|_| {}).await;
    let scraped = loadlink_testkit::engine(|c| c.flavor = Flavor::Vllm).await;
    let bare = http_worker(None).await;
    let urls = [pushing.url(), polled.url(), scraped.url(), bare.clone()];
    let r = router(urls.to_vec(), LoadSignal::Backlog, |_| {}).await;
    let want = ["push", "poll_loads", "scrape_metrics", "inflight"];
    for (url, source) in urls.iter().zip(want) {
        let w = wait_worker(&r, url, "its first snapshot", |w| {
            w["load_source_configured"] == source
                && (source == "inflight" || w["source"] == "engine")
        })
        .await;
        assert_eq!(w["load_source"], source, "{w}");
        if source == "inflight" {
            assert!(w["age_ms"].is_null(), "{w}");
            let reason = w["load_source_reason"].as_str().unwrap_or_default();
            assert!(
                reason.contains("no HTTP load source") && reason.contains("/metrics"),
                "{w}"
            );
        } else {
            assert!(w["age_ms"].as_u64().is_some(), "{w}");
            assert!(w["load_source_reason"].is_null(), "{w}");
        }
    }
    let c = reqwest::Client::new();
    let page = scrape(&c, &r.url()).await;
    for (url, source) in urls.iter().zip(want) {
        let labels = [
            ("worker", url.as_str()),
            ("source", source),
            ("configured", source),
        ];
        assert_eq!(
            page.value("loadlink_worker_load_source", &labels),
            Some(1.0),
            "{url}"
        );
    }
    let polls = |url: &str| page.value("loadlink_worker_load_polls_total", &[("worker", url)]);
    assert!(polls(&polled.url()).is_some_and(|n| n >= 1.0));
    assert!(polls(&scraped.url()).is_some_and(|n| n >= 1.0));
    assert_eq!(
        polls(&pushing.url()),
        None,
        "push workers have no poll counters"
    );
    assert!(
        page.samples("loadlink_worker_load_poll_seconds_count")
            .count()
            == 2,
        "one latency histogram per polled worker"
    );
    r.stop().await;
    for e in [pushing, polled, scraped] {
        e.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_poll_target_falls_back_to_in_flight_with_the_reason() {
    let engine = loadlink_testkit::engine(|_| {}).await;
    let url = engine.url();
    let r = router(vec![url.clone()], LoadSignal::Engine, |c| {
        c.load_poll_interval_ms = 50;
        c.freshness_ms = 500;
    })
    .await;
    wait_worker(&r, &url, "a polled, engine-priced worker", |w| {
        w["source"] == "engine"
    })
    .await;
    engine.stop().await;
    let w = wait_worker(&r, &url, "the fallback to in-flight", |w| {
        w["load_source"] == "inflight"
    })
    .await;
    assert_eq!(w["source"], "fallback", "{w}");
    assert_eq!(w["load_source_configured"], "poll_loads", "{w}");
    let reason = w["load_source_reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("poll_loads")
            && reason.contains("last poll failed")
            && reason.contains("GET /v1/loads"),
        "{reason}"
    );
    assert!(
        w["load_polls"]["failures"].as_u64().is_some_and(|n| n >= 1),
        "{w}"
    );
    let page = scrape(&reqwest::Client::new(), &r.url()).await;
    let labels = [
        ("worker", url.as_str()),
        ("source", "inflight"),
        ("configured", "poll_loads"),
    ];
    assert_eq!(
        page.value("loadlink_worker_load_source", &labels),
        Some(1.0)
    );
    assert!(
        page.value(
            "loadlink_worker_load_poll_failures_total",
            &[("worker", url.as_str())]
        )
        .is_some_and(|n| n >= 1.0)
    );
    r.stop().await;
}
