//! The discovery routes a router reads when a worker registers: `/v1/models` (what is served:
//! names and adapters), `/server_info` (how: ranks, pool, KV events, adapters and which are
//! resident) and `/model_info`. The vLLM flavour's `/v1/models` shares the model cards.

use crate::state::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use loadlink_wire::Generation;
use loadlink_wire::descriptor::KvSnapshotSupport;
use loadlink_wire::kv_snapshot::SNAPSHOT_REQUEST;
use serde_json::{Value, json};
use std::sync::Arc;

/// `GET /v1/models` (SGLang flavour): a card per served name, then one per adapter.
pub(crate) async fn models(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(json!({ "object": "list", "data": model_cards(&st, "loadlink", &json!({})) }))
        .into_response()
}

/// The model cards of `/v1/models`: each served name (`root`: the model path, no parent), then
/// each adapter (`root`: its path, `parent`: the primary name, `loaded`: resident on rank 0, a
/// loadlink addition). `base` is merged into every card (each flavour's own keys).
pub(crate) fn model_cards(st: &AppState, owned_by: &str, base: &Value) -> Vec<Value> {
    let s = &st.served;
    let card = |id: &str, root: &str, parent: Option<&str>| {
        let mut c = base.clone();
        let fields = json!({"id": id, "object": "model", "created": 0, "owned_by": owned_by,
                            "root": root, "parent": parent});
        if let (Some(c), Value::Object(f)) = (c.as_object_mut(), fields) {
            c.extend(f);
        }
        c
    };
    let mut cards: Vec<Value> = s
        .names
        .iter()
        .map(|n| card(n, &s.model_path, None))
        .collect();
    let resident = resident_names(st).into_iter().next().unwrap_or_default();
    for (a, _) in &s.adapters {
        let mut c = card(&a.name, &a.path, Some(s.primary()));
        c["max_model_len"] = Value::Null;
        c["loaded"] = json!(resident.contains(&a.name));
        cards.push(c);
    }
    cards
}

/// Per rank, the names of its resident adapters, least recently used first (read under each
/// rank's scheduler lock, as `/cache_blocks` reads it).
pub(crate) fn resident_names(st: &AppState) -> Vec<Vec<String>> {
    st.ranks
        .iter()
        .map(|r| {
            let resident = r.scheduler.lock().map(|s| s.resident_adapters());
            resident
                .unwrap_or_default()
                .into_iter()
                .filter_map(|i| st.served.adapters.get(i as usize))
                .map(|(a, _)| a.name.clone())
                .collect()
        })
        .collect()
}

/// `/server_info`'s keys about models and adapters (SGLang's names; `lora_load_time_s` and
/// `loaded_loras` are loadlink's).
fn served_keys(st: &AppState) -> Value {
    let s = &st.served;
    let lora = !s.adapters.is_empty();
    let lora_paths: Vec<Value> = s
        .adapters
        .iter()
        .map(|(a, _)| json!({"lora_name": a.name, "lora_path": a.path, "pinned": false}))
        .collect();
    json!({
        "model_path": s.model_path,
        "served_model_name": s.primary(),
        "served_model_names": s.names,
        "enable_lora": lora,
        "lora_paths": if lora { json!(lora_paths) } else { Value::Null },
        "max_loaded_loras": if lora { json!(st.cfg.model.lora.max_loaded) } else { Value::Null },
        "lora_load_time_s": if lora { json!(st.cfg.model.lora.load_time_s) } else { Value::Null },
        "loaded_loras": if lora { json!(resident_names(st)) } else { Value::Null },
    })
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
    let mut info = json!({
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
        // Prefill–decode disaggregation, SGLang's keys: the role, and the bootstrap port bound
        // (null unless prefill); the link's simulated figures are loadlink's.
        "disaggregation_mode": c.pd.mode.as_str(),
        "disaggregation_bootstrap_port": st.pd.bound_port,
        "disaggregation_timeout_s": c.pd.timeout.as_secs_f64(),
        "kv_transfer_gb_s": c.pd.kv_transfer_gb_s,
        "kv_bytes_per_token": c.pd.kv_bytes_per_token,
    });
    if let (Some(info), Value::Object(served)) = (info.as_object_mut(), served_keys(&st)) {
        info.extend(served);
    }
    axum::Json(info).into_response()
}

/// `/model_info`, SGLang's shape: what a simulated model can honestly say (no tokenizer, no HF
/// config; SGLang's defaults for the rest). `sglang-router` reads it when a worker registers.
pub(crate) async fn model_info(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "model_path": st.served.model_path,
        "served_model_name": st.served.primary(),
        "tokenizer_path": null,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": null,
        "tool_call_parser": null,
        "disaggregation_mode": st.cfg.pd.mode.as_str(),
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": null,
        "architectures": null,
    }))
    .into_response()
}
