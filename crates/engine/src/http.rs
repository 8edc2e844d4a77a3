//! The engine's HTTP surface, shaped like SGLang's: OpenAI-compatible generation routes (JSON and
//! SSE), `/generate`, `/server_info` with the real `kv_events` descriptor, `/model_info` (and
//! `/get_model_info`), `/get_load` (what `sglang-router` polls), `/v1/loads`, `/metrics` with
//! SGLang's gauge names, `/health`, `/v1/models`.
//!
//! This file holds the engine's start, its drain and stop, and the route table. The parts:
//! [`crate::state`] (the configuration and the handlers' shared state), [`crate::routes`] (handlers), [`crate::reply`] (JSON and SSE responses, abort on disconnect),
//! [`crate::dispatch`] (which rank a request goes to, read from the SHM sink) and
//! [`crate::metrics`] (`/metrics`).

use crate::api::Route;
use crate::discovery::{model_info, models, server_info};
use crate::dispatch::Dispatcher;
use crate::flavor::Flavor;
use crate::rank::{RankHandle, spawn};
use crate::reply::error;
use crate::routes::{generate, get_load, loads};
use crate::served::{DEFAULT_MAX_LOADED_LORAS, Served};
use crate::state::AppState;
pub use crate::state::EngineConfig;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use loadlink_publish::{EngineSettings, InternalSink, ShmReader, build_kv_publisher, build_sinks};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A running engine.
pub struct Engine {
    pub addr: SocketAddr,
    state: Arc<AppState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
    /// The prefill side's bootstrap server (prefill mode only).
    bootstrap: Option<crate::pd::server::BootstrapServer>,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("--kv-events-config: {0}")]
    KvConfig(String),
    #[error("--dp-size must be between 1 and 1024, got {0}")]
    DpSize(u32),
    #[error("binding the HTTP port {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("opening the internal load slot file {path}: {reason}")]
    Shm { path: String, reason: String },
    #[error("served models: {0}")]
    Served(String),
    #[error(
        "binding the disaggregation bootstrap port {addr} (--disaggregation-bootstrap-port; 0 \
         picks a free one): {source}"
    )]
    Bootstrap {
        addr: String,
        source: std::io::Error,
    },
}

impl Engine {
    /// Binds the HTTP port, starts one thread per rank and serves until [`Engine::stop`].
    pub async fn start(mut cfg: EngineConfig) -> Result<Engine, EngineError> {
        if cfg.flavor == Flavor::Vllm {
            cfg.kv_events_config = None;
            cfg.load_publish_endpoint = Some("off".into());
        }
        if cfg.dp_size == 0 || cfg.dp_size > 1024 {
            return Err(EngineError::DpSize(cfg.dp_size));
        }
        let names = std::iter::once(cfg.model_name.clone())
            .chain(cfg.extra_served_names.iter().cloned())
            .collect();
        let served = Served::new(names, cfg.model_path.clone(), cfg.adapters.clone())
            .map_err(EngineError::Served)?;
        if !served.adapters.is_empty() && cfg.model.lora.max_loaded == 0 {
            cfg.model.lora.max_loaded = DEFAULT_MAX_LOADED_LORAS;
        }
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|source| EngineError::Bind {
                addr: addr.clone(),
                source,
            })?;
        let local = listener
            .local_addr()
            .map_err(|source| EngineError::Bind { addr, source })?;
        let (bootstrap_listener, bound_port) = bind_bootstrap(&cfg).await?;
        // Housekeeping of /dev/shm: a directory scan, kept off the executor.
        let _ = tokio::task::spawn_blocking(remove_stale_slots).await;
        let instance = loadlink_wire::shm::engine_instance(local.port(), std::process::id());
        let shm_path = PathBuf::from(loadlink_wire::shm::shm_path_for(&instance));
        let settings = EngineSettings {
            kv_events_config: cfg.kv_events_config.clone(),
            load_publish_endpoint: cfg.load_publish_endpoint.clone(),
            publish_interval: cfg.publish_interval,
            dp_size: cfg.dp_size,
            generation: cfg.generation,
            internal: InternalSink::Shm(shm_path.clone()),
        };
        settings.kv_config().map_err(EngineError::KvConfig)?;
        let ranks = start_ranks(&cfg, &settings);
        let shm = match open_slots(&shm_path) {
            Ok(s) => s,
            Err(e) => {
                ranks.iter().for_each(RankHandle::stop);
                return Err(e);
            }
        };
        log_endpoints(&cfg, &settings, local);
        for r in &ranks {
            if let Ok(mut s) = r.scheduler.lock() {
                s.set_disaggregation(cfg.pd.mode, cfg.pd.kv_transfer_gb_s);
            }
        }
        let pd = pd_state(&cfg, bound_port);
        let bootstrap = bootstrap_listener.map(|l| {
            crate::pd::server::BootstrapServer::start(l, pd.rooms.clone(), cfg.pd.timeout)
        });
        let cfg_ranks = ranks.len();
        let state = Arc::new(AppState {
            dispatcher: Dispatcher::new(ranks.len(), Some(shm)),
            cfg,
            settings,
            ranks,
            shm_path,
            next_id: AtomicU64::new(1),
            requests_total: AtomicU64::new(0),
            aborted_total: Arc::default(),
            open_requests: Arc::default(),
            draining: AtomicBool::new(false),
            rank_requests: (0..cfg_ranks).map(|_| Default::default()).collect(),
            model_requests: served.labels().map(|_| AtomicU64::new(0)).collect(),
            served,
            pd,
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let app = router(state.clone());
        // TCP_NODELAY: a first token smaller than a segment must not wait for the client's
        // delayed ACK (Nagle): on a reused connection that cost ~40 ms per request.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(Engine {
            addr: local,
            state,
            shutdown: Some(tx),
            server: Some(server),
            bootstrap,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The disaggregation bootstrap port bound (prefill engines only).
    pub fn bootstrap_port(&self) -> Option<u16> {
        self.state.pd.bound_port
    }

    /// Requests accepted but not yet finished or aborted.
    pub fn open_requests(&self) -> i64 {
        self.state.open_requests.load(Ordering::Relaxed)
    }

    /// Stops serving (open responses get up to 5 s), stops the ranks and removes the slot file.
    pub async fn stop(self) {
        self.stop_within(Duration::from_secs(5)).await;
    }

    /// Begins a drain: from now on `/readiness` answers 503 while every route is still served.
    pub fn begin_drain(&self) {
        self.state.draining.store(true, Ordering::Relaxed);
    }

    /// Shuts down the way an orchestrator expects: `/readiness` fails at once while requests are
    /// still served for `delay`, then the listener closes and open responses get up to `timeout`
    /// ([`Engine::stop_within`]).
    pub async fn drain(self, delay: Duration, timeout: Duration) {
        self.begin_drain();
        tokio::time::sleep(delay).await;
        self.stop_within(timeout).await;
    }

    /// Stops accepting, lets open responses (streams included) finish for up to `drain`, stops
    /// the ranks and removes the slot file.
    pub async fn stop_within(mut self, drain: Duration) {
        self.begin_drain();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(mut s) = self.server.take() {
            match tokio::time::Instant::now().checked_add(drain) {
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, &mut s).await.is_err() {
                        s.abort();
                    }
                }
                None => {
                    let _ = s.await;
                }
            }
        }
        if let Some(b) = self.bootstrap.take() {
            b.stop();
        }
        let state = self.state.clone();
        let _ = tokio::task::spawn_blocking(move || state.ranks.iter().for_each(RankHandle::stop))
            .await;
        let _ = std::fs::remove_file(&self.state.shm_path);
    }
}

impl Drop for Engine {
    /// The slot file goes on every exit path the engine controls: a stop, a drain cut short
    /// (its future dropped), or an engine dropped without a stop.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.state.shm_path);
    }
}

/// A prefill engine's bootstrap listener, bound on the engine's host (and the port it got).
async fn bind_bootstrap(
    cfg: &EngineConfig,
) -> Result<(Option<tokio::net::TcpListener>, Option<u16>), EngineError> {
    if cfg.pd.mode != crate::pd::PdMode::Prefill {
        return Ok((None, None));
    }
    let addr = format!("{}:{}", cfg.host, cfg.pd.bootstrap_port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| EngineError::Bootstrap {
            addr: addr.clone(),
            source,
        })?;
    let port = listener
        .local_addr()
        .map_err(|source| EngineError::Bootstrap { addr, source })?
        .port();
    tracing::info!("disaggregation bootstrap server on {}:{port}", cfg.host);
    Ok((Some(listener), Some(port)))
}

/// The handlers' disaggregation state.
fn pd_state(cfg: &EngineConfig, bound_port: Option<u16>) -> crate::pd::PdState {
    let outcomes: Arc<[AtomicU64; 3]> = Arc::default();
    crate::pd::PdState {
        cfg: cfg.pd,
        bound_port,
        rooms: Arc::new(crate::pd::rooms::Rooms::new(
            cfg.pd,
            cfg.time_scale,
            outcomes.clone(),
        )),
        client: Default::default(),
        outcomes,
        time_scale: if cfg.time_scale > 0.0 {
            cfg.time_scale
        } else {
            1.0
        },
    }
}

/// One rank thread per DP rank, each with the sinks the factory builds for it.
fn start_ranks(cfg: &EngineConfig, settings: &EngineSettings) -> Vec<RankHandle> {
    let ctx = zmq::Context::new();
    (0..cfg.dp_size)
        .map(|r| {
            let built = build_sinks(&ctx, settings, r);
            let kv = build_kv_publisher(&ctx, settings, r).unwrap_or_else(|e| {
                tracing::warn!(rank = r, "KV events not published: {e}");
                None
            });
            if let Some(k) = &kv {
                k.set_epoch_in_topic(cfg.kv_epoch_in_topic);
            }
            spawn(
                r,
                cfg.model,
                cfg.time_scale,
                cfg.publish_point,
                built.sinks,
                kv,
            )
        })
        .collect()
}

/// Removes the slot files of engines that died without a shutdown (see
/// [`loadlink_publish::stale_slots`]), so SIGKILLed engines do not fill `/dev/shm`.
fn remove_stale_slots() {
    let removed = loadlink_publish::remove_stale_slot_files(Path::new(
        loadlink_publish::stale_slots::SHM_DIR,
    ));
    if !removed.is_empty() {
        tracing::info!(
            "removed {} slot files of engines that are gone: {removed:?}",
            removed.len()
        );
    }
}

/// The dispatcher's reader of the slot file the ranks' SHM sinks write.
fn open_slots(path: &Path) -> Result<ShmReader, EngineError> {
    ShmReader::open(path).map_err(|e| EngineError::Shm {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

fn log_endpoints(cfg: &EngineConfig, settings: &EngineSettings, local: SocketAddr) {
    match settings
        .advertise(cfg.model.page_size as i64)
        .and_then(|d| d.load_endpoint_port_base)
    {
        Some(base) => tracing::info!(
            "engine on http://{local}, load ranks on tcp://*:{base}..{}",
            base as u32 + cfg.dp_size - 1
        ),
        None => tracing::info!("engine on http://{local}, not publishing load to routers"),
    }
}

fn router(state: Arc<AppState>) -> Router {
    let routes = generation_routes()
        .route("/health", get(|| async { "ok" }))
        .route("/readiness", get(readiness));
    let routes = match state.cfg.flavor {
        Flavor::Sglang => sglang_routes(routes),
        Flavor::Vllm => routes
            .route("/v1/models", get(crate::flavor::vllm_models))
            .route("/metrics", get(crate::flavor::vllm_metrics)),
    };
    routes
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "no such route; see /server_info and /v1/models",
            )
        })
        .with_state(state)
}

/// `GET /readiness`: 200 while the engine takes traffic, 503 once a drain has begun (the engine
/// still serves during `--drain-delay`, so a load balancer can take it out of rotation first).
async fn readiness(State(st): State<Arc<AppState>>) -> axum::response::Response {
    use axum::response::IntoResponse;
    if st.draining.load(Ordering::Relaxed) {
        return error(StatusCode::SERVICE_UNAVAILABLE, "draining: shutting down");
    }
    axum::Json(serde_json::json!({ "status": "ready" })).into_response()
}

/// The generation routes every flavour serves.
fn generation_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/v1/completions",
            post(|s: State<Arc<AppState>>, h: HeaderMap, b: Body| {
                generate(s, h, b, Route::Completions)
            }),
        )
        .route(
            "/v1/chat/completions",
            post(|s: State<Arc<AppState>>, h: HeaderMap, b: Body| generate(s, h, b, Route::Chat)),
        )
        .route(
            "/generate",
            post(|s: State<Arc<AppState>>, h: HeaderMap, b: Body| {
                generate(s, h, b, Route::Generate)
            }),
        )
}

/// SGLang's read-only routes: discovery, loads, metrics, cache control.
fn sglang_routes(routes: Router<Arc<AppState>>) -> Router<Arc<AppState>> {
    routes
        .route("/v1/models", get(models))
        .route("/health_generate", get(|| async { "ok" }))
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/model_info", get(model_info))
        .route("/get_model_info", get(model_info))
        .route("/get_load", get(get_load))
        .route("/flush_cache", post(crate::routes::flush_cache))
        .route("/cache_blocks", get(crate::routes::cache_blocks))
        .route("/v1/loads", get(loads))
        .route("/metrics", get(crate::metrics::metrics))
}
