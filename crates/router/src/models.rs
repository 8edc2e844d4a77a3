//! `GET /v1/models` on a fleet: the union of what the workers serve.
//!
//! Forwarding to one worker would answer with that worker's models only, and a client choosing a
//! model by this list would miss the rest of the fleet. Every available worker is asked at once
//! (each within [`MODELS_TIMEOUT`]); models are merged by `id`, first answer wins. Workers that
//! fail or time out are left out; when none answers, the router says so with a 502.

use crate::state::{AppState, error_response};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// How long one worker may take to list its models.
pub const MODELS_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /v1/models`.
pub async fn union(State(st): State<Arc<AppState>>) -> Response {
    let workers = st.fleet.workers();
    let asks = workers
        .iter()
        .filter(|w| w.available())
        .map(|w| ask(&st, &w.url));
    let answers = futures_util::future::join_all(asks).await;
    if answers.iter().all(Option::is_none) {
        return error_response(StatusCode::BAD_GATEWAY, "no worker answered GET /v1/models");
    }
    axum::Json(json!({ "object": "list", "data": merge(answers.into_iter().flatten()) }))
        .into_response()
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

/// One worker's `data` list, or `None` when it does not answer well in time.
async fn ask(st: &AppState, url: &str) -> Option<Vec<Value>> {
    let req = hyper::Request::get(format!("{url}/v1/models"))
        .body(http_body_util::Full::default())
        .ok()?;
    let resp = tokio::time::timeout(MODELS_TIMEOUT, st.client.request(req))
        .await
        .ok()?
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let body = tokio::time::timeout(
        MODELS_TIMEOUT,
        http_body_util::BodyExt::collect(resp.into_body()),
    )
    .await
    .ok()?
    .ok()?
    .to_bytes();
    match serde_json::from_slice::<Value>(&body).ok()?.get("data")? {
        Value::Array(a) => Some(a.clone()),
        _ => None,
    }
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
