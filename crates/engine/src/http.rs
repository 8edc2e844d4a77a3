//! The engine's HTTP surface, shaped like SGLang's: OpenAI-compatible generation routes (JSON and
//! SSE), `/generate`, `/server_info` with the real `kv_events` descriptor, `/v1/loads`, `/metrics`
//! with SGLang's gauge names, `/health`, `/v1/models`.
//!
//! Requests go to a rank chosen by the internal dispatcher, which reads the **SHM sink** (fewest
//! running + waiting, corrected by what it dispatched since that rank's last snapshot), so the
//! internal sink is genuinely consumed. A client that disconnects aborts its request, which frees
//! its KV at once.

use crate::api::{GenRequest, Route, parse_chat, parse_completions, parse_generate};
use crate::cycle::PublishPoint;
use crate::model::{Event, ModelConfig, Submit};
use crate::rank::{Command, RankHandle, spawn, wall_now};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use loadlink_publish::{EngineSettings, InternalSink, ShmReader, build_sinks};
use loadlink_wire::loads::{Include, LoadsMeta, iso8601, render_json, render_prometheus};
use loadlink_wire::{Generation, LoadSnapshot};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::fmt::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

/// Everything `loadlink engine` is configured with.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub host: String,
    /// 0: pick a free port.
    pub port: u16,
    pub dp_size: u32,
    pub model: ModelConfig,
    pub time_scale: f64,
    pub kv_events_config: Option<String>,
    pub load_publish_endpoint: Option<String>,
    pub publish_interval: u32,
    pub generation: Generation,
    pub max_body_bytes: usize,
    pub model_name: String,
    /// KV block size advertised in the descriptor (SGLang's page size).
    pub page_size: i64,
    /// Where in the scheduler cycle each rank publishes.
    pub publish_point: PublishPoint,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            host: "127.0.0.1".into(),
            port: 30000,
            dp_size: 1,
            model: ModelConfig::default(),
            time_scale: 1.0,
            kv_events_config: None,
            load_publish_endpoint: None,
            publish_interval: 1,
            generation: Generation::Snapshot,
            max_body_bytes: 4 << 20,
            model_name: "loadlink-sim".into(),
            page_size: 16,
            publish_point: PublishPoint::default(),
        }
    }
}

struct AppState {
    cfg: EngineConfig,
    settings: EngineSettings,
    ranks: Vec<RankHandle>,
    shm: Option<ShmReader>,
    shm_path: PathBuf,
    next_id: AtomicU64,
    /// Per rank: (timestamp of the snapshot last seen, dispatched since then).
    dispatch: Mutex<Vec<(f64, i64)>>,
    rr: AtomicU64,
    requests_total: AtomicU64,
    aborted_total: Arc<AtomicU64>,
    open_requests: Arc<AtomicI64>,
}

/// A running engine.
pub struct Engine {
    pub addr: SocketAddr,
    state: Arc<AppState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
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
}

impl Engine {
    /// Binds the HTTP port, starts one thread per rank and serves until [`Engine::stop`].
    pub async fn start(cfg: EngineConfig) -> Result<Engine, EngineError> {
        if cfg.dp_size == 0 || cfg.dp_size > 1024 {
            return Err(EngineError::DpSize(cfg.dp_size));
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
        let instance = format!("loadlink-engine-{}-{}", local.port(), std::process::id());
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
        let ctx = zmq::Context::new();
        let ranks: Vec<RankHandle> = (0..cfg.dp_size)
            .map(|r| {
                let built = build_sinks(&ctx, &settings, r);
                spawn(r, cfg.model, cfg.time_scale, cfg.publish_point, built.sinks)
            })
            .collect();
        let shm = ShmReader::open(&shm_path).map_err(|e| EngineError::Shm {
            path: shm_path.display().to_string(),
            reason: e.to_string(),
        });
        let shm = match shm {
            Ok(s) => Some(s),
            Err(e) => {
                ranks.iter().for_each(RankHandle::stop);
                return Err(e);
            }
        };
        match settings
            .advertise(cfg.page_size)
            .and_then(|d| d.load_endpoint_port_base)
        {
            Some(base) => tracing::info!(
                "engine on http://{local}, load ranks on tcp://*:{base}..{}",
                base as u32 + cfg.dp_size - 1
            ),
            None => tracing::info!("engine on http://{local}, not publishing load to routers"),
        }
        let state = Arc::new(AppState {
            dispatch: Mutex::new(vec![(0.0, 0); cfg.dp_size as usize]),
            cfg,
            settings,
            ranks,
            shm,
            shm_path,
            next_id: AtomicU64::new(1),
            rr: AtomicU64::new(0),
            requests_total: AtomicU64::new(0),
            aborted_total: Arc::default(),
            open_requests: Arc::default(),
        });
        let app = router(state.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
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
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests accepted but not yet finished or aborted.
    pub fn open_requests(&self) -> i64 {
        self.state.open_requests.load(Ordering::Relaxed)
    }

    /// Stops serving, stops the ranks and removes the slot file.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(s) = self.server.take() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s).await;
        }
        let state = self.state.clone();
        let _ = tokio::task::spawn_blocking(move || state.ranks.iter().for_each(RankHandle::stop))
            .await;
        let _ = std::fs::remove_file(&self.state.shm_path);
    }
}

fn router(state: Arc<AppState>) -> Router {
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
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .route("/health_generate", get(|| async { "ok" }))
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/v1/loads", get(loads))
        .route("/metrics", get(metrics))
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "no such route; see /server_info and /v1/models",
            )
        })
        .with_state(state)
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "error": { "message": message, "type": "invalid_request_error", "code": status.as_u16() } }))).into_response()
}

async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, Response> {
    let too_big = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body exceeds --max-body-bytes ({limit} bytes)"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_big());
    }
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_big())
}

impl AppState {
    /// Fewest running + waiting per the SHM slots, plus what was dispatched since each rank's
    /// last snapshot; ties broken round-robin.
    fn pick_rank(&self) -> usize {
        let n = self.ranks.len();
        if n == 1 {
            return 0;
        }
        let snaps = self
            .shm
            .as_ref()
            .and_then(|s| s.snapshots().ok())
            .unwrap_or_default();
        let mut d = self.dispatch.lock().unwrap_or_else(|p| p.into_inner());
        let start = self.rr.fetch_add(1, Ordering::Relaxed) as usize;
        let mut best = (i64::MAX, 0);
        for k in 0..n {
            let r = (start + k) % n;
            let (load, ts) = snaps.get(r).and_then(Option::as_ref).map_or((0, 0.0), |s| {
                (s.num_running_reqs + s.num_waiting_reqs, s.timestamp())
            });
            if ts != d[r].0 {
                d[r] = (ts, 0);
            }
            let score = load + d[r].1;
            if score < best.0 {
                best = (score, r);
            }
        }
        d[best.1].1 += 1;
        best.1
    }

    fn snapshots(&self) -> Vec<LoadSnapshot> {
        self.shm
            .as_ref()
            .and_then(|s| s.snapshots().ok())
            .unwrap_or_default()
            .into_iter()
            .flatten()
            .collect()
    }
}

/// Aborts the request when the client goes away before it finished (body dropped).
struct AbortGuard {
    id: u64,
    commands: std::sync::mpsc::Sender<Command>,
    finished: bool,
    aborted_total: Arc<AtomicU64>,
    open: Arc<AtomicI64>,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.commands.send(Command::Abort(self.id));
            self.aborted_total.fetch_add(1, Ordering::Relaxed);
        }
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn generate(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
    route: Route,
) -> Response {
    let bytes = match read_body(&headers, body, st.cfg.max_body_bytes).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let parsed = match route {
        Route::Completions => parse_completions(&bytes),
        Route::Chat => parse_chat(&bytes),
        Route::Generate => parse_generate(&bytes),
    };
    let req = match parsed {
        Ok(r) => r,
        Err(msg) => return error(StatusCode::BAD_REQUEST, &msg),
    };
    let id = st.next_id.fetch_add(1, Ordering::Relaxed);
    let rank = st.pick_rank();
    let (tx, rx) = unbounded_channel();
    let submit = Submit {
        id,
        prompt_tokens: req.prompt_tokens,
        max_new_tokens: req.max_tokens.max(1),
    };
    let commands = st.ranks[rank].commands.clone();
    if commands.send(Command::Submit(submit, tx)).is_err() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the engine is shutting down",
        );
    }
    st.requests_total.fetch_add(1, Ordering::Relaxed);
    st.open_requests.fetch_add(1, Ordering::Relaxed);
    let guard = AbortGuard {
        id,
        commands,
        finished: false,
        aborted_total: st.aborted_total.clone(),
        open: st.open_requests.clone(),
    };
    let reply = Reply {
        id,
        req,
        model: st.cfg.model_name.clone(),
        created: wall_now() as u64,
        prompt_tokens: submit.prompt_tokens,
    };
    if reply.req.stream {
        stream_response(reply, rx, guard)
    } else {
        json_response(reply, rx, guard).await
    }
}

/// What a response needs to know about its request.
struct Reply {
    id: u64,
    req: GenRequest,
    model: String,
    created: u64,
    prompt_tokens: u64,
}

const TOKEN_TEXT: &str = " tok";

impl Reply {
    fn usage(&self, completion: u64) -> Value {
        json!({ "prompt_tokens": self.prompt_tokens, "completion_tokens": completion, "total_tokens": self.prompt_tokens + completion })
    }

    fn final_json(&self, completion: u64) -> Value {
        let text = TOKEN_TEXT.repeat(completion as usize);
        match self.req.route {
            Route::Completions => json!({
                "id": format!("cmpl-{}", self.id), "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": "length" }],
                "usage": self.usage(completion),
            }),
            Route::Chat => json!({
                "id": format!("chatcmpl-{}", self.id), "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{ "index": 0, "message": { "role": "assistant", "content": text }, "finish_reason": "length" }],
                "usage": self.usage(completion),
            }),
            Route::Generate => json!({ "text": text, "meta_info": self.meta(completion, true) }),
        }
    }

    fn meta(&self, completion: u64, done: bool) -> Value {
        json!({
            "id": self.id.to_string(), "prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
            "finish_reason": if done { json!({ "type": "length", "length": completion }) } else { Value::Null },
        })
    }

    /// One SSE event carrying `n` new tokens (`done`: the last event before `[DONE]`).
    fn chunk(&self, n: u64, total: u64, done: bool) -> String {
        let finish = if done { json!("length") } else { Value::Null };
        let text = TOKEN_TEXT.repeat(n as usize);
        let v = match self.req.route {
            Route::Completions => {
                let mut v = json!({ "id": format!("cmpl-{}", self.id), "object": "text_completion", "created": self.created, "model": self.model,
                    "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": finish }] });
                if done && self.req.include_usage {
                    v["usage"] = self.usage(total);
                }
                v
            }
            Route::Chat => {
                let mut v = json!({ "id": format!("chatcmpl-{}", self.id), "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [{ "index": 0, "delta": { "role": "assistant", "content": text }, "finish_reason": finish }] });
                if done && self.req.include_usage {
                    v["usage"] = self.usage(total);
                }
                v
            }
            Route::Generate => {
                json!({ "text": TOKEN_TEXT.repeat(total as usize), "meta_info": self.meta(total, done) })
            }
        };
        format!("data: {v}\n\n")
    }
}

async fn json_response(
    reply: Reply,
    mut rx: UnboundedReceiver<Event>,
    mut guard: AbortGuard,
) -> Response {
    while let Some(e) = rx.recv().await {
        if let Event::Finished {
            completion_tokens, ..
        } = e
        {
            guard.finished = true;
            return axum::Json(reply.final_json(completion_tokens)).into_response();
        }
    }
    guard.finished = true;
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "the engine stopped before the request finished",
    )
}

fn stream_response(reply: Reply, rx: UnboundedReceiver<Event>, guard: AbortGuard) -> Response {
    struct S {
        reply: Reply,
        rx: UnboundedReceiver<Event>,
        guard: AbortGuard,
        sent: u64,
        done: bool,
    }
    let init = S {
        reply,
        rx,
        guard,
        sent: 0,
        done: false,
    };
    let stream = futures_util::stream::unfold(init, |mut s| async move {
        if s.done {
            return None;
        }
        let out = match s.rx.recv().await {
            Some(Event::FirstToken { .. } | Event::Token { .. }) => {
                s.sent += 1;
                s.reply.chunk(1, s.sent, false)
            }
            Some(Event::Finished {
                completion_tokens, ..
            }) => {
                let rest = completion_tokens.saturating_sub(s.sent);
                s.guard.finished = true;
                s.done = true;
                format!(
                    "{}data: [DONE]\n\n",
                    s.reply.chunk(rest, completion_tokens, true)
                )
            }
            None => {
                s.guard.finished = true;
                s.done = true;
                "data: {\"error\":{\"message\":\"the engine stopped before the request finished\"}}\n\ndata: [DONE]\n\n".to_string()
            }
        };
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(out)), s))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "building the stream"))
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(json!({ "object": "list", "data": [{ "id": st.cfg.model_name, "object": "model", "owned_by": "loadlink" }] })).into_response()
}

async fn server_info(State(st): State<Arc<AppState>>) -> Response {
    let c = &st.cfg;
    let kv = st.settings.advertise(c.page_size).map_or(Value::Null, |d| {
        serde_json::to_value(d).unwrap_or(Value::Null)
    });
    axum::Json(json!({
        "model_path": c.model_name,
        "served_model_name": c.model_name,
        "version": concat!("loadlink-", env!("CARGO_PKG_VERSION")),
        "dp_size": c.dp_size,
        "max_running_requests": c.model.max_running_requests,
        "max_total_num_tokens": c.model.max_total_tokens,
        "chunked_prefill_size": c.model.chunked_prefill_size,
        "page_size": c.page_size,
        "kv_events_config": c.kv_events_config,
        "load_publish_endpoint": c.load_publish_endpoint,
        "load_wire": match c.generation { Generation::Snapshot => "snapshot", Generation::LoadStat => "loadstat" },
        "time_scale": c.time_scale,
        "kv_events": kv,
        // Why there is no load range, when there is none (null when publishing or quietly off).
        "load_publish_decline_reason": st.settings.load_range().err().flatten(),
    }))
    .into_response()
}

async fn loads(
    State(st): State<Arc<AppState>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let include = match Include::parse(q.get("include").map(String::as_str)) {
        Ok(i) => i,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let mut snaps = st.snapshots();
    if let Some(r) = q.get("dp_rank") {
        match r.parse::<i64>() {
            Ok(r) if (0..st.cfg.dp_size as i64).contains(&r) => snaps.retain(|s| s.dp_rank == r),
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "dp_rank: expected an integer in 0..{}, got {r:?}",
                        st.cfg.dp_size
                    ),
                );
            }
        }
    }
    match q.get("format").map(String::as_str) {
        None | Some("json") => {
            let ts = iso8601(wall_now());
            let meta = LoadsMeta {
                timestamp: &ts,
                version: env!("CARGO_PKG_VERSION"),
                accelerator: "simulated",
                num_accelerators: st.cfg.dp_size,
            };
            axum::Json(render_json(&meta, &snaps, include)).into_response()
        }
        Some("prometheus") => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            render_prometheus(&snaps, include),
        )
            .into_response(),
        Some(f) => error(
            StatusCode::BAD_REQUEST,
            &format!("format: expected json or prometheus, got {f:?}"),
        ),
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let snaps = st.snapshots();
    let mut out = String::new();
    type Gauge = (&'static str, &'static str, fn(&LoadSnapshot) -> f64);
    let gauges: [Gauge; 8] = [
        ("sglang:num_running_reqs", "Running requests", |s| {
            s.num_running_reqs as f64
        }),
        ("sglang:num_queue_reqs", "Waiting requests", |s| {
            s.num_waiting_reqs as f64
        }),
        ("sglang:num_used_tokens", "KV tokens in use", |s| {
            s.num_used_tokens as f64
        }),
        (
            "sglang:token_usage",
            "KV pool usage (0-1)",
            LoadSnapshot::token_usage,
        ),
        (
            "sglang:gen_throughput",
            "Generated tokens per second",
            LoadSnapshot::gen_throughput,
        ),
        (
            "sglang:cache_hit_rate",
            "Prefix cache hit rate",
            LoadSnapshot::cache_hit_rate,
        ),
        (
            "sglang:utilization",
            "Busy fraction",
            LoadSnapshot::utilization,
        ),
        ("sglang:max_total_num_tokens", "KV pool size", |s| {
            s.max_total_num_tokens as f64
        }),
    ];
    for (name, help, f) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for s in &snaps {
            let _ = writeln!(
                out,
                "{name}{{dp_rank=\"{}\",model_name=\"{}\"}} {}",
                s.dp_rank,
                st.cfg.model_name,
                f(s)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP loadlink_engine_requests_total Generation requests accepted\n# TYPE loadlink_engine_requests_total counter"
    );
    let _ = writeln!(
        out,
        "loadlink_engine_requests_total {}",
        st.requests_total.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP loadlink_engine_aborted_total Requests aborted by client disconnect\n# TYPE loadlink_engine_aborted_total counter"
    );
    let _ = writeln!(
        out,
        "loadlink_engine_aborted_total {}",
        st.aborted_total.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP loadlink_engine_open_requests Requests accepted and not yet finished\n# TYPE loadlink_engine_open_requests gauge"
    );
    let _ = writeln!(
        out,
        "loadlink_engine_open_requests {}",
        st.open_requests.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP loadlink_publish_total Load publications per rank, sink and outcome\n# TYPE loadlink_publish_total counter"
    );
    for r in &st.ranks {
        for (sink, s) in &r.sink_stats {
            for (outcome, v) in [
                ("published", &s.published),
                ("dropped", &s.dropped),
                ("skipped", &s.skipped),
                ("failed", &s.failed),
            ] {
                let _ = writeln!(
                    out,
                    "loadlink_publish_total{{rank=\"{}\",sink=\"{sink}\",outcome=\"{outcome}\"}} {}",
                    r.rank,
                    v.load(Ordering::Relaxed)
                );
            }
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}
