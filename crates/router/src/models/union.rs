//! `GET /v1/models` on a fleet: every model and adapter the available workers serve, each listed
//! once with the workers that serve it.
//!
//! It is read from the model registry (what discovery and the refresh read from each worker), not
//! from a fan-out per call: the list is exactly what the router routes by, the route costs the
//! workers nothing however often it is called, and a hostile worker's answer was already bounded
//! when it was read. A model keeps the entry its first worker published (`created`, `owned_by`,
//! `max_model_len`, …) and gains `workers`; an adapter is listed with its base model as `parent`,
//! as vLLM lists adapters. A worker that is down (health check, open breaker) is left out, and a
//! model none of whose workers is up is not listed.

use crate::state::{AppState, error_response};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use std::sync::Arc;

/// `GET /v1/models`.
pub async fn union(State(st): State<Arc<AppState>>) -> Response {
    let data = listed(&st);
    if data.is_empty() && !st.fleet.workers().is_empty() {
        return error_response(
            StatusCode::BAD_GATEWAY,
            "no available worker names a model (/workers shows each worker's models and why)",
        );
    }
    axum::Json(json!({ "object": "list", "data": data })).into_response()
}

/// Every model and adapter of the available workers, in first-seen order.
fn listed(st: &AppState) -> Vec<Value> {
    let workers = st.fleet.workers();
    let mut out: Vec<Value> = Vec::new();
    let mut at: std::collections::HashMap<String, usize> = Default::default();
    for w in workers.iter().filter(|w| w.available()) {
        let (Some(s), _) = st.fleet.models.of(&w.url) else {
            continue;
        };
        let Some(primary) = s.primary() else { continue };
        let entry_of = |id: &str| s.entries.iter().find(|e| e["id"] == id).cloned();
        // Adapters are keyed by their base too: two models' adapters of one name are two entries.
        let mut add = |id: &str, key: String, fallback: Value| {
            let i = *at.entry(key).or_insert_with(|| {
                let mut e = entry_of(id).unwrap_or(fallback);
                if let Some(m) = e.as_object_mut() {
                    m.insert("workers".into(), json!([]));
                }
                out.push(e);
                out.len() - 1
            });
            if let Some(ws) = out[i].get_mut("workers").and_then(Value::as_array_mut) {
                ws.push(json!(w.url));
            }
        };
        add(primary, primary.to_string(), model(primary, None, None));
        for a in &s.adapters {
            let key = format!("{primary}\0{}", a.name);
            add(
                &a.name,
                key,
                model(&a.name, Some(primary), a.path.as_deref()),
            );
        }
    }
    out
}

/// A model entry in OpenAI's shape (with vLLM's `root` and `parent` for an adapter).
fn model(id: &str, parent: Option<&str>, root: Option<&str>) -> Value {
    let mut m = Map::new();
    m.insert("id".into(), json!(id));
    m.insert("object".into(), json!("model"));
    m.insert("owned_by".into(), json!("loadlink"));
    if let Some(p) = parent {
        m.insert("parent".into(), json!(p));
        m.insert("root".into(), json!(root.unwrap_or(id)));
    }
    Value::Object(m)
}
