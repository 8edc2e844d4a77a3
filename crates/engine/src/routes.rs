//! The route handlers: generation (parse the body, take the routed rank or pick one, submit,
//! reply) and the read-only routes (`/v1/models`, `/server_info`, `/model_info`, `/get_load`,
//! `/v1/loads`). `/metrics` is in [`crate::metrics`].

use crate::api::{GenRequest, Route, parse_chat, parse_completions, parse_generate};
use crate::model::Submit;
use crate::rank::{Command, wall_now};
use crate::reply::{AbortGuard, Reply, error, json_response, stream_error, stream_response};
use crate::routed;
use crate::state::{AppState, RankFrom};
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use loadlink_wire::Generation;
use loadlink_wire::LoadSnapshot;
use loadlink_wire::descriptor::KvSnapshotSupport;
use loadlink_wire::kv_snapshot::SNAPSHOT_REQUEST;
use loadlink_wire::loads::{
    Include, LoadsMeta, iso8601, render_json, render_prometheus, snapshot_dict,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::mpsc::unbounded_channel;

/// Oversized bodies up to this size are read and discarded before the 413 goes out.
const DRAIN_LIMIT: usize = 16 << 20;

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
    if let Some(n) = declared.filter(|&n| n > limit) {
        // Read (and drop) a moderately oversized body before answering, so the client is not
        // still writing when the connection closes and does see the 413.
        if n <= DRAIN_LIMIT {
            let mut stream = body.into_data_stream();
            while let Some(Ok(_)) = stream.next().await {}
        }
        return Err(too_big());
    }
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_big())
}

pub(crate) async fn generate(
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
    let (rank, from) = match place(&st, &headers, &req) {
        Ok(placed) => placed,
        Err(r) => return *r,
    };
    let id = st.next_id.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = unbounded_channel();
    let submit = if req.prompt.is_empty() {
        Submit::counted(id, req.prompt_tokens, req.max_tokens.max(1))
    } else {
        Submit::tokens(id, req.prompt.clone(), req.max_tokens.max(1))
    };
    let prompt_tokens = submit.prompt_tokens;
    let commands = st.ranks[rank].commands.clone();
    if commands.send(Command::Submit(submit, tx)).is_err() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the engine is shutting down",
        );
    }
    st.requests_total.fetch_add(1, Ordering::Relaxed);
    st.rank_requests[rank][from as usize].fetch_add(1, Ordering::Relaxed);
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
        prompt_tokens,
    };
    if reply.req.stream {
        stream_response(reply, rx, guard)
    } else {
        json_response(reply, rx, guard).await
    }
}

/// The rank a request runs on: the one its client routed it to ([`crate::routed`]), else the
/// dispatcher's pick. A bad header or an out-of-range rank is answered as SGLang answers it: a
/// 400, except a streamed `/generate`, whose error SGLang sends as an event of a 200 stream.
fn place(
    st: &AppState,
    headers: &HeaderMap,
    req: &GenRequest,
) -> Result<(usize, RankFrom), Box<Response>> {
    let header = match req.route {
        Route::Generate => None,
        _ => routed::header_rank(headers)
            .map_err(|m| Box::new(error(StatusCode::BAD_REQUEST, &m)))?,
    };
    let routed = match routed::requested(req.route, header, req.routed_dp_rank) {
        None => None,
        Some(rank) => routed::check(rank, st.cfg.dp_size).map_err(|m| {
            Box::new(if req.route == Route::Generate && req.stream {
                stream_error(&m)
            } else {
                error(StatusCode::BAD_REQUEST, &m)
            })
        })?,
    };
    Ok(match routed {
        Some(rank) => {
            st.dispatcher.count_routed(rank);
            (rank, RankFrom::Routed)
        }
        None => (st.dispatcher.pick_rank(), RankFrom::Dispatcher),
    })
}

pub(crate) async fn models(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(json!({ "object": "list", "data": [{ "id": st.cfg.model_name, "object": "model", "owned_by": "loadlink" }] })).into_response()
}

pub(crate) async fn server_info(State(st): State<Arc<AppState>>) -> Response {
    let c = &st.cfg;
    let mut kv = st
        .settings
        .advertise(c.model.page_size as i64)
        .map_or(Value::Null, |d| {
            serde_json::to_value(d).unwrap_or(Value::Null)
        });
    // Epochs (and snapshots), when every rank publishes (a rank whose sockets failed to bind has
    // no publisher, hence no epoch: then none is advertised).
    let epochs: Option<Vec<u64>> = st
        .ranks
        .iter()
        .map(|r| r.kv_seq.as_ref().map(|(_, e)| *e))
        .collect();
    if let Some(epochs) = epochs.filter(|e| !e.is_empty()) {
        // Snapshots are answered on the replay sockets: advertised only where those exist.
        let replay = kv
            .get("replay_endpoint_port_base")
            .is_some_and(|v| !v.is_null());
        KvSnapshotSupport {
            snapshot: replay.then(|| String::from_utf8_lossy(SNAPSHOT_REQUEST).into_owned()),
            epochs,
        }
        .insert_into(&mut kv);
    }
    axum::Json(json!({
        "model_path": c.model_name,
        "served_model_name": c.model_name,
        "version": concat!("loadlink-", env!("CARGO_PKG_VERSION")),
        "dp_size": c.dp_size,
        "max_running_requests": c.model.max_running_requests,
        "max_total_num_tokens": c.model.max_total_tokens,
        "chunked_prefill_size": c.model.chunked_prefill_size,
        "page_size": c.model.page_size,
        // The host KV tier a router prices a host-tier hit by (tokens; 0: none).
        "hicache_size_tokens": c.model.host_tier.tokens,
        "hicache_load_tokens_per_s": c.model.host_tier.load_tokens_per_s,
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

/// `/model_info`, SGLang's shape: what a simulated model can honestly say (no tokenizer, no HF
/// config; SGLang's defaults for the rest). `sglang-router` reads it when a worker registers.
pub(crate) async fn model_info(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "model_path": st.cfg.model_name,
        "served_model_name": st.cfg.model_name,
        "tokenizer_path": null,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": null,
        "tool_call_parser": null,
        "disaggregation_mode": "null",
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": null,
        "architectures": null,
    }))
    .into_response()
}

/// `/get_load`: one object per DP rank. `sglang-router`'s load monitor (power-of-two, DP-minimum
/// tokens) sums `num_tokens` per worker and keys ranks by `dp_rank`; the legacy fields
/// (`num_reqs`, `num_tokens` = KV in use plus queued prompt tokens, as SGLang's scheduler counted
/// them) sit beside the rank's `/v1/loads` core block (what SGLang 0.5.23's gRPC `get_load`
/// returns).
/// `POST /flush_cache`, as SGLang serves it: every rank drops the cached pages no running request
/// holds (announced on the KV-event stream). Benchmarks call it so each run starts cold.
pub(crate) async fn flush_cache(State(st): State<Arc<AppState>>) -> Response {
    for r in &st.ranks {
        if r.commands.send(Command::FlushCache).is_err() {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the engine is shutting down",
            );
        }
    }
    (StatusCode::OK, "Cache flushed.\n").into_response()
}

/// `GET /cache_blocks` (debug): every rank's cached page hashes (any tier), sorted, as
/// `{"ranks": [{"dp_rank", "block_size", "blocks": [...], "seq", "epoch", "device_blocks": [...],
/// "host_blocks": [...]}]}` (the last two: pages on the device, pages with a host copy). What a KV-event
/// subscriber's index must converge to; the router's KV-index tests compare with it. `seq` is the
/// last KV batch seq assigned (−1: none yet), read under the scheduler lock with the blocks, so a
/// subscriber that applied every batch up to `seq` holds exactly `blocks`; `seq` and `epoch` are
/// null when the rank publishes no KV events.
pub(crate) async fn cache_blocks(State(st): State<Arc<AppState>>) -> Response {
    let ranks: Vec<Value> = st
        .ranks
        .iter()
        .map(|r| {
            let (blocks, (device, host), page, seq) = match r.scheduler.lock() {
                Ok(s) => {
                    let seq = r.kv_seq.as_ref().map(|(q, _)| q.last_assigned());
                    (s.cached_blocks(), s.tier_blocks(), s.config().page_size, seq)
                }
                Err(_) => (Vec::new(), Default::default(), 0, None),
            };
            let epoch = r.kv_seq.as_ref().map(|(_, e)| *e);
            json!({"dp_rank": r.rank, "block_size": page, "blocks": blocks, "seq": seq, "epoch": epoch,
                   "device_blocks": device, "host_blocks": host})
        })
        .collect();
    axum::Json(json!({ "ranks": ranks })).into_response()
}

pub(crate) async fn get_load(State(st): State<Arc<AppState>>) -> Response {
    let loads: Vec<Value> = st
        .dispatcher
        .snapshots()
        .iter()
        .map(get_load_entry)
        .collect();
    axum::Json(loads).into_response()
}

fn get_load_entry(s: &LoadSnapshot) -> Value {
    let core = Include {
        memory: false,
        spec: false,
        lora: false,
        disagg: false,
        queues: false,
        ..Include::ALL
    };
    let mut entry = snapshot_dict(s, core);
    entry["num_reqs"] = json!(s.num_running_reqs + s.num_waiting_reqs);
    entry["num_tokens"] = json!(s.num_total_tokens);
    entry
}

pub(crate) async fn loads(
    State(st): State<Arc<AppState>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let include = match Include::parse(q.get("include").map(String::as_str)) {
        Ok(i) => i,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let mut snaps = st.dispatcher.snapshots();
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
