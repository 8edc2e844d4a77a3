//! The route handlers: generation (parse the body, resolve its model or adapter, take the routed
//! rank or pick one, submit, reply) and the read-only routes (`/get_load`, `/v1/loads`,
//! `/cache_blocks`, `/flush_cache`). Discovery is in [`crate::discovery`], `/metrics` in
//! [`crate::metrics`].

use crate::api::{GenRequest, Route, parse_chat, parse_completions, parse_generate};
use crate::flavor::Flavor;
use crate::model::Submit;
use crate::pd::respond::{self as pd, Plan};
use crate::rank::{Command, wall_now};
use crate::reply::{
    AbortGuard, Reply, error, json_response, refused, stream_error, stream_response,
};
use crate::routed;
use crate::served::Selection;
use crate::state::{AppState, RankFrom};
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use loadlink_wire::LoadSnapshot;
use loadlink_wire::kv_namespace::Namespace;
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
    let selection = match st.served.select(
        st.cfg.flavor,
        req.model.as_deref(),
        req.lora_path.as_deref(),
    ) {
        Ok(s) => s,
        Err(refusal) => {
            st.model_requests[st.served.unserved_label()].fetch_add(1, Ordering::Relaxed);
            return refused(&refusal, req.route, req.stream);
        }
    };
    let id = st.next_id.fetch_add(1, Ordering::Relaxed);
    let plan = match pd::plan(&st.cfg.pd, &req, id) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let (rank, from) = match place(&st, &headers, &req) {
        Ok(placed) => placed,
        Err(r) => return *r,
    };
    let (tx, rx) = unbounded_channel();
    let mut submit = scoped(&st, &req, selection, id).with_disagg(plan.disagg());
    if plan == Plan::LocalOneToken {
        submit.max_new_tokens = 1;
    }
    let prompt_tokens = submit.prompt_tokens;
    let commands = st.ranks[rank].commands.clone();
    if commands.send(Command::Submit(submit, tx)).is_err() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the engine is shutting down",
        );
    }
    st.requests_total.fetch_add(1, Ordering::Relaxed);
    st.model_requests[selection.label].fetch_add(1, Ordering::Relaxed);
    st.rank_requests[rank][from as usize].fetch_add(1, Ordering::Relaxed);
    st.open_requests.fetch_add(1, Ordering::Relaxed);
    let guard = AbortGuard {
        id,
        commands,
        finished: false,
        aborted_total: st.aborted_total.clone(),
        open: st.open_requests.clone(),
    };
    let model = reply_model(&st, &req, selection);
    let reply = Reply {
        id,
        req,
        model,
        created: wall_now() as u64,
        prompt_tokens,
    };
    match plan {
        Plan::Prefill { room } => pd::prefill(st.clone(), room, reply, rx, guard).await,
        Plan::Decode {
            addr,
            room,
            dp_rank,
        } => pd::decode(st.clone(), (addr, room, dp_rank), reply, rx, guard).await,
        _ if reply.req.stream => stream_response(reply, rx, guard),
        _ => json_response(reply, rx, guard).await,
    }
}

/// The request for the scheduler: its prompt, its adapter and its cache namespace.
fn scoped(st: &AppState, req: &GenRequest, selection: Selection, id: u64) -> Submit {
    let mut submit = if req.prompt.is_empty() {
        Submit::counted(id, req.prompt_tokens, req.max_tokens.max(1))
    } else {
        Submit::tokens(id, req.prompt.clone(), req.max_tokens.max(1))
    };
    if let Some(i) = selection.adapter {
        submit = submit.with_adapter(i);
    }
    let adapter = selection
        .adapter
        .and_then(|i| st.served.adapters.get(i as usize));
    let lora = adapter.map(|(_, l)| l.clone());
    if lora.is_some() || req.cache_salt.is_some() || req.extra_key.is_some() {
        submit = submit.with_namespace(Arc::new(Namespace {
            extra_key: req.extra_key.clone(),
            cache_salt: req.cache_salt.clone(),
            lora,
        }));
    }
    submit
}

/// The `model` a response names: SGLang echoes the request's, vLLM names the adapter or its
/// primary name.
fn reply_model(st: &AppState, req: &GenRequest, selection: Selection) -> String {
    let adapter = selection
        .adapter
        .and_then(|i| st.served.adapters.get(i as usize));
    match (st.cfg.flavor, &req.model, adapter) {
        (Flavor::Sglang, Some(m), _) => m.clone(),
        (Flavor::Vllm, _, Some((a, _))) => a.name.clone(),
        _ => st.served.primary().to_string(),
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
