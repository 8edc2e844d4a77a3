//! Responses to a generation request: the final JSON body or the SSE stream (OpenAI and SGLang
//! shapes, usage included when asked), the JSON error body, and the guard that aborts a request
//! whose client went away, so its KV is freed at once.

use crate::api::{GenRequest, Route};
use crate::model::Event;
use crate::rank::Command;
use crate::served::Refusal;
use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use tokio::sync::mpsc::UnboundedReceiver;

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "error": { "message": message, "type": "invalid_request_error", "code": status.as_u16() } }))).into_response()
}

/// An error SGLang reports inside a stream: status 200, one `error` event, then `[DONE]` (what
/// its `/generate` sends when a streamed request fails its checks).
pub(crate) fn stream_error(message: &str) -> Response {
    let event = json!({ "error": { "message": message, "type": "invalid_request_error", "code": 400, "retryable": false } });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from(format!("data: {event}\n\ndata: [DONE]\n\n")))
        .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "building the stream"))
}

/// The answer to a request for a model or adapter the engine does not serve, in the shape each
/// engine answers it: vLLM a 404 `NotFoundError` naming the `model` param; SGLang, for an adapter
/// it has not loaded, what its routes answer a `ValueError` with: `/generate` a 400
/// `{"error": {"message"}}` (streamed: one error event of a 200 stream), the OpenAI routes a 400
/// `ErrorResponse` (streamed: an error event in its `{"error": ...}` envelope).
pub(crate) fn refused(refusal: &Refusal, route: Route, stream: bool) -> Response {
    let message = match refusal {
        Refusal::UnknownModel(m) => {
            let body = json!({ "error": { "message": format!("The model `{m}` does not exist."),
                "type": "NotFoundError", "param": "model", "code": 404 } });
            return (StatusCode::NOT_FOUND, axum::Json(body)).into_response();
        }
        Refusal::UnknownAdapter(a) => {
            format!("lora_path: the LoRA adapter {a:?} is not loaded on this engine")
        }
        Refusal::LoraOff(a) => format!(
            "lora_path: the LoRA adapter {a:?} was asked for, but this engine serves no adapters \
             (start it with --lora-paths)"
        ),
    };
    match (route, stream) {
        (Route::Generate, false) => (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({ "error": { "message": message } })),
        )
            .into_response(),
        (Route::Generate, true) => stream_error(&message),
        (_, false) => (
            StatusCode::BAD_REQUEST,
            axum::Json(
                json!({ "object": "error", "message": message, "type": "BadRequest",
                "param": null, "code": 400 }),
            ),
        )
            .into_response(),
        (_, true) => {
            let event = json!({ "error": { "object": "error", "message": message,
                "type": "BadRequestError", "param": null, "code": 400 } });
            Response::builder()
                .header(header::CONTENT_TYPE, "text/event-stream")
                .header(header::CACHE_CONTROL, "no-cache")
                .body(Body::from(format!("data: {event}\n\ndata: [DONE]\n\n")))
                .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "building the stream"))
        }
    }
}

/// Aborts the request when the client goes away before it finished (body dropped).
pub(crate) struct AbortGuard {
    pub(crate) id: u64,
    pub(crate) commands: std::sync::mpsc::Sender<Command>,
    pub(crate) finished: bool,
    pub(crate) aborted_total: Arc<AtomicU64>,
    pub(crate) open: Arc<AtomicI64>,
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

/// What a response needs to know about its request.
pub(crate) struct Reply {
    pub(crate) id: u64,
    pub(crate) req: GenRequest,
    pub(crate) model: String,
    pub(crate) created: u64,
    pub(crate) prompt_tokens: u64,
}

const TOKEN_TEXT: &str = " tok";

impl Reply {
    fn usage(&self, completion: u64) -> Value {
        json!({ "prompt_tokens": self.prompt_tokens, "completion_tokens": completion, "total_tokens": self.prompt_tokens + completion })
    }

    pub(crate) fn final_json(&self, completion: u64) -> Value {
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
    pub(crate) fn chunk(&self, n: u64, total: u64, done: bool) -> String {
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

pub(crate) async fn json_response(
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

pub(crate) fn stream_response(
    reply: Reply,
    rx: UnboundedReceiver<Event>,
    guard: AbortGuard,
) -> Response {
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
