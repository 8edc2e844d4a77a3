//! The router process: configuration, the HTTP front (proxied routes, `/health`, `/metrics`,
//! `/workers`), the periodic health checks, and graceful shutdown.

use crate::book::{DROP_REASONS, LoadSignal, Source};
use crate::fleet::{Fleet, HttpClient, discover, http_client, validate_url};
use crate::policy::Policy;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Everything `loadlink route` is configured with.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub host: String,
    pub port: u16,
    pub worker_urls: Vec<String>,
    pub policy: Policy,
    pub load_signal: LoadSignal,
    /// Snapshots older than this are stale (every rank must be fresh).
    pub freshness_ms: u64,
    pub max_body_bytes: usize,
    /// A request body must arrive within this (slow-body / slowloris bound).
    pub body_timeout_ms: u64,
    pub max_retries: u32,
    pub retry_initial_backoff_ms: u64,
    pub retry_max_backoff_ms: u64,
    pub upstream_timeout_ms: u64,
    pub breaker_threshold: u64,
    pub breaker_cooldown_ms: u64,
    pub health_interval_ms: u64,
    pub discovery_attempts: u32,
    pub admin_token: Option<String>,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            host: "127.0.0.1".into(),
            port: 30080,
            worker_urls: Vec::new(),
            policy: Policy::PowerOfTwo,
            load_signal: LoadSignal::Backlog,
            freshness_ms: 3000,
            max_body_bytes: 16 << 20,
            body_timeout_ms: 30_000,
            max_retries: 2,
            retry_initial_backoff_ms: 50,
            retry_max_backoff_ms: 1000,
            upstream_timeout_ms: 600_000,
            breaker_threshold: 3,
            breaker_cooldown_ms: 5000,
            health_interval_ms: 5000,
            discovery_attempts: 5,
            admin_token: None,
        }
    }
}

/// Router-wide counters.
#[derive(Default)]
pub struct Metrics {
    pub decisions: AtomicU64,
    pub fallback_decisions: AtomicU64,
    pub retries: AtomicU64,
    /// Responses by status class: 2xx, 4xx, 5xx, other.
    pub status: [AtomicU64; 4],
    /// Time to upstream response headers, cumulative histogram over [`TTFB_BUCKETS_MS`].
    pub ttfb_buckets: [AtomicU64; 10],
    pub ttfb_sum_us: AtomicU64,
    pub ttfb_count: AtomicU64,
}

pub const TTFB_BUCKETS_MS: [f64; 10] = [
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0, 5000.0,
];

impl Metrics {
    pub fn count_status(&self, s: u16) {
        let i = match s {
            200..=299 => 0,
            400..=499 => 1,
            500..=599 => 2,
            _ => 3,
        };
        self.status[i].fetch_add(1, Relaxed);
    }

    pub fn observe_ttfb(&self, d: Duration) {
        let ms = d.as_secs_f64() * 1000.0;
        for (i, b) in TTFB_BUCKETS_MS.iter().enumerate() {
            if ms <= *b {
                self.ttfb_buckets[i].fetch_add(1, Relaxed);
            }
        }
        self.ttfb_sum_us.fetch_add(d.as_micros() as u64, Relaxed);
        self.ttfb_count.fetch_add(1, Relaxed);
    }
}

pub struct AppState {
    pub cfg: RouterConfig,
    pub fleet: Fleet,
    pub client: HttpClient,
    pub seq: AtomicU64,
    pub metrics: Metrics,
    /// Set at shutdown so endless streams (the dashboard feed) end and the drain can finish.
    pub stopping: std::sync::atomic::AtomicBool,
}

pub fn error_response(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(json!({ "error": { "message": message, "code": status.as_u16() } })),
    )
        .into_response()
}

/// A running router.
pub struct RouterHandle {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
    health: tokio::task::JoinHandle<()>,
}

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("--worker-urls: {0}")]
    WorkerUrl(String),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

impl RouterHandle {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, lets open responses (streams included) finish, then returns.
    pub async fn stop(mut self) {
        self.state.stopping.store(true, Relaxed);
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(s) = self.server.take() {
            let _ = s.await;
        }
        self.health.abort();
        let st = self.state.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for w in st.fleet.workers().iter() {
                st.fleet.remove(&w.url);
            }
        })
        .await;
    }
}

/// Discovers the configured workers, subscribes, and serves.
pub async fn start(cfg: RouterConfig) -> Result<RouterHandle, RouterError> {
    let urls: Vec<String> = cfg
        .worker_urls
        .iter()
        .map(|u| validate_url(u))
        .collect::<Result<_, _>>()
        .map_err(RouterError::WorkerUrl)?;
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| RouterError::Bind {
            addr: addr.clone(),
            source,
        })?;
    let local = listener
        .local_addr()
        .map_err(|source| RouterError::Bind { addr, source })?;
    let state = Arc::new(AppState {
        cfg,
        fleet: Fleet::default(),
        client: http_client(),
        seq: AtomicU64::new(0),
        metrics: Metrics::default(),
        stopping: Default::default(),
    });
    let discoveries = futures_util::future::join_all(
        urls.iter()
            .map(|u| discover(&state.client, u, state.cfg.discovery_attempts)),
    )
    .await;
    for (u, d) in urls.iter().zip(discoveries) {
        state.fleet.add(u, d);
    }
    let app = app(state.clone());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        // TCP_NODELAY on accepted sockets: small SSE events must not wait for Nagle.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let _ = axum::serve(listener, app.into_make_service())
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await;
    });
    let health = tokio::spawn(health_loop(state.clone()));
    tracing::info!(
        "router on http://{local} ({} workers, policy {}, signal {:?})",
        urls.len(),
        state.cfg.policy.as_str(),
        state.cfg.load_signal
    );
    Ok(RouterHandle {
        addr: local,
        state,
        shutdown: Some(tx),
        server: Some(server),
        health,
    })
}

async fn health_loop(st: Arc<AppState>) {
    let period = Duration::from_millis(st.cfg.health_interval_ms.max(100));
    loop {
        tokio::time::sleep(period).await;
        for w in st.fleet.workers().iter() {
            let req = match hyper::Request::get(format!("{}/health", w.url))
                .body(http_body_util::Full::default())
            {
                Ok(r) => r,
                Err(_) => continue,
            };
            let ok = matches!(tokio::time::timeout(Duration::from_secs(2), st.client.request(req)).await, Ok(Ok(r)) if r.status().is_success());
            if w.healthy.swap(ok, Relaxed) != ok {
                tracing::warn!(worker = %w.url, "health check {}", if ok { "passes again" } else { "failed" });
            }
        }
    }
}

fn app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/workers", get(list_workers).post(add_worker).delete(remove_worker))
        .route("/dashboard", get(|| async { axum::response::Html(DASHBOARD) }))
        .route("/dashboard/events", get(dashboard_events))
        .route("/v1/chat/completions", any(proxied))
        .route("/v1/completions", any(proxied))
        .route("/generate", any(proxied))
        .route("/v1/models", any(proxied))
        .fallback(|| async { error_response(StatusCode::NOT_FOUND, "no such route; the router serves /v1/chat/completions, /v1/completions, /generate, /v1/models, /workers, /metrics, /health") })
        .with_state(state)
}

async fn proxied(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let limit = st.cfg.max_body_bytes;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let too_big = || {
        error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body exceeds --max-body-bytes ({limit} bytes)"),
        )
    };
    if declared.is_some_and(|n| n > limit) {
        return too_big();
    }
    let read = axum::body::to_bytes(Body::new(body), limit);
    let bytes: Bytes =
        match tokio::time::timeout(Duration::from_millis(st.cfg.body_timeout_ms), read).await {
            Ok(Ok(b)) => b,
            Ok(Err(_)) => return too_big(),
            Err(_) => {
                return error_response(
                    StatusCode::REQUEST_TIMEOUT,
                    &format!(
                        "the request body did not arrive within --body-timeout-ms ({} ms)",
                        st.cfg.body_timeout_ms
                    ),
                );
            }
        };
    crate::proxy::forward(st, parts.method, parts.uri, parts.headers, bytes).await
}

fn worker_json(st: &AppState, w: &crate::book::Worker) -> Value {
    let l = w.load(st.cfg.load_signal, st.cfg.freshness_ms);
    json!({
        "url": w.url,
        "dp_size": w.ranks.len(),
        "load": l.requests,
        "score": l.score,
        "tokens": l.tokens,
        "source": l.source.as_str(),
        "age_ms": if l.age_ms == u64::MAX { Value::Null } else { json!(l.age_ms) },
        "inflight": w.inflight(),
        "healthy": w.healthy.load(Relaxed),
        "breaker_open": w.breaker_open(),
        "no_load_reason": w.no_load_reason,
        "ranks": w.ranks.iter().map(|r| json!({
            "running": r.running.load(Relaxed), "waiting": r.waiting.load(Relaxed),
            "token_usage": f64::from_bits(r.token_usage_bits.load(Relaxed)),
            "seq": r.last_seq.load(Relaxed), "gaps": r.gaps.load(Relaxed), "restarts": r.restarts.load(Relaxed),
        })).collect::<Vec<_>>(),
    })
}

fn workers_json(st: &AppState) -> Value {
    let ws = st.fleet.workers();
    json!({ "policy": st.cfg.policy.as_str(), "workers": ws.iter().map(|w| worker_json(st, w)).collect::<Vec<_>>() })
}

async fn list_workers(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(workers_json(&st)).into_response()
}

/// The live dashboard page (no external assets: everything is in this file).
const DASHBOARD: &str = include_str!("../assets/dashboard.html");

/// Server-sent events for the dashboard: the `/workers` document twice a second.
async fn dashboard_events(State(st): State<Arc<AppState>>) -> Response {
    let stream = futures_util::stream::unfold((st, true), |(st, first)| async move {
        if !first {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if st.stopping.load(Relaxed) {
            return None;
        }
        let event = format!("data: {}\n\n", workers_json(&st));
        Some((
            Ok::<_, std::convert::Infallible>(Bytes::from(event)),
            (st, false),
        ))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| {
            error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "building the event stream",
            )
        })
}

/// Checks the bearer token; the admin API is off unless `--admin-token` is set.
/// (The error is the response to send; it is built once per refused admin call, so its size is moot.)
#[allow(clippy::result_large_err)]
fn authorize(st: &AppState, headers: &HeaderMap) -> Result<(), Response> {
    let Some(token) = &st.cfg.admin_token else {
        return Err(error_response(
            StatusCode::FORBIDDEN,
            "the admin API is disabled; start the router with --admin-token to enable it",
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Constant-time comparison: the token is a secret.
    let ok = given.is_some_and(|g| {
        g.len() == token.len()
            && g.bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    });
    if ok {
        Ok(())
    } else {
        Err(error_response(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token (Authorization: Bearer <--admin-token>)",
        ))
    }
}

async fn add_worker(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(r) = authorize(&st, &headers) {
        return r;
    }
    let url = match serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("url").and_then(Value::as_str).map(str::to_string))
    {
        Some(u) => u,
        None => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "body: expected {\"url\": \"http://HOST:PORT\"}",
            );
        }
    };
    let url = match validate_url(&url) {
        Ok(u) => u,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, &e),
    };
    let d = discover(&st.client, &url, st.cfg.discovery_attempts).await;
    let w = st.fleet.add(&url, d);
    (StatusCode::CREATED, axum::Json(worker_json(&st, &w))).into_response()
}

async fn remove_worker(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = authorize(&st, &headers) {
        return r;
    }
    let Some(url) = q.get("url") else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "url: required query parameter (DELETE /workers?url=http://HOST:PORT)",
        );
    };
    let url = url.trim_end_matches('/').to_string();
    let st2 = st.clone();
    let removed = tokio::task::spawn_blocking(move || st2.fleet.remove(&url))
        .await
        .unwrap_or(false);
    if removed {
        StatusCode::NO_CONTENT.into_response()
    } else {
        error_response(StatusCode::NOT_FOUND, "no such worker")
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let mut o = String::new();
    let m = &st.metrics;
    let ws = st.fleet.workers();
    let _ = writeln!(
        o,
        "# HELP loadlink_router_decisions_total Routing decisions\n# TYPE loadlink_router_decisions_total counter"
    );
    let _ = writeln!(
        o,
        "loadlink_router_decisions_total {}",
        m.decisions.load(Relaxed)
    );
    let _ = writeln!(
        o,
        "# HELP loadlink_router_fallback_decisions_total Decisions that chose a worker priced on in-flight fallback\n# TYPE loadlink_router_fallback_decisions_total counter"
    );
    let _ = writeln!(
        o,
        "loadlink_router_fallback_decisions_total {}",
        m.fallback_decisions.load(Relaxed)
    );
    let _ = writeln!(
        o,
        "# HELP loadlink_router_retries_total Upstream attempts retried on another worker\n# TYPE loadlink_router_retries_total counter"
    );
    let _ = writeln!(
        o,
        "loadlink_router_retries_total {}",
        m.retries.load(Relaxed)
    );
    let _ = writeln!(
        o,
        "# HELP loadlink_router_responses_total Responses by status class\n# TYPE loadlink_router_responses_total counter"
    );
    for (i, c) in ["2xx", "4xx", "5xx", "other"].iter().enumerate() {
        let _ = writeln!(
            o,
            "loadlink_router_responses_total{{class=\"{c}\"}} {}",
            m.status[i].load(Relaxed)
        );
    }
    let _ = writeln!(
        o,
        "# HELP loadlink_router_upstream_headers_seconds Time to upstream response headers\n# TYPE loadlink_router_upstream_headers_seconds histogram"
    );
    for (i, b) in TTFB_BUCKETS_MS.iter().enumerate() {
        let _ = writeln!(
            o,
            "loadlink_router_upstream_headers_seconds_bucket{{le=\"{}\"}} {}",
            b / 1000.0,
            m.ttfb_buckets[i].load(Relaxed)
        );
    }
    let count = m.ttfb_count.load(Relaxed);
    let _ = writeln!(
        o,
        "loadlink_router_upstream_headers_seconds_bucket{{le=\"+Inf\"}} {count}"
    );
    let _ = writeln!(
        o,
        "loadlink_router_upstream_headers_seconds_sum {}",
        m.ttfb_sum_us.load(Relaxed) as f64 / 1e6
    );
    let _ = writeln!(o, "loadlink_router_upstream_headers_seconds_count {count}");
    let gauges: [(&str, &str, &str); 8] = [
        (
            "loadlink_worker_load",
            "gauge",
            "Load a policy sees (requests), with its source",
        ),
        (
            "loadlink_worker_load_age_seconds",
            "gauge",
            "Age of the oldest rank snapshot (NaN: none)",
        ),
        (
            "loadlink_worker_inflight",
            "gauge",
            "Open in-flight guards of this router",
        ),
        (
            "loadlink_worker_requests_total",
            "counter",
            "Requests dispatched",
        ),
        (
            "loadlink_worker_failures_total",
            "counter",
            "Failed upstream attempts",
        ),
        (
            "loadlink_worker_breaker_open",
            "gauge",
            "1 while the circuit breaker is open",
        ),
        (
            "loadlink_worker_healthy",
            "gauge",
            "1 while health checks pass",
        ),
        (
            "loadlink_worker_engine_priced",
            "gauge",
            "1 when priced on engine load, 0 on fallback",
        ),
    ];
    for (name, kind, help) in gauges {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for w in ws.iter() {
            let l = w.load(st.cfg.load_signal, st.cfg.freshness_ms);
            let v = match name {
                "loadlink_worker_load" => {
                    let _ = writeln!(
                        o,
                        "{name}{{worker=\"{}\",source=\"{}\"}} {}",
                        w.url,
                        l.source.as_str(),
                        l.requests
                    );
                    continue;
                }
                "loadlink_worker_load_age_seconds" => {
                    if l.age_ms == u64::MAX {
                        f64::NAN
                    } else {
                        l.age_ms as f64 / 1000.0
                    }
                }
                "loadlink_worker_inflight" => w.inflight() as f64,
                "loadlink_worker_requests_total" => w.requests_total.load(Relaxed) as f64,
                "loadlink_worker_failures_total" => w.failures_total.load(Relaxed) as f64,
                "loadlink_worker_breaker_open" => f64::from(u8::from(w.breaker_open())),
                "loadlink_worker_healthy" => f64::from(u8::from(w.healthy.load(Relaxed))),
                _ => f64::from(u8::from(l.source == Source::Engine)),
            };
            let _ = writeln!(o, "{name}{{worker=\"{}\"}} {v}", w.url);
        }
    }
    let _ = writeln!(
        o,
        "# HELP loadlink_rank_messages_total Load messages received per rank\n# TYPE loadlink_rank_messages_total counter"
    );
    let _ = writeln!(
        o,
        "# HELP loadlink_rank_seq_gaps_total Sequence numbers skipped (PUB drops)\n# TYPE loadlink_rank_seq_gaps_total counter"
    );
    let _ = writeln!(
        o,
        "# HELP loadlink_rank_restarts_total Publisher restarts detected (seq went back)\n# TYPE loadlink_rank_restarts_total counter"
    );
    for w in ws.iter() {
        for (i, r) in w.ranks.iter().enumerate() {
            let _ = writeln!(
                o,
                "loadlink_rank_messages_total{{worker=\"{}\",rank=\"{i}\"}} {}",
                w.url,
                r.messages.load(Relaxed)
            );
            let _ = writeln!(
                o,
                "loadlink_rank_seq_gaps_total{{worker=\"{}\",rank=\"{i}\"}} {}",
                w.url,
                r.gaps.load(Relaxed)
            );
            let _ = writeln!(
                o,
                "loadlink_rank_restarts_total{{worker=\"{}\",rank=\"{i}\"}} {}",
                w.url,
                r.restarts.load(Relaxed)
            );
        }
    }
    let _ = writeln!(
        o,
        "# HELP loadlink_frames_dropped_total Load frames dropped, by reason\n# TYPE loadlink_frames_dropped_total counter"
    );
    for w in ws.iter() {
        for (i, reason) in DROP_REASONS.iter().enumerate() {
            let _ = writeln!(
                o,
                "loadlink_frames_dropped_total{{worker=\"{}\",reason=\"{reason}\"}} {}",
                w.url,
                w.dropped[i].load(Relaxed)
            );
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], o).into_response()
}
