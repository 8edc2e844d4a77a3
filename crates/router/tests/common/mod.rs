//! Helpers shared by the router's integration tests.
#![allow(dead_code)]

use axum::routing::{get, post};
use loadlink_router::{LoadSignal, Policy, RouterConfig, RouterHandle};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Starts a router on a free port; `tweak` adjusts the config.
pub async fn router(
    urls: Vec<String>,
    signal: LoadSignal,
    tweak: impl FnOnce(&mut RouterConfig),
) -> RouterHandle {
    let mut cfg = RouterConfig {
        port: 0,
        worker_urls: urls,
        policy: Policy::PowerOfTwo,
        load_signal: signal,
        ..Default::default()
    };
    tweak(&mut cfg);
    loadlink_router::start(cfg).await.unwrap()
}

/// An HTTP worker that always answers completions and advertises a load socket at `load_port`
/// (which the test feeds itself), or no load range when `None`.
pub async fn http_worker(load_port: Option<u16>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let kv = load_port.map_or(Value::Null, |p| {
        json!({"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": p - 1, "topic": "", "block_size": 16, "dp_size": 1, "load_endpoint_port_base": p})
    });
    let info = json!({ "dp_size": 1, "kv_events": kv });
    let app = axum::Router::new()
        .route(
            "/server_info",
            get(move || {
                let info = info.clone();
                async move { axum::Json(info) }
            }),
        )
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/completions",
            post(|| async { axum::Json(json!({"choices": [{"text": "ok"}]})) }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// The router's `/workers` list.
pub async fn workers(c: &reqwest::Client, r: &str) -> Vec<Value> {
    let v: Value = c
        .get(format!("{r}/workers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["workers"].as_array().unwrap().clone()
}

/// One worker's entry in `/workers`.
pub async fn worker_json(c: &reqwest::Client, r: &str, url: &str) -> Value {
    workers(c, r)
        .await
        .into_iter()
        .find(|w| w["url"] == url)
        .unwrap()
}

/// Polls `cond` every 25 ms for up to `secs`.
pub async fn wait_for<F: FnMut() -> Fut, Fut: std::future::Future<Output = bool>>(
    what: &str,
    secs: u64,
    mut cond: F,
) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}
