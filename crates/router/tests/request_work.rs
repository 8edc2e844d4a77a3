//! Request-path CPU work stays off the async executor: the router runs on this test's
//! current-thread runtime (one thread for every task it has), while clients on another runtime
//! flood it with large bodies that must be parsed, tokenized and hashed for `min_ttft`'s cache
//! lookup. If that work ran on the executor, the router's one thread would be inside it whenever
//! a job runs, and could answer nothing else; instead `/metrics` is answered while a job is
//! running, and every flooded request is still answered.

use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::routing::post;
use loadlink_router::policy::{MinTtft, Policy};
use loadlink_router::{LoadSignal, RouterHandle};
use loadlink_testkit::background::{Background, Flood};
use loadlink_testkit::router::{serve_loopback, server_info_app};
use loadlink_testkit::{router, scrape, wait_until};
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;

/// A large completion body (4 MiB: a quarter of the body limit keeps a debug build's test short;
/// the work per byte is the same).
fn large_body() -> Vec<u8> {
    let text = "tokens to hash ".repeat((4 << 20) / 15);
    serde_json::to_vec(&json!({ "prompt": text, "max_tokens": 1 })).unwrap()
}

/// A worker that reads each request body to its end before answering (so the router's upstream
/// write of a large body always completes).
async fn reading_worker() -> String {
    let app = server_info_app(json!({ "dp_size": 1 })).route(
        "/v1/completions",
        post(|body: Bytes| async move {
            axum::Json(json!({ "choices": [{ "text": body.len().to_string() }] }))
        }),
    );
    serve_loopback(app.layer(DefaultBodyLimit::disable())).await
}

async fn min_ttft_router(worker: String) -> RouterHandle {
    router(vec![worker], LoadSignal::Backlog, |c| {
        c.policy = Policy::MinTtft(MinTtft::default());
        c.budgets.request_work_threads = 1;
    })
    .await
}

#[tokio::test(flavor = "current_thread")]
async fn large_bodies_are_worked_off_the_router_s_executor() {
    let bg = Background::new();
    let worker = bg.spawn(reading_worker()).await.unwrap();
    let r = min_ttft_router(worker).await;
    let flood = Flood::start(&bg, format!("{}/v1/completions", r.url()), large_body(), 2);
    let c = reqwest::Client::new();
    let running = wait_until("a scrape while request work runs", 120, || async {
        let page = scrape(&c, &r.url()).await;
        match page.value("loadlink_request_work_running", &[]) {
            Some(n) if n >= 1.0 => Ok(n),
            seen => Err(format!("loadlink_request_work_running {seen:?}")),
        }
    })
    .await;
    assert_eq!(running, 1.0, "within the one-thread budget");
    wait_until("flooded requests answered", 120, || async {
        match (flood.ok.load(Relaxed), flood.other.load(Relaxed)) {
            (ok, 0) if ok >= 2 => Ok(()),
            seen => Err(format!("(ok, other) = {seen:?}")),
        }
    })
    .await;
    flood.stop();
    r.stop().await;
}
