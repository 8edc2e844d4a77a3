//! The proxy path: pick a worker, open an in-flight guard, forward, and stream the answer back.
//!
//! The guard rides on the response body and is released when the body ends or is dropped (client
//! disconnect included) — never at headers, so a streaming response counts for its whole life.
//! Connect errors and 502/503/504 are retried on another worker with exponential backoff and
//! jitter, only before any byte reached the client; they also feed the worker's circuit breaker.
//! Upstream sockets use TCP_NODELAY and responses are passed through frame by frame (no buffering).

use crate::book::InflightGuard;
use crate::fleet::FleetView;
use crate::policy::mix;
use crate::server::{AppState, error_response};
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::Full;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// A response body that holds the request's in-flight guard until it ends or is dropped.
///
/// If the upstream dies mid-stream (worker killed), an SSE response ends with a clean error event
/// and `data: [DONE]` instead of a cut connection, so clients can tell "failed" from "truncated".
pub struct GuardedBody {
    inner: hyper::body::Incoming,
    guard: Option<InflightGuard>,
    sse: bool,
    finished: bool,
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match r {
            Poll::Ready(None) => {
                self.guard = None;
                self.finished = true;
            }
            Poll::Ready(Some(Err(e))) => {
                // Releasing the guard here (not at drop) keeps the in-flight count exact.
                if let Some(w) = self.guard.take().map(|g| g.worker().clone()) {
                    w.failures_total.fetch_add(1, Relaxed);
                }
                self.finished = true;
                if self.sse {
                    let msg = serde_json::json!({ "error": { "message": format!("the worker failed mid-stream: {e}"), "code": 502 } });
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(format!(
                        "data: {msg}\n\ndata: [DONE]\n\n"
                    ))))));
                }
                return Poll::Ready(Some(Err(e)));
            }
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.finished || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

const FORWARDED_HEADERS: [header::HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::AUTHORIZATION,
    header::ACCEPT,
    header::USER_AGENT,
];

fn retryable(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// Forwards one request. `body` has already been read (and size-checked).
pub async fn forward(
    st: Arc<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let workers = st.fleet.workers();
    if workers.is_empty() {
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "no workers configured; start with --worker-urls or add one with POST /workers",
        );
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let cfg = &st.cfg;
    let mut view = FleetView::new(&workers, cfg.load_signal, cfg.freshness_ms);
    let mut last_error = String::new();
    let mut delay = Duration::from_millis(cfg.retry_initial_backoff_ms);
    for attempt in 0..=cfg.max_retries {
        let seq = st.seq.fetch_add(1, Relaxed);
        view.now_ms = workers[0].now_ms();
        let Some(idx) = cfg.policy.pick(&view, seq) else {
            break;
        };
        if attempt > 0 {
            st.metrics.retries.fetch_add(1, Relaxed);
        }
        let worker = workers[idx].clone();
        // Same `now` as the pick: no second clock read on the request path.
        if worker
            .load_at(cfg.load_signal, cfg.freshness_ms, view.now_ms)
            .source
            == crate::book::Source::Fallback
        {
            st.metrics.fallback_decisions.fetch_add(1, Relaxed);
        }
        st.metrics.decisions.fetch_add(1, Relaxed);
        let guard = InflightGuard::new(worker.clone());
        let mut req = hyper::Request::builder()
            .method(method.clone())
            .uri(format!("{}{path}", worker.url));
        for h in &FORWARDED_HEADERS {
            if let Some(v) = headers.get(h) {
                req = req.header(h, v);
            }
        }
        let req = match req.body(Full::new(body.clone())) {
            Ok(r) => r,
            Err(e) => {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    &format!("cannot forward this request: {e}"),
                );
            }
        };
        let outcome = tokio::time::timeout(
            Duration::from_millis(cfg.upstream_timeout_ms),
            st.client.request(req),
        )
        .await;
        let failure = match outcome {
            Ok(Ok(resp)) if !retryable(resp.status()) => {
                worker.succeeded();
                st.metrics.observe_ttfb(started.elapsed());
                let (parts, incoming) = resp.into_parts();
                let sse = parts
                    .headers
                    .get(header::CONTENT_TYPE)
                    .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
                let mut out = Response::new(Body::new(GuardedBody {
                    inner: incoming,
                    guard: Some(guard),
                    sse,
                    finished: false,
                }));
                *out.status_mut() = parts.status;
                for h in [header::CONTENT_TYPE, header::CACHE_CONTROL] {
                    if let Some(v) = parts.headers.get(&h) {
                        out.headers_mut().insert(h, v.clone());
                    }
                }
                if let Ok(v) = HeaderValue::from_str(&worker.url) {
                    out.headers_mut().insert("x-loadlink-worker", v);
                }
                st.metrics.count_status(parts.status.as_u16());
                return out;
            }
            Ok(Ok(resp)) => format!("{} answered {}", worker.url, resp.status()),
            Ok(Err(e)) => format!("{}: {e}", worker.url),
            Err(_) => format!(
                "{}: no response headers within {} ms",
                worker.url, cfg.upstream_timeout_ms
            ),
        };
        drop(guard);
        worker.failed(cfg.breaker_threshold, cfg.breaker_cooldown_ms);
        tracing::debug!("attempt {attempt} failed: {failure}");
        last_error = failure;
        if idx < 64 {
            view.tried |= 1 << idx;
        }
        if attempt < cfg.max_retries {
            // Exponential backoff with full jitter derived from the request sequence.
            let jitter = (mix(seq) % 1000) as f64 / 1000.0;
            tokio::time::sleep(delay.mul_f64(0.5 + jitter / 2.0)).await;
            delay = (delay * 2).min(Duration::from_millis(cfg.retry_max_backoff_ms));
        }
    }
    st.metrics.count_status(502);
    let msg = if last_error.is_empty() {
        "no worker is available (all unhealthy or their breakers are open)".to_string()
    } else {
        format!("every attempt failed; last: {last_error}")
    };
    error_response(StatusCode::BAD_GATEWAY, &msg)
}
