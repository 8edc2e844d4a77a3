//! Discovery end to end: an engine that declines its load range says why in `/server_info`, and
//! the router's `/workers` carries that reason (the same text `loadlink watch` prints), while the
//! worker is still routed on in-flight. Hostile workers (a `/server_info` that stalls after its
//! headers, or is oversized) are given up on within the discovery budget, with the refusal shown,
//! and never keep the router from serving the healthy ones or `POST /workers` from answering.

use loadlink_publish::free_port_block;
use loadlink_router::LoadSignal;
use loadlink_router::budget::Refusal;
use loadlink_testkit::hostile_http::{HostileWorker, Reply};
use loadlink_testkit::{KvEvents, router, wait_for, worker_json};
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_shows_the_engines_own_decline_reason() {
    // A concrete-host KV endpoint: the engine declines the load range and reports why.
    let kv_port = free_port_block(1).unwrap();
    let engine = loadlink_testkit::engine(|c| {
        c.kv_events_config = Some(KvEvents::endpoint(format!("tcp://127.0.0.1:{kv_port}")).json());
    })
    .await;
    // Polling off: the engine serves /v1/loads, which the router would otherwise poll.
    let r = router(vec![engine.url()], LoadSignal::Engine, |c| {
        c.load_poll_interval_ms = 0
    })
    .await;
    let c = reqwest::Client::new();
    let w = worker_json(&c, &r.url(), &engine.url()).await;
    assert_eq!(w["source"], "fallback");
    let reason = w["no_load_reason"].as_str().unwrap();
    assert!(
        reason.contains("does not report load") && reason.contains("wildcard"),
        "{reason}"
    );
    r.stop().await;
}

/// A router config on a fixed free port (so a test can reach it while `start` is still running),
/// with short discovery budgets.
fn quick_discovery(c: &mut loadlink_router::RouterConfig, port: u16) {
    c.port = port;
    c.discovery_attempts = 2;
    c.budgets.discovery_timeout = Duration::from_millis(1500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_stalls_after_headers_does_not_keep_the_router_from_serving() {
    let engine = loadlink_testkit::engine(|_| {}).await;
    let stalled = HostileWorker::start().await;
    stalled.on("/server_info", Reply::StallAfterHeaders { declared: 4096 });
    let dribbling = HostileWorker::start().await;
    dribbling.on(
        "/server_info",
        Reply::Dribble {
            body: vec![b' '; 4096],
            every: Duration::from_millis(100),
        },
    );
    let port = free_port_block(1).unwrap();
    let urls = vec![engine.url(), stalled.url(), dribbling.url()];
    let mut cfg = loadlink_router::RouterConfig {
        worker_urls: urls,
        policy: loadlink_router::Policy::PowerOfTwo,
        ..Default::default()
    };
    quick_discovery(&mut cfg, port);
    // `start` returns once every worker's discovery has ended; the router serves before that.
    let starting = tokio::time::timeout(Duration::from_secs(30), loadlink_router::start(cfg));
    let base = format!("http://127.0.0.1:{port}");
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let serving = wait_for(
        "the healthy engine serves through the router",
        15,
        || async {
            let resp = c
                .post(format!("{base}/v1/completions"))
                .json(&json!({"prompt": "hi", "max_tokens": 4}))
                .send()
                .await;
            matches!(resp, Ok(r) if r.status().is_success())
        },
    );
    let (started, ()) = tokio::join!(starting, serving);
    let r = started
        .expect("start ends within the discovery budget")
        .expect("router starts");
    for hostile in [&stalled, &dribbling] {
        let w = worker_json(&c, &r.url(), &hostile.url()).await;
        let reason = w["no_load_reason"].as_str().unwrap_or_default();
        assert!(reason.contains("timed_out"), "{w}");
    }
    assert!(r.state.fleet.refusals.get(Refusal::TimedOut) >= 2);
    r.stop().await;
    engine.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_server_info_is_refused_with_a_reason() {
    let big = HostileWorker::start().await;
    big.on(
        "/server_info",
        Reply::Oversized {
            bytes: 8 << 20,
            declared: true,
        },
    );
    let r = router(vec![big.url()], LoadSignal::Inflight, |c| {
        c.budgets.discovery_body_bytes = 64 << 10;
    })
    .await;
    let c = reqwest::Client::new();
    let w = worker_json(&c, &r.url(), &big.url()).await;
    let reason = w["no_load_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("body_too_large"), "{w}");
    assert_eq!(
        big.hits("/server_info"),
        1,
        "an oversized body is not retried"
    );
    assert_eq!(r.state.fleet.refusals.get(Refusal::BodyTooLarge), 1);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_workers_with_a_stalled_worker_answers_within_the_budget() {
    let stalled = HostileWorker::start().await;
    stalled.on("/server_info", Reply::StallAfterHeaders { declared: 4096 });
    let port = free_port_block(1).unwrap();
    let r = router(vec![], LoadSignal::Inflight, |c| {
        quick_discovery(c, port);
        c.admin_token = Some("t".into());
    })
    .await;
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let resp = c
        .post(format!("{}/workers", r.url()))
        .bearer_auth("t")
        .json(&json!({ "url": stalled.url() }))
        .send()
        .await
        .expect("POST /workers answers");
    assert_eq!(resp.status(), reqwest::StatusCode::CREATED);
    let w: serde_json::Value = resp.json().await.unwrap();
    assert!(
        w["no_load_reason"]
            .as_str()
            .is_some_and(|r| r.contains("timed_out")),
        "{w}"
    );
    r.stop().await;
}
