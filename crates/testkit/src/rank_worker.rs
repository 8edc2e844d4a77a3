//! A worker with several DP ranks, each reporting its own load (on its own PUB socket, as an
//! SGLang engine with DP attention does, or, [`vllm_rank_worker`], as per-engine series of a vLLM
//! `/metrics` page that the router polls), that records every generation request it receives:
//! path, the `X-Data-Parallel-Rank` header and the body. What a router sends a rank is then checked
//! where the engine would read it. Each rank's reported backlog is the test's to set (prefill tokens
//! pushed; waiting requests polled).

use crate::pub_sink::snapshot_pub;
use crate::router::{serve_loopback, server_info_app};
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::post;
use loadlink_publish::{Encoded, Sink, free_port_block};
use loadlink_wire::LoadSnapshot;
use loadlink_wire::codec::snapshot_bytes;
use loadlink_wire::descriptor::KvEventsDescriptor;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request as the worker received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    /// The `X-Data-Parallel-Rank` header, as sent.
    pub rank_header: Option<String>,
    pub body: Value,
}

/// The worker; its publishers stop on drop.
pub struct RankWorker {
    pub url: String,
    /// Per rank, the `num_waiting_uncached_tokens` it publishes (every 2 ms).
    pub backlog: Arc<Vec<AtomicI64>>,
    pub received: Arc<Mutex<Vec<Received>>>,
    stop: Arc<AtomicBool>,
}

impl Drop for RankWorker {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

impl RankWorker {
    /// What it received so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// The generation routes, each recording what it receives.
fn recording_routes(mut app: axum::Router, received: &Arc<Mutex<Vec<Received>>>) -> axum::Router {
    for path in [
        "/generate",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
    ] {
        let rec = received.clone();
        app = app.route(
            path,
            post(move |headers: HeaderMap, body: Bytes| {
                let rec = rec.clone();
                async move {
                    rec.lock().unwrap().push(Received {
                        path: path.to_string(),
                        rank_header: headers
                            .get("x-data-parallel-rank")
                            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
                        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                    });
                    axum::Json(json!({ "choices": [{ "text": "ok" }] }))
                }
            }),
        );
    }
    app
}

/// A worker of `ranks` DP ranks with no load socket whose `/metrics` is vLLM's, one
/// `engine="N"` series per rank with `backlog[N]` waiting requests: the router polls it.
pub async fn vllm_rank_worker(ranks: u16) -> RankWorker {
    let backlog: Arc<Vec<AtomicI64>> = Arc::new((0..ranks).map(|_| AtomicI64::new(0)).collect());
    let b = backlog.clone();
    let metrics = axum::routing::get(move || {
        let b = b.clone();
        async move {
            let engines: Vec<(u64, u64, u64)> = (0..b.len())
                .map(|r| (r as u64, 0, b[r].load(Relaxed).max(0) as u64))
                .collect();
            crate::polled_worker::vllm_metrics_body(&engines)
        }
    });
    let received: Arc<Mutex<Vec<Received>>> = Arc::default();
    let info = json!({ "dp_size": ranks, "kv_events": null });
    let app = recording_routes(server_info_app(info), &received).route("/metrics", metrics);
    RankWorker {
        url: serve_loopback(app).await,
        backlog,
        received,
        stop: Arc::new(AtomicBool::new(false)),
    }
}

/// Starts a worker of `ranks` DP ranks answering `/generate`, `/v1/completions`,
/// `/v1/chat/completions` and `/v1/responses`.
pub async fn rank_worker(ranks: u16) -> RankWorker {
    let ports = free_port_block(2 * ranks).expect("free load and KV ports");
    let (kv_base, load_base) = (ports, ports + ranks);
    let info = json!({
        "dp_size": ranks,
        "kv_events": KvEventsDescriptor {
            publisher: "zmq".into(),
            endpoint_host: "*".into(),
            endpoint_port_base: kv_base,
            topic: String::new(),
            block_size: 16,
            dp_size: u32::from(ranks),
            load_endpoint_port_base: Some(load_base),
            load_topic: None,
            replay_endpoint_port_base: None,
        },
    });
    let received: Arc<Mutex<Vec<Received>>> = Arc::default();
    let app = recording_routes(server_info_app(info), &received);
    let url = serve_loopback(app).await;
    let backlog: Arc<Vec<AtomicI64>> = Arc::new((0..ranks).map(|_| AtomicI64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    for r in 0..ranks {
        let (b, s) = (backlog.clone(), stop.clone());
        std::thread::spawn(move || {
            let ctx = zmq::Context::new();
            let mut sink = snapshot_pub(&ctx, load_base + r).expect("the load port binds");
            while !s.load(Relaxed) {
                let snap = LoadSnapshot {
                    dp_rank: i64::from(r),
                    num_waiting_uncached_tokens: b[usize::from(r)].load(Relaxed),
                    ..Default::default()
                };
                let _ = sink.write(Encoded {
                    snapshot: &snap,
                    bytes: &snapshot_bytes(&snap),
                });
                std::thread::sleep(Duration::from_millis(2));
            }
        });
    }
    RankWorker {
        url,
        backlog,
        received,
        stop,
    }
}
