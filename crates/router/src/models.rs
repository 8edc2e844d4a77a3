//! `GET /v1/models` on a fleet: the union of what the workers serve.
//!
//! Forwarding to one worker would answer with that worker's models only, and a client choosing a
//! model by this list would miss the rest of the fleet. Every available worker is asked at once,
//! each answer bounded in time and size (`Budgets::fanout_timeout`, `fanout_body_bytes`, through
//! [`crate::peer_http`]; a worker beyond them is counted as a refusal and left out); models are
//! merged by `id`, first answer wins. When none answers, the router says so with a 502.
//!
//! The route is open and each call would cost every worker a request, so the merged answer is kept
//! for [`MODELS_CACHE_TTL`], and concurrent calls share one fan-out (the first caller fans out
//! while the others wait for its answer): a flood of calls costs the workers one fan-out per
//! interval. A worker added meanwhile shows up when the kept answer expires.

use crate::budget::Refusal;
use crate::peer_http::{FetchBudget, bounded_get};
use crate::state::{AppState, error_response};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a merged answer is served before the workers are asked again.
pub const MODELS_CACHE_TTL: Duration = Duration::from_secs(2);

/// The last merged answer (`None`: no worker answered) and when it was made; its lock is held by
/// the one caller fanning out, so concurrent callers wait for that answer instead of asking too.
#[derive(Debug, Default)]
pub struct ModelsCache {
    last: tokio::sync::Mutex<Option<(Instant, Option<Arc<Value>>)>>,
}

/// `GET /v1/models`.
pub async fn union(State(st): State<Arc<AppState>>) -> Response {
    match merged(&st).await {
        Some(list) => axum::Json(&*list).into_response(),
        None => error_response(StatusCode::BAD_GATEWAY, "no worker answered GET /v1/models"),
    }
}

/// The merged list: the kept one while fresh, else a new fan-out (one at a time).
async fn merged(st: &AppState) -> Option<Arc<Value>> {
    let mut last = st.models.last.lock().await;
    if let Some((at, list)) = &*last
        && at.elapsed() < MODELS_CACHE_TTL
    {
        return list.clone();
    }
    let list = fan_out(st).await;
    *last = Some((Instant::now(), list.clone()));
    list
}

/// Asks every available worker at once; the merged list, or `None` when none answered.
async fn fan_out(st: &AppState) -> Option<Arc<Value>> {
    let workers = st.fleet.workers();
    let asks = workers.iter().filter(|w| w.available()).map(|w| ask(st, w));
    let answers = futures_util::future::join_all(asks).await;
    if answers.iter().all(Option::is_none) {
        return None;
    }
    let data = merge(answers.into_iter().flatten());
    Some(Arc::new(json!({ "object": "list", "data": data })))
}

/// Models listed by the answers, merged by `id` in first-seen order.
fn merge(answers: impl Iterator<Item = Vec<Value>>) -> Vec<Value> {
    let mut seen = std::collections::HashSet::new();
    answers
        .flatten()
        .filter(|m| {
            m.get("id")
                .and_then(Value::as_str)
                .is_some_and(|id| seen.insert(id.to_string()))
        })
        .collect()
}

/// One worker's `data` list, or `None` when it does not answer well within the fan-out budget.
async fn ask(st: &AppState, w: &crate::book::Worker) -> Option<Vec<Value>> {
    let budget = FetchBudget {
        timeout: st.cfg.budgets.fanout_timeout,
        max_body: st.cfg.budgets.fanout_body_bytes,
    };
    let answer = match bounded_get(&st.client, &format!("{}/v1/models", w.url), budget).await {
        Ok(a) => a,
        Err(e) => {
            if let Some(r) = e.refusal() {
                refuse(w, r, &e);
            }
            return None;
        }
    };
    if !answer.status.is_success() {
        return None;
    }
    match serde_json::from_slice::<Value>(&answer.body)
        .ok()?
        .get_mut("data")?
        .take()
    {
        Value::Array(a) => Some(a),
        _ => None,
    }
}

fn refuse(w: &crate::book::Worker, r: Refusal, e: &crate::peer_http::PeerFetchError) {
    w.refusals.refuse(r, || format!("GET /v1/models: {e}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_merge_by_id_in_first_seen_order() {
        let a = vec![json!({"id": "m1", "owned_by": "a"}), json!({"id": "m2"})];
        let b = vec![
            json!({"id": "m2", "owned_by": "b"}),
            json!({"id": "m3"}),
            json!({"x": 1}),
        ];
        let ids: Vec<_> = merge([a, b].into_iter())
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ids, ["m1", "m2", "m3"]);
    }
}
