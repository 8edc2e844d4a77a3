//! A fake polled worker for hostile-load tests: `/server_info` without a load range (so the
//! router polls it) and one load page, `GET /v1/loads` or `GET /metrics`, whose answer the test
//! chooses per request: any body, or a stall. So a test can be the worker that sends absurd
//! ranks, huge pages or nothing at all, without a real engine.

use crate::router::{serve_loopback, server_info_app};
use axum::routing::get;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

/// What the fake answers to one request of its load page.
#[derive(Debug, Clone)]
pub enum Answer {
    /// 200 with this body.
    Body(String),
    /// No answer for an hour (longer than any poll timeout).
    Stall,
}

/// Serves a worker whose load page at `path` (`"/v1/loads"` or `"/metrics"`) answers
/// `answer(n)` to its `n`-th request (from 0; the router's discovery probe is one of them).
/// Returns its URL.
pub async fn polled_worker(
    path: &'static str,
    answer: impl Fn(usize) -> Answer + Send + Sync + 'static,
) -> String {
    let answer = Arc::new(answer);
    let served = Arc::new(AtomicUsize::new(0));
    let page = get(move || {
        let (answer, served) = (answer.clone(), served.clone());
        async move {
            match answer(served.fetch_add(1, Relaxed)) {
                Answer::Body(b) => b,
                Answer::Stall => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    String::new()
                }
            }
        }
    });
    let info = json!({ "dp_size": 1, "kv_events": null });
    serve_loopback(server_info_app(info).route(path, page)).await
}

/// A `/v1/loads` body with one entry per `(dp_rank, running, waiting)`.
pub fn loads_body(ranks: &[(i64, i64, i64)]) -> String {
    let loads: Vec<_> = ranks
        .iter()
        .map(|(r, run, wait)| {
            json!({"dp_rank": r, "num_running_reqs": run, "num_waiting_reqs": wait})
        })
        .collect();
    json!({ "loads": loads }).to_string()
}

/// A vLLM `/metrics` page with the scheduler gauges of the engines `(engine, running, waiting)`.
pub fn vllm_metrics_body(engines: &[(u64, u64, u64)]) -> String {
    let mut page = String::new();
    for (name, pick) in [
        ("vllm:num_requests_running", 1),
        ("vllm:num_requests_waiting", 2),
    ] {
        page.push_str(&format!("# HELP {name} Requests.\n# TYPE {name} gauge\n"));
        for e in engines {
            let v = if pick == 1 { e.1 } else { e.2 };
            page.push_str(&format!(
                "{name}{{engine=\"{}\",model_name=\"m\"}} {v}.0\n",
                e.0
            ));
        }
    }
    page
}
