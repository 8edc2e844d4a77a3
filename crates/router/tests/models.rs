//! `GET /v1/models` against hostile workers: an answer that stalls or is oversized is cut off
//! within the fan-out budget and counted as that worker's refusal, the healthy workers' models are
//! still listed, and a flood of calls costs each worker one fan-out per interval, not one per call.

use loadlink_router::LoadSignal;
use loadlink_testkit::hostile_http::{HostileWorker, Reply};
use loadlink_testkit::{get_json, router, worker_json};
use serde_json::json;
use std::time::Duration;

/// A fake worker that discovers (no load source: priced on in-flight) and lists `model`.
async fn lister(model: &str) -> HostileWorker {
    let w = HostileWorker::start().await;
    w.on("/server_info", Reply::json(&json!({ "dp_size": 1 })));
    w.on(
        "/v1/models",
        Reply::json(&json!({ "object": "list", "data": [{ "id": model }] })),
    );
    w
}

fn ids(list: &serde_json::Value) -> Vec<String> {
    let mut ids: Vec<String> = list["data"]
        .as_array()
        .expect("a data array")
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_answers_are_cut_off_and_counted() {
    let good = lister("good-model").await;
    let stalled = lister("stalled-model").await;
    stalled.on("/v1/models", Reply::StallAfterHeaders { declared: 4096 });
    let big = lister("big-model").await;
    big.on(
        "/v1/models",
        Reply::Oversized {
            bytes: 16 << 20,
            declared: false,
        },
    );
    let r = router(
        vec![good.url(), stalled.url(), big.url()],
        LoadSignal::Inflight,
        |c| {
            c.budgets.fanout_timeout = Duration::from_millis(500);
            c.budgets.fanout_body_bytes = 64 << 10;
        },
    )
    .await;
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let list = get_json(&c, &format!("{}/v1/models", r.url())).await;
    assert_eq!(ids(&list), ["good-model"]);
    let w = worker_json(&c, &r.url(), &stalled.url()).await;
    assert_eq!(w["refusals"]["timed_out"], 1, "{w}");
    let w = worker_json(&c, &r.url(), &big.url()).await;
    assert_eq!(w["refusals"]["body_too_large"], 1, "{w}");
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_calls_costs_each_worker_one_fan_out_per_interval() {
    let (a, b) = (lister("a").await, lister("b").await);
    let r = router(vec![a.url(), b.url()], LoadSignal::Inflight, |_| {}).await;
    let c = reqwest::Client::new();
    let calls = (0..64).map(|_| {
        let (c, url) = (c.clone(), format!("{}/v1/models", r.url()));
        tokio::spawn(async move { get_json(&c, &url).await })
    });
    for answer in futures_util::future::join_all(calls).await {
        assert_eq!(ids(&answer.unwrap()), ["a", "b"]);
    }
    // One fan-out per cache interval: the burst may straddle an expiry, never 64.
    for w in [&a, &b] {
        let hits = w.hits("/v1/models");
        assert!((1..=3).contains(&hits), "{hits} fetches for 64 calls");
    }
    r.stop().await;
}
