//! The router process: binds, discovers the configured workers, wires the routes to their owners
//! ([`crate::proxy`], [`crate::admin`], [`crate::metrics`], [`crate::dashboard`]), runs the periodic
//! health checks, and shuts down gracefully (open streams finish first).

pub use crate::config::RouterConfig;
use crate::discovery::DiscoveryLimits;
use crate::fleet::discover;
use crate::state::{AppState, error_response};
use crate::{admin, dashboard, metrics, proxy};
use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// A running router.
pub struct RouterHandle {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
    health: tokio::task::JoinHandle<()>,
    /// The executor-lateness ticker ([`crate::executor_probe`]).
    probe: tokio::task::JoinHandle<()>,
    /// The watched-file and DNS membership tasks.
    membership: Vec<tokio::task::JoinHandle<()>>,
}

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("--worker-urls: {0}")]
    WorkerUrl(String),
    #[error("{0}")]
    Tokenizer(String),
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

    /// Begins a drain: from now on `/readiness` answers 503 (so a load balancer takes this
    /// router out of rotation) while every route, `/readiness` included, is still served.
    pub fn begin_drain(&self) {
        self.state.draining.store(true, Relaxed);
    }

    /// Shuts down the way an orchestrator expects: `/readiness` fails at once while requests are
    /// still served for `delay` (the time a load balancer needs to notice), then the listener
    /// closes and open responses (streams included) get up to `timeout` to finish. Returns
    /// `false` when the drain was cut short by `timeout`.
    pub async fn drain(self, delay: Duration, timeout: Duration) -> bool {
        self.begin_drain();
        tokio::time::sleep(delay).await;
        self.stop_within(timeout).await
    }

    /// Stops accepting, lets open responses (streams included) finish, then returns.
    pub async fn stop(self) {
        self.stop_within(Duration::MAX).await;
    }

    /// Stops accepting and lets open responses finish for up to `timeout` (then they are cut),
    /// then leaves every worker. Returns `false` when open responses had to be cut.
    async fn stop_within(mut self, timeout: Duration) -> bool {
        self.begin_drain();
        self.state.stopping.store(true, Relaxed);
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let mut finished = true;
        if let Some(mut s) = self.server.take() {
            // `Duration::MAX` would overflow the deadline: no bound then.
            finished = match tokio::time::Instant::now().checked_add(timeout) {
                Some(deadline) => tokio::time::timeout_at(deadline, &mut s).await.is_ok(),
                None => {
                    let _ = (&mut s).await;
                    true
                }
            };
            if !finished {
                s.abort();
            }
        }
        self.health.abort();
        self.probe.abort();
        self.membership.iter().for_each(|t| t.abort());
        self.state.fleet.stop_polling();
        let st = self.state.clone();
        // Unsubscribing waits for the ingest thread to close the sockets: not on the executor.
        let _ = tokio::task::spawn_blocking(move || {
            for w in st.fleet.workers().iter() {
                st.fleet.remove(&w.url);
            }
        })
        .await;
        finished
    }
}

/// Discovers the configured workers, subscribes, and serves.
pub async fn start(cfg: RouterConfig) -> Result<RouterHandle, RouterError> {
    let urls = cfg
        .validated_worker_urls()
        .map_err(RouterError::WorkerUrl)?;
    let (listener, local) = bind(&cfg.bind_addr()).await?;
    let state = Arc::new(AppState::new(cfg).map_err(RouterError::Tokenizer)?);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    // Serving starts before discovery: each worker is routable once its own discovery is done.
    let server = tokio::spawn(serve(listener, app(state.clone()), rx));
    let probe = state.executor.spawn(crate::executor_probe::PERIOD);
    add_workers(&state, &urls).await;
    let health = tokio::spawn(health_loop(state.clone()));
    let mut membership = crate::membership::spawn(&state);
    membership.extend(crate::models::refresh::spawn(&state));
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
        probe,
        membership,
    })
}

async fn bind(addr: &str) -> Result<(tokio::net::TcpListener, SocketAddr), RouterError> {
    let bind_error = |source| RouterError::Bind {
        addr: addr.to_string(),
        source,
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}

/// Discovers the workers (at most `discovery_concurrency` at once, each bounded by its
/// discovery budget) and adds each to the fleet as soon as its own discovery ends, so a slow or
/// stalled worker delays nobody. Each add grants the descriptors its subscriptions need (raising
/// the soft limit) or refuses that worker's subscriptions with a visible reason
/// ([`crate::fleet::Fleet::add`]): start-up and runtime adds follow one rule.
async fn add_workers(state: &AppState, urls: &[String]) {
    use futures_util::StreamExt;
    let limits = state.discovery_limits();
    let concurrency = state.cfg.discovery_concurrency.max(1);
    let mut queued = urls.iter();
    let mut running = futures_util::stream::FuturesUnordered::new();
    let (mut ranks, mut kv_ranks) = (0, 0);
    loop {
        while running.len() < concurrency {
            let Some(url) = queued.next() else { break };
            running.push(discover_one(state, url, &limits));
        }
        let Some((url, d)) = running.next().await else {
            break;
        };
        ranks += d.endpoints.len();
        kv_ranks += d.kv_ranks();
        state.fleet.add(url, d);
    }
    let needed = crate::fdlimit::descriptors_needed_with_kv(urls.len(), ranks, kv_ranks);
    tracing::info!(
        "{} workers, {ranks} load and {kv_ranks} KV-event subscriptions: {needed} file descriptors needed",
        urls.len()
    );
}

/// `url` with its discovery (a named function: a closure here would not be `Send` for every
/// lifetime, and `start` must stay spawnable).
async fn discover_one<'a>(
    state: &AppState,
    url: &'a str,
    limits: &DiscoveryLimits,
) -> (&'a str, crate::discovery::Discovery) {
    (url, discover(&state.client, url, limits).await)
}

/// `GET /readiness`: 200 while the router takes traffic and has a worker that may take it; 503
/// once it drains (SIGTERM) or when no worker is available, so a load balancer stops sending.
async fn readiness(axum::extract::State(st): axum::extract::State<Arc<AppState>>) -> Response {
    if st.draining.load(Relaxed) {
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "draining: shutting down");
    }
    let workers = st.fleet.workers();
    if !workers.iter().any(|w| w.available()) {
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "no worker is available");
    }
    axum::Json(serde_json::json!({ "status": "ready", "workers": workers.len() })).into_response()
}

/// Serves `app` until `stop` fires, then drains open responses.
async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    // TCP_NODELAY on accepted sockets: small SSE events must not wait for Nagle.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let _ = axum::serve(listener, app.into_make_service())
        .with_graceful_shutdown(async move {
            let _ = stop.await;
        })
        .await;
}

/// Marks workers healthy or not from `GET /health` every `health_interval_ms` (±10% jitter, so
/// replicas and rounds do not align), at most [`HEALTH_CONCURRENCY`] checks in flight. A healthy
/// worker whose load stream is fresh is not checked: its engine is demonstrably alive.
async fn health_loop(st: Arc<AppState>) {
    use futures_util::StreamExt;
    let period = st.cfg.health_interval_ms.max(100);
    let mut round = st.seq.load(Relaxed);
    loop {
        round = round.wrapping_add(1);
        tokio::time::sleep(Duration::from_millis(jittered(period, round))).await;
        let workers = st.fleet.workers();
        let due = workers
            .iter()
            .filter(|w| !(w.is_healthy() && stream_fresh(w, st.cfg.freshness_ms)));
        futures_util::stream::iter(due)
            .for_each_concurrent(HEALTH_CONCURRENCY, |w| check_health(&st, w))
            .await;
    }
}

/// Health checks in flight at once.
pub const HEALTH_CONCURRENCY: usize = 32;

/// `period` ms ± 10%, varied by `round` (a cheap hash; no need for a real RNG).
fn jittered(period: u64, round: u64) -> u64 {
    let h = round.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    let span = (period / 5).max(1);
    period - span / 2 + h % span
}

/// Whether every rank of `w` reported within the freshness bound.
fn stream_fresh(w: &crate::book::Worker, freshness_ms: u64) -> bool {
    !w.ranks.is_empty()
        && w.load(crate::book::LoadSignal::Engine, freshness_ms).source
            == crate::book::Source::Engine
}

async fn check_health(st: &AppState, w: &Arc<crate::book::Worker>) {
    let Ok(req) =
        hyper::Request::get(format!("{}/health", w.url)).body(http_body_util::Full::default())
    else {
        return;
    };
    let ok = matches!(tokio::time::timeout(Duration::from_secs(2), st.client.request(req)).await, Ok(Ok(r)) if r.status().is_success());
    if w.set_healthy(ok) {
        tracing::warn!(worker = %w.url, "health check {}", if ok { "passes again" } else { "failed" });
    }
}

fn app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/readiness", get(readiness))
        .route("/metrics", get(metrics::page))
        .route(
            "/workers",
            get(admin::list_workers)
                .post(admin::add_worker)
                .delete(admin::remove_worker),
        )
        .route("/dashboard", get(dashboard::page))
        .route("/dashboard/events", get(dashboard::events))
        .route("/v1/chat/completions", any(proxy::proxied))
        .route("/v1/completions", any(proxy::proxied))
        .route("/generate", any(proxy::proxied))
        .route("/v1/models", get(crate::models::union))
        .route("/v1/embeddings", any(proxy::proxied))
        .route("/v1/rerank", any(proxy::proxied))
        .route("/v1/responses", any(proxy::proxied))
        .route("/health_generate", any(proxy::proxied))
        .route("/get_server_info", any(proxy::proxied))
        .route("/get_model_info", any(proxy::proxied))
        .fallback(|| async { error_response(StatusCode::NOT_FOUND, "no such route; the router serves /v1/chat/completions, /v1/completions, /generate, /v1/embeddings, /v1/rerank, /v1/responses, /v1/models, /health_generate, /get_server_info, /get_model_info, /workers, /metrics, /health, /readiness") })
        .with_state(state)
}

#[cfg(test)]
mod tests {
    #[test]
    fn jitter_stays_within_ten_percent() {
        for round in 0..1000 {
            let j = super::jittered(5000, round);
            assert!((4500..5500).contains(&j), "{j}");
        }
        assert_ne!(super::jittered(5000, 1), super::jittered(5000, 2));
    }
}
