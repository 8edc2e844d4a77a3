//! A request's model on the request path: resolved against the roster's model table, counted, and
//! refused in OpenAI's error shape when no candidate serves it (the `openai` client raises
//! `NotFoundError` on the 404, `BadRequestError` on the 400).

use super::{Asked, Resolved, Unresolved};
use crate::candidate::Roster;
use crate::state::AppState;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use loadlink_wire::kv_namespace::Namespace;
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;

/// The routes whose body names a model (or, for `/generate`, implies the default one); other
/// routes (`/get_server_info`, `/health_generate`, …) may go to any worker.
pub const MODEL_ROUTES: [&str; 7] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/generate",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/responses",
    "/v1/score",
];

/// The candidates' model for `asked` (a request to `path`), counted; or the 404/400 to answer
/// (a response, as every refusal on the request path is).
#[allow(clippy::result_large_err)]
pub fn resolve(
    st: &AppState,
    roster: &Roster,
    path: &str,
    asked: &Asked,
) -> Result<Resolved, Response> {
    resolve_counted(st, roster, path, asked, true)
}

/// [`resolve`], counting the request on its model only when `count` (a PD request resolves on
/// both sides and counts once).
#[allow(clippy::result_large_err)]
pub fn resolve_counted(
    st: &AppState,
    roster: &Roster,
    path: &str,
    asked: &Asked,
    count: bool,
) -> Result<Resolved, Response> {
    if !MODEL_ROUTES.contains(&path) {
        return Ok(Resolved {
            set: super::SetId::All,
            model: None,
            adapter: None,
        });
    }
    let default = st.cfg.default_model.as_deref();
    let table = &roster.models;
    match table.resolve(asked.model.as_deref(), asked.lora_path.as_deref(), default) {
        Ok(r) => {
            if let Some(s) = r
                .model
                .as_deref()
                .and_then(|m| table.stats(m))
                .filter(|_| count)
            {
                s.requests.fetch_add(1, Relaxed);
            }
            Ok(r)
        }
        Err(Unresolved::NotFound(name)) => {
            st.fleet.models.not_found.fetch_add(1, Relaxed);
            // The client's name is echoed, cut to a length a message can carry.
            let name: String = name.chars().take(200).collect();
            let served: Vec<&str> = table.models().map(|(n, _)| &**n).collect();
            let message = format!(
                "The model `{name}` does not exist: no worker of this router serves it (served: {}). GET /v1/models lists what is served.",
                served.join(", ")
            );
            Err(openai_error(
                StatusCode::NOT_FOUND,
                &message,
                "model_not_found",
            ))
        }
        Err(Unresolved::Ambiguous(name, bases)) => {
            st.fleet.models.no_default.fetch_add(1, Relaxed);
            let message = format!(
                "model: the adapter `{name}` is served under several models ({}); name it with its model, as `{}:{name}`",
                bases.join(", "),
                bases[0]
            );
            Err(openai_error(
                StatusCode::BAD_REQUEST,
                &message,
                "model_ambiguous",
            ))
        }
        Err(Unresolved::NoDefault(names)) => {
            st.fleet.models.no_default.fetch_add(1, Relaxed);
            let message = format!(
                "model: this router serves several models ({}); name one in the request's `model` field, or start the router with --default-model",
                names.join(", ")
            );
            Err(openai_error(
                StatusCode::BAD_REQUEST,
                &message,
                "model_required",
            ))
        }
    }
}

/// The request's cache namespace: its `extra_key`, `cache_salt` and adapter.
pub fn namespace(roster: &Roster, asked: &Asked, r: &Resolved) -> Namespace {
    Namespace {
        extra_key: asked.extra_key.clone(),
        cache_salt: asked.cache_salt.clone().filter(|s| !s.is_empty()),
        lora: r
            .adapter
            .as_deref()
            .map(|a| roster.models.lora(r.model.as_deref(), a)),
    }
}

/// OpenAI's error object: `{"error": {message, type, param, code}}`.
pub fn openai_error(status: StatusCode, message: &str, code: &str) -> Response {
    let body = json!({ "error": {
        "message": message,
        "type": "invalid_request_error",
        "param": "model",
        "code": code,
    }});
    (status, axum::Json(body)).into_response()
}
