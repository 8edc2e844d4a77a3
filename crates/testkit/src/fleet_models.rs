//! The router's side of a fleet whose engines serve different models and adapters, for the
//! tests that prove a router routes by `model`. The engines' side (engines serving names and
//! adapters, their per-model request counters, a restart on the same port) is [`crate::served`];
//! the proof of routing is taken from those counters, not from the router's word.
//!
//! * [`body`] / [`ask`]: one request for a model on any generation route, JSON or streamed, read
//!   to its end (a cut stream fails the test).
//! * [`admin_add`] / [`admin_remove`]: the router's admin API, as an operator changes a fleet.
//! * [`listed_models`]: the router's `/v1/models`, as `id → worker URLs`, each id once.
//! * [`refused_with`]: the OpenAI error object a router answers, checked field by field.

use crate::http::get_json;
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The generation routes a request can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Completions,
    Chat,
    /// SGLang's `/generate`: no `model` field at all.
    Generate,
}

/// A prompt of several full pages (16-token pages), the same for every model: a router that let
/// its prefix index pick among all workers would find it cached on a worker of another model.
pub fn shared_prompt() -> String {
    "every model is asked the same long question here ".repeat(12)
}

/// The body of a short request on `route`, naming `model` when given.
pub fn body(route: Route, model: Option<&str>, stream: bool) -> Value {
    let mut b = match route {
        Route::Completions => json!({ "prompt": shared_prompt(), "max_tokens": 2 }),
        Route::Chat => json!({
            "messages": [{ "role": "user", "content": shared_prompt() }], "max_tokens": 2
        }),
        Route::Generate => {
            json!({ "text": shared_prompt(), "sampling_params": { "max_new_tokens": 2 } })
        }
    };
    if let Some(m) = model {
        b["model"] = json!(m);
    }
    if stream {
        b["stream"] = json!(true);
    }
    b
}

/// The path of `route`.
pub fn path(route: Route) -> &'static str {
    match route {
        Route::Completions => "/v1/completions",
        Route::Chat => "/v1/chat/completions",
        Route::Generate => "/generate",
    }
}

/// POSTs `body` on `route` of `base_url` and reads the answer to its end (a stream included):
/// the status and the whole body. A 200 stream must end with the `[DONE]` event (OpenAI routes)
/// or at least one `data:` event (`/generate`), or this panics naming the request.
pub async fn ask(c: &Client, base_url: &str, route: Route, body: &Value) -> (StatusCode, String) {
    let url = format!("{base_url}{}", path(route));
    let resp = c
        .post(&url)
        .json(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = resp.status();
    let text = resp
        .text()
        .await
        .unwrap_or_else(|e| panic!("POST {url} {body}: reading the body: {e}"));
    let streamed = body["stream"] == json!(true);
    if status == StatusCode::OK && streamed {
        let done = match route {
            Route::Generate => text.contains("data: "),
            _ => text.trim_end().ends_with("data: [DONE]"),
        };
        assert!(done, "POST {url} {body}: a cut stream: {text}");
    }
    (status, text)
}

/// `POST /workers {"url": worker_url}` with the bearer `token`; the status.
pub async fn admin_add(c: &Client, router_url: &str, token: &str, worker_url: &str) -> StatusCode {
    c.post(format!("{router_url}/workers"))
        .bearer_auth(token)
        .json(&json!({ "url": worker_url }))
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {router_url}/workers: {e}"))
        .status()
}

/// `DELETE /workers?url=worker_url` with the bearer `token`; the status.
pub async fn admin_remove(
    c: &Client,
    router_url: &str,
    token: &str,
    worker_url: &str,
) -> StatusCode {
    c.delete(format!("{router_url}/workers"))
        .bearer_auth(token)
        .query(&[("url", worker_url)])
        .send()
        .await
        .unwrap_or_else(|e| panic!("DELETE {router_url}/workers: {e}"))
        .status()
}

/// The router's `/v1/models`: each listed id → its `workers` (sorted URLs), and the whole page. An
/// adapter whose name another model's adapter has too is keyed `parent:id` after the first.
/// Panics when an id is listed twice under one parent: the router lists each model once, whoever
/// serves it.
pub async fn listed_models(c: &Client, router_url: &str) -> (BTreeMap<String, Vec<String>>, Value) {
    let page = get_json(c, &format!("{router_url}/v1/models")).await;
    let mut listed = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    for m in page["data"].as_array().into_iter().flatten() {
        let mut id = m["id"].as_str().unwrap_or_default().to_string();
        let parent = m["parent"].as_str().unwrap_or_default().to_string();
        if !seen.insert((id.clone(), parent.clone())) {
            panic!("{id} listed twice under {parent:?} in {router_url}/v1/models: {page}");
        }
        if listed.contains_key(&id) && !parent.is_empty() {
            id = format!("{parent}:{id}");
        }
        let mut workers: Vec<String> = m["workers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| w.as_str().map(str::to_string))
            .collect();
        workers.sort();
        if listed.insert(id.clone(), workers).is_some() {
            panic!("{id} listed twice in {router_url}/v1/models: {page}");
        }
    }
    (listed, page)
}

/// Asserts `text` is OpenAI's error object with `code` (`model_not_found`, `model_required`, …),
/// naming `what` in its message, with `param: "model"`; returns the object.
pub fn refused_with(text: &str, code: &str, what: &str) -> Value {
    let v: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not a JSON error ({e}): {text}"));
    let err = &v["error"];
    let message = err["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error.message: {v}"));
    assert!(message.contains(what), "the message names {what:?}: {v}");
    assert_eq!(err["type"], "invalid_request_error", "{v}");
    assert_eq!(err["param"], "model", "{v}");
    assert_eq!(err["code"], code, "{v}");
    v
}
