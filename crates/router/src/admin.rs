//! The admin API and the worker list: `GET /workers` (open, also fed to the dashboard), and
//! `POST /workers` / `DELETE /workers?url=` to change the fleet at runtime. Changes need the bearer
//! token from `--admin-token`; without one they are refused, so a router is never open by accident.
//! Each worker shows its KV-index figures under `kv_events` (null, with `no_kv_events_reason`, for
//! a worker without a KV-event stream).

use crate::book::{RankState, Worker};
use crate::candidate::RankTargets;
use crate::fleet::{discover, validate_url};
use crate::state::{AppState, error_response};
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// One worker as `/workers` shows it: its load and source, breaker and health, and per rank.
pub fn worker_json(st: &AppState, w: &Worker) -> Value {
    let l = w.load(st.cfg.load_signal, st.cfg.freshness_ms);
    let (kv_events, no_kv_events_reason) = st.cache.worker_json(w);
    let (load_source, load_source_reason) = w.source_status(&l, st.cfg.freshness_ms);
    json!({
        "url": w.url,
        "role": w.pd.role().as_str(),
        "bootstrap_port": w.pd.shown_port(),
        "dp_size": w.ranks.len(),
        "load": l.requests,
        "score": l.score,
        "tokens": l.tokens,
        "source": l.source.as_str(),
        "utilisation": w.utilisation(),
        "eviction_regret": kv_events.get("eviction_regret").cloned().unwrap_or(Value::Null),
        "age_ms": if l.age_ms == u64::MAX { Value::Null } else { json!(l.age_ms) },
        "inflight": w.inflight(),
        "queued_prefill_tokens": w
            .pricing_at(st.cfg.load_signal, st.cfg.freshness_ms, w.now_ms())
            .queued_tokens,
        "unanswered_stream_tokens": w.unanswered_stream_tokens(),
        "healthy": w.is_healthy(),
        "breaker_open": w.breaker_open(),
        "no_load_reason": w.no_load_reason,
        "load_source": load_source,
        "load_source_configured": w.load_source.kind.as_str(),
        "load_source_reason": load_source_reason,
        "load_polls": poll_json(w),
        "kv_events": kv_events,
        "routed": routed_json(w),
        "no_kv_events_reason": no_kv_events_reason,
        "refusals": refusals_json(w),
        "last_refusal": w.refusals.last(),
        "models": models_json(st, w),
        "rank_routing": rank_routing_json(st, w),
        "ranks": w.ranks.iter().map(|r| rank_json(st, w, r)).collect::<Vec<_>>(),
    })
}

/// What `w` serves, as last read ([`crate::models`]), and why the last read failed.
fn models_json(st: &AppState, w: &Worker) -> Value {
    let (served, error) = st.fleet.models.of(&w.url);
    let Some(s) = served else {
        return json!({ "names": null, "adapters": [], "error": error,
            "routed_as": "any model no worker names" });
    };
    let strs = |v: &[Arc<str>]| v.iter().map(|n| json!(&**n)).collect::<Vec<_>>();
    json!({
        "names": strs(&s.names),
        "adapters": s.adapters.iter().map(|a| json!({ "name": &*a.name, "path": a.path.as_deref(),
            "lora_id": a.lora.as_ref().map(|l| &l.id) })).collect::<Vec<_>>(),
        "max_loaded_loras": s.max_loaded_loras,
        "lora_load_time_s": s.lora_load_time_s,
        "loaded_loras": s.loaded.as_ref().map(|ranks| ranks.iter().map(|r| strs(r)).collect::<Vec<_>>()),
        "error": error,
    })
}

/// Whether `w` is routed per rank, or whole and why.
fn rank_routing_json(st: &AppState, w: &Worker) -> Value {
    match w.rank_targets(st.cfg.dp_rank_field) {
        RankTargets::Whole(why) => json!({ "mode": "worker", "reason": why }),
        RankTargets::PerRank => json!({
            "mode": "per-rank", "field": st.cfg.dp_rank_field.as_str(), "reason": Value::Null
        }),
    }
}

/// One rank in `/workers`: what it reported, its own load as a rank candidate, and what this
/// router routed to it by name (requests, prompt tokens, the share believed cached there).
fn rank_json(st: &AppState, w: &Worker, r: &RankState) -> Value {
    let l = w.rank_load_at(
        r.rank as u32,
        st.cfg.load_signal,
        st.cfg.freshness_ms,
        w.now_ms(),
    );
    let routed = r.routed();
    let (prompt, cached) = (
        routed.prompt_tokens.load(Relaxed),
        routed.cached_tokens.load(Relaxed),
    );
    json!({
        "rank": r.rank, "running": r.running.load(Relaxed), "waiting": r.waiting.load(Relaxed),
        "backlog_tokens": r.backlog.load(Relaxed),
        "token_usage": f64::from_bits(r.token_usage_bits.load(Relaxed)),
        "utilisation": r.rho(), "utilisation_source": r.utilisation.source().as_str(),
        "pool_free_tokens": r.pool_free(),
        "load": l.requests, "score": l.score, "source": l.source.as_str(),
        "age_ms": if l.age_ms == u64::MAX { Value::Null } else { json!(l.age_ms) },
        "inflight": routed.inflight(),
        "routed_requests": routed.requests_total.load(Relaxed),
        "routed_prompt_tokens": prompt, "routed_cached_tokens": cached,
        "hit_rate": if prompt == 0 { Value::Null } else { json!(cached as f64 / prompt as f64) },
        "seq": r.last_seq.load(Relaxed), "gaps": r.gaps.load(Relaxed), "restarts": r.restarts.load(Relaxed),
    })
}

/// What this router routed to `w` after cache lookups: prompt tokens, and the share it believed
/// cached there (null before any).
fn routed_json(w: &Worker) -> Value {
    let prompt = w.routed_prompt_tokens.load(Relaxed);
    let cached = w.routed_cached_tokens.load(Relaxed);
    json!({
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": if prompt == 0 { Value::Null } else { json!(cached as f64 / prompt as f64) },
    })
}

/// What this worker sent that was refused, by reason (reasons with a count only).
fn refusals_json(w: &Worker) -> Value {
    let counts = w.refusals.counts();
    Value::Object(
        counts
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| (r.as_str().to_string(), json!(n)))
            .collect(),
    )
}

/// A polled worker's poll counters and last error (null for push and in-flight workers).
fn poll_json(w: &Worker) -> Value {
    let s = &w.load_source;
    if !s.kind.polled() {
        return Value::Null;
    }
    json!({
        "polls": s.polls.load(Relaxed),
        "failures": s.failures.load(Relaxed),
        "timeouts": s.timeouts.load(Relaxed),
        "last_error": s.last_error.load_full().as_deref(),
    })
}

/// The whole `/workers` document.
pub fn workers_json(st: &AppState) -> Value {
    let ws = st.fleet.workers();
    json!({ "policy": st.cfg.policy.as_str(), "load_signal": st.cfg.load_signal.as_str(),
            "prefix_source": st.prefix.source.as_str(), "tokenizer": st.prefix.tokenizer.describe(),
            "models": fleet_models_json(st), "pd": pd_json(st, &ws),
            "workers": ws.iter().map(|w| worker_json(st, w)).collect::<Vec<_>>() })
}

/// `--pd`: each side's policy and worker count (null for a regular router).
fn pd_json(st: &AppState, ws: &[Arc<Worker>]) -> Value {
    let Some(pd) = &st.cfg.pd else {
        return Value::Null;
    };
    let count = |r: crate::pd::Role| ws.iter().filter(|w| w.pd.role() == r).count();
    json!({ "prefill_policy": pd.prefill_policy.as_str(), "decode_policy": pd.decode_policy.as_str(),
            "prefill_workers": count(crate::pd::Role::Prefill),
            "decode_workers": count(crate::pd::Role::Decode),
            "regular_workers": count(crate::pd::Role::Regular) })
}

/// Each model the fleet serves: its requests and its workers (by URL).
fn fleet_models_json(st: &AppState) -> Value {
    let roster = st.fleet.roster();
    let t = &roster.models;
    let of = |name: &str| -> Vec<&str> {
        let ws = t.workers_of(name);
        ws.iter()
            .map(|&i| roster.workers[i as usize].url.as_str())
            .collect()
    };
    t.models()
        .map(|(name, s)| {
            json!({ "model": &**name, "requests": s.requests.load(Relaxed),
            "workers": of(name) })
        })
        .collect()
}

pub async fn list_workers(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(workers_json(&st)).into_response()
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
    if given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
        Ok(())
    } else {
        Err(error_response(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token (Authorization: Bearer <--admin-token>)",
        ))
    }
}

/// Equality whose time does not depend on where the inputs differ: the token is a secret.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The `url` of a `POST /workers` body, checked.
#[allow(clippy::result_large_err)]
fn url_from_body(body: &[u8]) -> Result<String, Response> {
    let url = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("url").and_then(Value::as_str).map(str::to_string))
        .ok_or_else(|| {
            error_response(
                StatusCode::BAD_REQUEST,
                "body: expected {\"url\": \"http://HOST:PORT\"}",
            )
        })?;
    validate_url(&url).map_err(|e| error_response(StatusCode::BAD_REQUEST, &e))
}

pub async fn add_worker(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(r) = authorize(&st, &headers) {
        return r;
    }
    let url = match url_from_body(&body) {
        Ok(u) => u,
        Err(r) => return r,
    };
    // Bounded: attempts × `Budgets::discovery_timeout`, whatever the worker sends.
    let d = discover(&st.client, &url, &st.discovery_limits()).await;
    let w = st.fleet.add(&url, d);
    (StatusCode::CREATED, axum::Json(worker_json(&st, &w))).into_response()
}

pub async fn remove_worker(
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
    // Removing joins the worker's subscriber thread: not on the async executor.
    let removed = tokio::task::spawn_blocking(move || st2.fleet.remove(&url))
        .await
        .unwrap_or(false);
    if removed {
        StatusCode::NO_CONTENT.into_response()
    } else {
        error_response(StatusCode::NOT_FOUND, "no such worker")
    }
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
    }
}
