//! Routers and fake workers for tests: a router on a free port, an HTTP worker that answers
//! completions and advertises (or not) a load socket the test feeds itself, and readers of the
//! router's `/workers` admin view.

use crate::http::get_json;
use crate::kv::advertised;
use axum::routing::{get, post};
use loadlink_router::{LoadSignal, Policy, RouterConfig, RouterHandle};
use serde_json::{Value, json};

/// Starts a router (power-of-two on `signal`) on a free port; `tweak` adjusts the config.
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
    loadlink_router::start(cfg).await.expect("router starts")
}

/// An HTTP worker that always answers completions and advertises a load socket at `load_port`
/// (which the test feeds itself), or no load range when `None`. Returns its URL.
pub async fn http_worker(load_port: Option<u16>) -> String {
    let info = json!({ "dp_size": 1, "kv_events": load_port.map(advertised) });
    let app = server_info_app(info).route(
        "/v1/completions",
        post(|| async { axum::Json(json!({"choices": [{"text": "ok"}]})) }),
    );
    serve_loopback(app).await
}

/// A fake worker's routes: `GET /server_info` answering `info`, and `GET /health`.
pub fn server_info_app(info: Value) -> axum::Router {
    axum::Router::new()
        .route(
            "/server_info",
            get(move || {
                let info = info.clone();
                async move { axum::Json(info) }
            }),
        )
        .route("/health", get(|| async { "ok" }))
}

/// Serves `app` on a free loopback port until the test ends; returns its base URL.
pub async fn serve_loopback(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("bound address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// The router's `/workers` list.
pub async fn workers(c: &reqwest::Client, router_url: &str) -> Vec<Value> {
    let v = get_json(c, &format!("{router_url}/workers")).await;
    v["workers"].as_array().expect("a workers array").clone()
}

/// One worker's entry in `/workers`.
pub async fn worker_json(c: &reqwest::Client, router_url: &str, worker_url: &str) -> Value {
    workers(c, router_url)
        .await
        .into_iter()
        .find(|w| w["url"] == worker_url)
        .unwrap_or_else(|| panic!("{worker_url} not in /workers"))
}

/// The worker a router sent `resp` to, from its `x-loadlink-worker` header.
pub fn worker_of(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("x-loadlink-worker")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no x-loadlink-worker header: {:?}", resp.headers()))
        .to_string()
}

/// Polls `worker_url`'s `/workers` entry on `r` until `check` accepts it (20 s); returns it.
pub async fn wait_worker(
    r: &RouterHandle,
    worker_url: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let c = reqwest::Client::new();
    crate::wait_until(what, 20, || async {
        let w = worker_json(&c, &r.url(), worker_url).await;
        if check(&w) { Ok(w) } else { Err(w.to_string()) }
    })
    .await
}
