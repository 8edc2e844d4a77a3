//! `loadlink route --pd` in front of real PD engines (`loadlink engine --disaggregation-mode`,
//! KV moved over their bootstrap connections): every room is prefilled exactly once, on the
//! engine its `bootstrap_host`/`bootstrap_port` name, and decoded exactly once (counted from the
//! engines' own `/metrics`), with a prefill that refuses connections and with a prefill engine
//! killed mid-transfer; and load sent straight to one prefill engine moves new prefills away.
//!
//! A room the router named wrongly would never be transferred: its decode engine would dial an
//! engine that does not hold it and fail or time out. So "transferred" on both sides, with no
//! failure and no timeout, is the pairing check.

use loadlink_engine::PdMode;
use loadlink_router::pd::PdConfig;
use loadlink_router::{LoadSignal, Policy, RouterHandle};
use loadlink_testkit::metrics::scrape;
use loadlink_testkit::pd_engines::{pd_engines, requests_total, rooms_total};
use loadlink_testkit::router::{router, workers};
use loadlink_testkit::wait::wait_for;
use loadlink_testkit::{KvEvents, get_json};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// A `--pd` router over the given command-line sides (and `urls` to discover), waiting until
/// `n` workers are in `/workers`.
async fn pd_router(
    urls: Vec<String>,
    pd: PdConfig,
    n: usize,
) -> (RouterHandle, reqwest::Client, String) {
    let r = router(urls, LoadSignal::Backlog, |c| {
        c.pd = Some(pd);
        c.discovery_attempts = 1;
        c.health_interval_ms = 600_000;
        c.retry_initial_backoff_ms = 1;
    })
    .await;
    let (c, base) = (reqwest::Client::new(), r.url());
    wait_for("every PD worker in /workers", 20, || {
        let (c, base) = (c.clone(), base.clone());
        async move { workers(&c, &base).await.len() == n }
    })
    .await;
    (r, c, base)
}

async fn send(c: &reqwest::Client, base: &str, path: &str, body: &Value) -> (u16, String) {
    let r = c
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .expect("the router answers");
    let status = r.status().as_u16();
    (status, r.text().await.unwrap_or_default())
}

/// Sums an engine counter over `urls`.
async fn sum_rooms(c: &reqwest::Client, urls: &[&str], outcome: &str) -> f64 {
    let mut n = 0.0;
    for u in urls {
        n += rooms_total(c, u, outcome).await;
    }
    n
}

fn urls(f: &[loadlink_testkit::pd_engines::PdEngine]) -> Vec<&str> {
    f.iter().map(|e| e.url.as_str()).collect()
}

fn request(i: usize) -> (&'static str, Value) {
    let text = format!("request {i}: tell me about rooms");
    match i % 3 {
        0 => (
            "/generate",
            json!({"text": text, "sampling_params": {"max_new_tokens": 3}}),
        ),
        1 => (
            "/v1/completions",
            json!({"prompt": text, "max_tokens": 3, "stream": true}),
        ),
        _ => (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": text}], "max_tokens": 3}),
        ),
    }
}

/// Asserts an answer is whole: 200, and a stream ends with `[DONE]` after no error event.
fn assert_whole(i: usize, (status, text): &(u16, String)) {
    assert_eq!(*status, 200, "request {i}: {text}");
    if text.starts_with("data:") {
        assert!(
            text.trim_end().ends_with("data: [DONE]"),
            "request {i}: {text}"
        );
        assert!(!text.contains("\"error\""), "request {i}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_pd_engines_prefill_and_decode_each_room_once() {
    let f = pd_engines(2, 2, |_, c| c.time_scale = 20.0).await;
    let all = f.urls();
    // No --prefill/--decode: the roles and bootstrap ports come from /server_info.
    let (_r, c, base) = pd_router(all, PdConfig::default(), 4).await;
    for w in workers(&c, &base).await {
        let p = f.prefill.iter().find(|e| e.url == w["url"]);
        assert_eq!(
            w["role"],
            if p.is_some() { "prefill" } else { "decode" },
            "{w}"
        );
        assert_eq!(
            w["bootstrap_port"],
            json!(p.and_then(|p| p.bootstrap_port)),
            "{w}"
        );
    }
    let n = 12;
    for i in 0..n {
        let (path, body) = request(i);
        assert_whole(i, &send(&c, &base, path, &body).await);
    }
    let (pre, dec) = (urls(&f.prefill), urls(&f.decode));
    assert_eq!(sum_rooms(&c, &pre, "transferred").await, n as f64);
    assert_eq!(sum_rooms(&c, &dec, "transferred").await, n as f64);
    for outcome in ["failed", "timeout"] {
        assert_eq!(
            sum_rooms(&c, &pre, outcome).await + sum_rooms(&c, &dec, outcome).await,
            0.0
        );
    }
    let mut sent = 0.0;
    for u in pre.iter().chain(&dec) {
        sent += requests_total(&c, u).await;
    }
    assert_eq!(sent, 2.0 * n as f64, "one request per leg, no duplicate");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_that_refuses_connections_is_retried_and_no_room_is_prefilled_twice() {
    let mut f = pd_engines(2, 1, |_, c| c.time_scale = 20.0).await;
    let pd = PdConfig {
        prefill: f.prefill.iter().map(|e| (e.url.clone(), None)).collect(),
        decode: vec![f.decode[0].url.clone()],
        prefill_policy: Policy::RoundRobin,
        ..PdConfig::default()
    };
    let (_r, c, base) = pd_router(Vec::new(), pd, 3).await;
    // Discovered with its model, then gone: its HTTP and bootstrap ports refuse connections.
    drop(f.prefill.remove(0).engine);
    let n = 8;
    for i in 0..n {
        let (path, body) = request(i);
        assert_whole(i, &send(&c, &base, path, &body).await);
    }
    let (p, d) = (&f.prefill[0].url, &f.decode[0].url);
    let m = scrape(&c, &base).await;
    let retried = m
        .value("loadlink_pd_retries_total", &[("role", "prefill")])
        .unwrap();
    assert!(retried >= 1.0, "the dead prefill was tried");
    // The live prefill engine saw each room once: n requests, n transferred.
    let live = (
        requests_total(&c, p).await,
        rooms_total(&c, p, "transferred").await,
    );
    assert_eq!(live, (n as f64, n as f64));
    assert_eq!(rooms_total(&c, d, "transferred").await, n as f64);
    // The decode legs of abandoned attempts (their room named the dead engine) failed there.
    let abandoned = rooms_total(&c, d, "failed").await + rooms_total(&c, d, "timeout").await;
    assert!(
        abandoned <= retried,
        "{abandoned} abandoned decode rooms, {retried} retries"
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_engine_killed_mid_transfer_fails_only_its_own_requests_cleanly() {
    // The first prefill engine's link is slow (a 64-token prompt takes ~8 s); the second's is not.
    let started = AtomicUsize::new(0);
    let mut f = pd_engines(2, 1, |mode, c| {
        if mode == PdMode::Prefill && started.fetch_add(1, Relaxed) == 0 {
            c.pd.kv_transfer_gb_s = 0.001;
        }
    })
    .await;
    let pd = PdConfig {
        prefill: f.prefill.iter().map(|e| (e.url.clone(), None)).collect(),
        decode: vec![f.decode[0].url.clone()],
        prefill_policy: Policy::RoundRobin,
        ..PdConfig::default()
    };
    let (_r, c, base) = pd_router(Vec::new(), pd, 3).await;
    let body = json!({"input_ids": (0..64).collect::<Vec<u32>>(), "stream": true,
                      "sampling_params": {"max_new_tokens": 4}});
    let mut sent = Vec::new();
    for _ in 0..4 {
        let (c, base, body) = (c.clone(), base.clone(), body.clone());
        sent.push(tokio::spawn(async move {
            send(&c, &base, "/generate", &body).await
        }));
    }
    let loads = format!("{}/v1/loads?include=disagg", f.prefill[0].url);
    wait_for("two transfers under way on the slow engine", 20, || {
        let (c, loads) = (c.clone(), loads.clone());
        async move {
            let v = get_json(&c, &loads).await;
            v["loads"][0]["disaggregation"]["prefill_inflight_queue_reqs"] == 2
        }
    })
    .await;
    drop(f.prefill.remove(0).engine); // stopped mid-transfer
    let (mut whole, mut failed) = (0, 0);
    for (i, s) in sent.into_iter().enumerate() {
        let (status, text) = s.await.unwrap();
        assert_eq!(status, 200, "request {i}: {text}");
        // Never a cut stream: the last event is [DONE], after an error event when it failed.
        assert!(
            text.trim_end().ends_with("data: [DONE]"),
            "request {i}: {text}"
        );
        match text.contains("data: {\"error\"") {
            true => failed += 1,
            false => whole += 1,
        }
    }
    assert_eq!(
        (whole, failed),
        (2, 2),
        "only the stopped engine's two requests failed"
    );
    let (p, d) = (&f.prefill[0].url, &f.decode[0].url);
    assert_eq!(rooms_total(&c, p, "transferred").await, 2.0);
    assert_eq!(rooms_total(&c, d, "transferred").await, 2.0);
    assert_eq!(rooms_total(&c, d, "failed").await, 2.0);
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_load_on_one_prefill_engine_moves_new_prefills_away() {
    // Prefill engines publish their load (a load socket each), so min_ttft sees their backlog.
    let f = pd_engines(2, 1, |mode, c| {
        if mode == PdMode::Prefill {
            let port = loadlink_publish::free_port_block(2).expect("a free port block");
            c.kv_events_config = Some(KvEvents::zmq(port).json());
        }
    })
    .await;
    let all = f.urls();
    let (_r, c, base) = pd_router(all, PdConfig::default(), 3).await;
    let (busy, idle) = (&f.prefill[0], &f.prefill[1]);
    // 16 prompts of 4,000 tokens sent straight to one prefill engine, served there without a
    // transfer (SGLang's fake bootstrap host): about 6 s of prefill at 10k tokens/s.
    for i in 0..16u32 {
        let (c, url) = (c.clone(), busy.url.clone());
        let body = json!({"input_ids": (0..4000).map(|t| t * 7 + i).collect::<Vec<u32>>(),
                          "sampling_params": {"max_new_tokens": 1},
                          "bootstrap_host": "2.2.2.2", "bootstrap_room": 0});
        tokio::spawn(async move { c.post(format!("{url}/generate")).json(&body).send().await });
    }
    wait_for("the router to see the busy engine's backlog", 20, || {
        let (c, base, url) = (c.clone(), base.clone(), busy.url.clone());
        async move {
            let ws = workers(&c, &base).await;
            let w = ws
                .iter()
                .find(|w| w["url"] == url.as_str())
                .cloned()
                .unwrap_or_default();
            w["ranks"][0]["backlog_tokens"].as_u64().unwrap_or(0) > 20_000
        }
    })
    .await;
    let before = (
        requests_total(&c, &busy.url).await,
        requests_total(&c, &idle.url).await,
    );
    let mut sent = Vec::new();
    for i in 0..6 {
        let (c, base) = (c.clone(), base.clone());
        let (path, body) = request(i);
        sent.push(tokio::spawn(
            async move { send(&c, &base, path, &body).await },
        ));
    }
    for (i, s) in sent.into_iter().enumerate() {
        assert_whole(i, &s.await.unwrap());
    }
    let after = (
        requests_total(&c, &busy.url).await,
        requests_total(&c, &idle.url).await,
    );
    assert_eq!(after.0 - before.0, 0.0, "no new prefill on the busy engine");
    assert_eq!(after.1 - before.1, 6.0, "every new prefill on the idle one");
    f.stop().await;
}
