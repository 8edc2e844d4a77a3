//! A client-routed DP rank, honoured as SGLang 0.5.23 honours it (`docs/engine.md`, "Routed DP
//! rank"): body `routed_dp_rank` / `data_parallel_rank` on every generation route, header
//! `X-Data-Parallel-Rank` on the OpenAI routes (it overrides the body), SGLang's errors, and the
//! single-rank rank-0 exception. Where a request ran is read from
//! `loadlink_engine_rank_requests_total{dp_rank,rank_from}` and from `/cache_blocks`.

use loadlink_engine::Engine;
use loadlink_testkit::{engine, get_json, scrape, wait_until};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::BTreeMap;

const HEADER: &str = "X-Data-Parallel-Rank";

async fn ranked_engine(dp_size: u32) -> Engine {
    engine(|c| {
        c.dp_size = dp_size;
        c.time_scale = 50.0;
    })
    .await
}

/// `(dp_rank, rank_from)` → requests, from the engine's own counter.
async fn placements(c: &reqwest::Client, url: &str) -> BTreeMap<(String, String), f64> {
    let page = scrape(c, url).await;
    let family = page
        .family("loadlink_engine_rank_requests_total")
        .expect("loadlink_engine_rank_requests_total on /metrics");
    family
        .samples
        .iter()
        .map(|s| {
            let label = |k| s.label(k).unwrap_or_default().to_string();
            ((label("dp_rank"), label("rank_from")), s.value)
        })
        .collect()
}

/// What changed between two readings of the counter (only the series that moved).
fn moved(
    before: &BTreeMap<(String, String), f64>,
    after: &BTreeMap<(String, String), f64>,
) -> Vec<(String, String, f64)> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            (d != 0.0).then(|| (k.0.clone(), k.1.clone(), d))
        })
        .collect()
}

fn one(rank: u32, from: &str) -> Vec<(String, String, f64)> {
    vec![(rank.to_string(), from.to_string(), 1.0)]
}

/// A short request's body on `path`, with `extra` fields merged in.
fn body(path: &str, extra: Value) -> Value {
    let mut b = match path {
        "/v1/completions" => json!({"prompt": "abcdefgh", "max_tokens": 2}),
        "/v1/chat/completions" => {
            json!({"messages": [{"role": "user", "content": "abcd"}], "max_tokens": 2})
        }
        _ => json!({"text": "abcdefgh", "sampling_params": {"max_new_tokens": 2}}),
    };
    if let (Some(b), Some(extra)) = (b.as_object_mut(), extra.as_object()) {
        b.extend(extra.clone());
    }
    b
}

/// POSTs `body` to `url{path}`, with the rank header when given; the status and the body text.
async fn send(
    c: &reqwest::Client,
    url: &str,
    path: &str,
    body: &Value,
    header: Option<&str>,
) -> (StatusCode, String) {
    let mut req = c.post(format!("{url}{path}")).json(body);
    if let Some(h) = header {
        req = req.header(HEADER, h);
    }
    let resp = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    let status = resp.status();
    (status, resp.text().await.unwrap_or_default())
}

/// Sends one request and returns which counter series it moved.
async fn placed(
    c: &reqwest::Client,
    url: &str,
    path: &str,
    extra: Value,
    header: Option<&str>,
) -> Vec<(String, String, f64)> {
    let before = placements(c, url).await;
    let (status, text) = send(c, url, path, &body(path, extra.clone()), header).await;
    assert_eq!(status, StatusCode::OK, "{path} {extra} {header:?}: {text}");
    moved(&before, &placements(c, url).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_runs_on_the_rank_its_body_field_or_alias_names() {
    let e = ranked_engine(4).await;
    let (c, url) = (reqwest::Client::new(), e.url());
    for path in ["/v1/completions", "/v1/chat/completions", "/generate"] {
        for (field, rank) in [("routed_dp_rank", 2), ("data_parallel_rank", 3)] {
            let got = placed(&c, &url, path, json!({ field: rank }), None).await;
            assert_eq!(got, one(rank, "routed"), "{path} {field}={rank}");
        }
    }
    e.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_routes_the_openai_routes_and_overrides_the_body() {
    let e = ranked_engine(4).await;
    let (c, url) = (reqwest::Client::new(), e.url());
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let got = placed(&c, &url, path, json!({}), Some("1")).await;
        assert_eq!(got, one(1, "routed"), "{path}: header alone");
        let got = placed(&c, &url, path, json!({"routed_dp_rank": 0}), Some("3")).await;
        assert_eq!(got, one(3, "routed"), "{path}: header over routed_dp_rank");
        let alias = json!({"data_parallel_rank": 0});
        let got = placed(&c, &url, path, alias, Some(" +2 ")).await;
        assert_eq!(got, one(2, "routed"), "{path}: header (as int() reads it)");
    }
    // routed_dp_rank wins over the alias.
    let both = json!({"routed_dp_rank": 1, "data_parallel_rank": 2});
    let got = placed(&c, &url, "/v1/completions", both, None).await;
    assert_eq!(got, one(1, "routed"));
    // The OpenAI routes read the body field as pydantic's lax int.
    let lax = json!({"routed_dp_rank": "3"});
    let got = placed(&c, &url, "/v1/chat/completions", lax, None).await;
    assert_eq!(got, one(3, "routed"));
    // /generate reads the body only: the header changes nothing, not even when invalid.
    let got = placed(
        &c,
        &url,
        "/generate",
        json!({"routed_dp_rank": 1}),
        Some("3"),
    )
    .await;
    assert_eq!(got, one(1, "routed"));
    let got = placed(&c, &url, "/generate", json!({}), Some("nope")).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].1, "dispatcher", "{got:?}");
    e.stop().await;
}

/// The error message of a 400 answer.
fn message(text: &str) -> String {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ranks_get_sglangs_errors_and_run_nowhere() {
    let e = ranked_engine(4).await;
    let (c, url) = (reqwest::Client::new(), e.url());
    let before = placements(&c, &url).await;
    let cases = [
        (
            "/v1/completions",
            json!({}),
            Some("abc"),
            "Invalid X-Data-Parallel-Rank header: must be an integer, got 'abc'",
        ),
        (
            "/v1/chat/completions",
            json!({"stream": true}),
            Some("1.5"),
            "Invalid X-Data-Parallel-Rank header: must be an integer, got '1.5'",
        ),
        (
            "/v1/completions",
            json!({"routed_dp_rank": 4}),
            None,
            "routed_dp_rank=4 out of range [0, 4)",
        ),
        (
            "/v1/chat/completions",
            json!({"stream": true}),
            Some("-1"),
            "routed_dp_rank=-1 out of range [0, 4)",
        ),
        (
            "/generate",
            json!({"data_parallel_rank": 9}),
            None,
            "routed_dp_rank=9 out of range [0, 4)",
        ),
        (
            "/generate",
            json!({"routed_dp_rank": "1"}),
            None,
            "routed_dp_rank: expected a JSON integer (a DP rank), got \"1\"",
        ),
        (
            "/v1/completions",
            json!({"data_parallel_rank": [1]}),
            None,
            "data_parallel_rank: expected an integer (a DP rank), got [1]",
        ),
    ];
    for (path, extra, header, want) in cases {
        let (status, text) = send(&c, &url, path, &body(path, extra.clone()), header).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{path} {extra} {header:?}: {text}"
        );
        assert_eq!(message(&text), want, "{path} {extra} {header:?}");
    }
    // A streamed /generate reports it as SGLang does: one error event in a 200 stream.
    let streamed = body("/generate", json!({"routed_dp_rank": 7, "stream": true}));
    let (status, text) = send(&c, &url, "/generate", &streamed, None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let first = text.lines().next().unwrap_or_default();
    let event: Value = serde_json::from_str(first.trim_start_matches("data: ")).unwrap();
    assert_eq!(
        event["error"]["message"],
        "routed_dp_rank=7 out of range [0, 4)"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(moved(&before, &placements(&c, &url).await), []);
    e.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_rank_engine_ignores_rank_zero_and_refuses_others() {
    let e = ranked_engine(1).await;
    let (c, url) = (reqwest::Client::new(), e.url());
    let got = placed(
        &c,
        &url,
        "/v1/completions",
        json!({"routed_dp_rank": 0}),
        None,
    )
    .await;
    assert_eq!(
        got,
        one(0, "dispatcher"),
        "rank 0 is ignored: the dispatcher places it"
    );
    let got = placed(&c, &url, "/v1/chat/completions", json!({}), Some("0")).await;
    assert_eq!(got, one(0, "dispatcher"));
    let (status, text) = send(
        &c,
        &url,
        "/v1/completions",
        &body("/v1/completions", json!({})),
        Some("1"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(message(&text), "routed_dp_rank=1 out of range [0, 1)");
    e.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_rank_keep_the_dispatcher() {
    let e = ranked_engine(4).await;
    let (c, url) = (reqwest::Client::new(), e.url());
    let before = placements(&c, &url).await;
    for path in ["/v1/completions", "/v1/chat/completions", "/generate"] {
        for _ in 0..2 {
            let (status, text) = send(&c, &url, path, &body(path, json!({})), None).await;
            assert_eq!(status, StatusCode::OK, "{path}: {text}");
        }
    }
    let got = moved(&before, &placements(&c, &url).await);
    assert!(
        got.iter().all(|(_, from, _)| from == "dispatcher"),
        "{got:?}"
    );
    assert_eq!(got.iter().map(|m| m.2).sum::<f64>(), 6.0, "{got:?}");
    e.stop().await;
}

/// The prompt's pages are cached on the routed rank and nowhere else, and the same prompt routed
/// there again is served from that cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_prompt_is_cached_on_its_rank_and_hits_there() {
    let e = ranked_engine(4).await;
    let (c, url) = (reqwest::Client::new(), e.url());
    let prompt: Vec<u32> = (5000..5128).collect();
    let req =
        json!({"input_ids": prompt, "sampling_params": {"max_new_tokens": 2}, "routed_dp_rank": 2});
    let (status, text) = send(&c, &url, "/generate", &req, None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let blocks = get_json(&c, &format!("{url}/cache_blocks")).await;
    let held: Vec<(i64, usize)> = blocks["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| {
            (
                r["dp_rank"].as_i64().unwrap(),
                r["blocks"].as_array().map_or(0, Vec::len),
            )
        })
        .collect();
    assert_eq!(held.iter().filter(|(_, n)| *n > 0).count(), 1, "{held:?}");
    assert!(held.iter().any(|&(r, n)| r == 2 && n >= 7), "{held:?}");
    let (status, text) = send(
        &c,
        &url,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 1}),
        Some("2"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    wait_until("the second request's hit on rank 2", 10, || async {
        let page = scrape(&c, &url).await;
        match page.value("loadlink_engine_cache_hit_tokens_total", &[("rank", "2")]) {
            Some(hit) if hit >= 112.0 => Ok(()),
            other => Err(format!("rank 2 hit tokens {other:?}")),
        }
    })
    .await;
    e.stop().await;
}
