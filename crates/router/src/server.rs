//! The router process: binds, discovers the configured workers, wires the routes to their owners
//! ([`crate::proxy`], [`crate::admin`], [`crate::metrics`], [`crate::dashboard`]), runs the periodic
//! health checks, and shuts down gracefully (open streams finish first).

pub use crate::config::RouterConfig;
use crate::fleet::discover;
use crate::state::{AppState, error_response};
use crate::{admin, dashboard, metrics, proxy};
use axum::Router;
use axum::http::StatusCode;
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
        // Unsubscribing joins subscriber threads: not on the async executor.
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
    let urls = cfg
        .validated_worker_urls()
        .map_err(RouterError::WorkerUrl)?;
    let (listener, local) = bind(&cfg.bind_addr()).await?;
    let state = Arc::new(AppState::new(cfg));
    add_workers(&state, &urls).await;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, app(state.clone()), rx));
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

/// Discovers every worker at once and adds them to the fleet.
async fn add_workers(state: &AppState, urls: &[String]) {
    let attempts = state.cfg.discovery_attempts;
    let discoveries =
        futures_util::future::join_all(urls.iter().map(|u| discover(&state.client, u, attempts)))
            .await;
    for (u, d) in urls.iter().zip(discoveries) {
        state.fleet.add(u, d);
    }
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

/// Marks workers healthy or not from `GET /health` every `health_interval_ms`.
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
        .route("/v1/models", any(proxy::proxied))
        .fallback(|| async { error_response(StatusCode::NOT_FOUND, "no such route; the router serves /v1/chat/completions, /v1/completions, /generate, /v1/models, /workers, /metrics, /health") })
        .with_state(state)
}
