//! The chosen DP rank reaches the engine in the form `--dp-rank-field` names, on the routes that
//! take it; a client's own rank is kept; `none` routes the worker whole. A real router in front
//! of a worker of two ranks, each publishing its own load; rank 0 carries a large prefill backlog,
//! so a rank-aware router sends every request to rank 1.

use loadlink_router::candidate::RankField;
use loadlink_router::{LoadSignal, Policy, RouterHandle};
use loadlink_testkit::rank_worker::{RankWorker, rank_worker};
use loadlink_testkit::router::{router, wait_worker};
use serde_json::{Value, json};
use std::sync::atomic::Ordering::Relaxed;

async fn setup(field: RankField) -> (RankWorker, RouterHandle) {
    let w = rank_worker(2).await;
    w.backlog[0].store(500_000, Relaxed);
    let r = router(vec![w.url.clone()], LoadSignal::Backlog, |c| {
        c.policy = Policy::MinTtft(Default::default());
        c.dp_rank_field = field;
    })
    .await;
    wait_worker(&r, &w.url, "both ranks fresh", |v| {
        v["source"] == "engine" && v["ranks"][0]["backlog_tokens"] == 500_000
    })
    .await;
    (w, r)
}

fn body_for(path: &str) -> Value {
    match path {
        "/generate" => json!({ "text": "hello", "sampling_params": { "max_new_tokens": 1 } }),
        "/v1/chat/completions" => {
            json!({ "model": "m", "messages": [{ "role": "user", "content": "hello" }] })
        }
        "/v1/responses" => json!({ "model": "m", "input": "hello" }),
        _ => json!({ "model": "m", "prompt": "hello", "max_tokens": 1 }),
    }
}

const ROUTES: [&str; 4] = [
    "/generate",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
];

/// Sends one request per route; returns (path, header, body field) as the worker saw them, and
/// the rank the router says it chose.
async fn send_all(
    w: &RankWorker,
    r: &RouterHandle,
) -> Vec<(String, Option<String>, Value, Option<String>)> {
    let c = reqwest::Client::new();
    let mut chosen = Vec::new();
    for path in ROUTES {
        let resp = c
            .post(format!("{}{path}", r.url()))
            .json(&body_for(path))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        chosen.push(
            resp.headers()
                .get("x-loadlink-dp-rank")
                .map(|v| v.to_str().unwrap().to_string()),
        );
    }
    w.received()
        .into_iter()
        .zip(chosen)
        .map(|(rec, rank)| {
            (
                rec.path,
                rec.rank_header,
                rec.body["routed_dp_rank"].clone(),
                rank,
            )
        })
        .collect()
}

#[tokio::test]
async fn both_puts_the_header_and_the_field_where_each_route_takes_them() {
    let (w, r) = setup(RankField::Both).await;
    let seen = send_all(&w, &r).await;
    let expect = [
        ("/generate", None, json!(1)),
        ("/v1/completions", Some("1"), json!(1)),
        ("/v1/chat/completions", Some("1"), json!(1)),
        ("/v1/responses", Some("1"), Value::Null),
    ];
    for ((path, header, field, chosen), (p, h, f)) in seen.iter().zip(expect) {
        assert_eq!((path.as_str(), header.as_deref(), field), (p, h, &f));
        assert_eq!(
            chosen.as_deref(),
            Some("1"),
            "{path}: the rank without the backlog"
        );
    }
    let ranks =
        loadlink_testkit::router::worker_json(&reqwest::Client::new(), &r.url(), &w.url).await;
    assert_eq!(ranks["rank_routing"]["mode"], "per-rank");
    assert_eq!(ranks["ranks"][1]["routed_requests"], 4);
    assert_eq!(ranks["ranks"][0]["routed_requests"], 0);
}

#[tokio::test]
async fn header_only_leaves_generate_to_the_engine() {
    let (w, r) = setup(RankField::Header).await;
    let seen = send_all(&w, &r).await;
    assert_eq!(
        seen[0],
        ("/generate".into(), None, Value::Null, None),
        "no header on /generate: the worker is routed whole"
    );
    for (path, header, field, chosen) in &seen[1..] {
        assert_eq!(
            (header.as_deref(), field, chosen.as_deref()),
            (Some("1"), &Value::Null, Some("1")),
            "{path}"
        );
    }
}

#[tokio::test]
async fn body_only_leaves_responses_to_the_engine() {
    let (w, r) = setup(RankField::Body).await;
    let seen = send_all(&w, &r).await;
    for (path, header, field, chosen) in &seen[..3] {
        assert_eq!(
            (header.as_deref(), field, chosen.as_deref()),
            (None, &json!(1), Some("1")),
            "{path}"
        );
    }
    assert_eq!(seen[3], ("/v1/responses".into(), None, Value::Null, None));
}

#[tokio::test]
async fn none_routes_the_worker_whole() {
    let (w, r) = setup(RankField::None).await;
    for (path, header, field, chosen) in send_all(&w, &r).await {
        assert_eq!((header, field, chosen), (None, Value::Null, None), "{path}");
    }
    let v = loadlink_testkit::router::worker_json(&reqwest::Client::new(), &r.url(), &w.url).await;
    assert_eq!(
        v["rank_routing"],
        json!({ "mode": "worker", "reason": "--dp-rank-field none" })
    );
}

#[tokio::test]
async fn a_client_rank_is_kept_and_pins_the_pick() {
    let (w, r) = setup(RankField::Both).await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/completions", r.url());
    let resp = c
        .post(&url)
        .header("X-Data-Parallel-Rank", "0")
        .json(&body_for("/v1/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.headers()["x-loadlink-dp-rank"],
        "0",
        "pinned to rank 0 despite its backlog"
    );
    let mut body = body_for("/generate");
    body["data_parallel_rank"] = json!(0);
    c.post(format!("{}/generate", r.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    let bad = c
        .post(&url)
        .header("X-Data-Parallel-Rank", "zero")
        .json(&body_for("/v1/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("X-Data-Parallel-Rank"));
    let got = w.received();
    assert_eq!(got.len(), 2, "the bad header never reached the worker");
    assert_eq!(
        (
            got[0].rank_header.as_deref(),
            &got[0].body["routed_dp_rank"]
        ),
        (Some("0"), &Value::Null)
    );
    assert_eq!(
        (
            &got[1].body["data_parallel_rank"],
            &got[1].body["routed_dp_rank"]
        ),
        (&json!(0), &Value::Null)
    );
}

/// vLLM takes a rank per request in the header only (`X-data-parallel-rank`, its OpenAI server),
/// and its `/metrics` reports each DP engine apart: a polled worker whose ranks report separately
/// is routed per rank, once they have reported, by the header; with `body` it stays whole.
#[tokio::test]
async fn a_polled_worker_is_routed_per_rank_by_the_header_once_its_ranks_report() {
    use loadlink_testkit::rank_worker::vllm_rank_worker;
    let w = vllm_rank_worker(2).await;
    w.backlog[0].store(50, Relaxed);
    let r = router(vec![w.url.clone()], LoadSignal::Engine, |c| {
        c.policy = Policy::MinTtft(Default::default());
        c.load_poll_interval_ms = 20;
    })
    .await;
    let v = wait_worker(&r, &w.url, "both polled ranks reported", |v| {
        v["ranks"].as_array().is_some_and(|a| a.len() == 2) && v["source"] == "engine"
    })
    .await;
    assert_eq!(v["load_source"], "scrape_metrics");
    assert_eq!(v["rank_routing"]["mode"], "per-rank", "{v}");
    let c = reqwest::Client::new();
    for _ in 0..3 {
        let resp = c
            .post(format!("{}/v1/completions", r.url()))
            .json(&body_for("/v1/completions"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.headers()["x-loadlink-dp-rank"],
            "1",
            "the rank without waiting requests"
        );
    }
    assert!(
        w.received()
            .iter()
            .all(|x| x.rank_header.as_deref() == Some("1"))
    );

    let body_only = router(vec![w.url.clone()], LoadSignal::Engine, |c| {
        c.dp_rank_field = RankField::Body;
        c.load_poll_interval_ms = 20;
    })
    .await;
    let v = wait_worker(&body_only, &w.url, "both polled ranks reported", |v| {
        v["ranks"].as_array().is_some_and(|a| a.len() == 2)
    })
    .await;
    assert_eq!(v["rank_routing"]["mode"], "worker", "{v}");
    assert!(
        v["rank_routing"]["reason"]
            .as_str()
            .unwrap()
            .contains("header only")
    );
}
