//! What a disaggregated engine does with a generation request once it is parsed: the plan
//! ([`plan`]: refuse it, serve it locally, prefill it for a transfer, or wait for its KV) and the
//! two waits ([`prefill`], [`decode`]), each ending in the engine's usual reply or in an error in
//! SGLang's shape ([`sglang_error`]): `/generate` `{"error": {"message"}}`, the OpenAI routes
//! their `ErrorResponse`; streamed, one error event of a 200 stream, then `data: [DONE]` (never a
//! cut stream).

use super::{Outcome, PdConfig, PdMode};
use crate::api::{GenRequest, Route};
use crate::model::{Disagg, Event};
use crate::rank::Command;
use crate::reply::{AbortGuard, Reply, json_response, stream_response};
use crate::state::AppState;
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// How a request is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// As a non-disaggregated engine serves it.
    Local,
    /// Served here without a transfer (fake bootstrap host on a prefill engine): one token.
    LocalOneToken,
    /// Prefill it, hold its KV for `room`'s decode side, answer one token once sent.
    Prefill { room: u64 },
    /// Wait for its KV from the prefill engine at `addr`, then decode it.
    Decode {
        addr: String,
        room: u64,
        dp_rank: i32,
    },
}

impl Plan {
    /// The part the scheduler model plays.
    pub(crate) fn disagg(&self) -> Disagg {
        match self {
            Plan::Local | Plan::LocalOneToken => Disagg::Local,
            Plan::Prefill { .. } => Disagg::Prefill,
            Plan::Decode { .. } => Disagg::Decode,
        }
    }
}

/// The plan for `req` on an engine in `mode`; a 400 for a disaggregated request without a room
/// (SGLang's message) or a decode request that does not say where its prefill engine is.
///
/// A decode request without `bootstrap_port` dials the engine's own `--disaggregation-bootstrap-port`
/// when it is not 0, as SGLang's scheduler fills it in.
pub(crate) fn plan(cfg: &PdConfig, req: &GenRequest, id: u64) -> Result<Plan, Box<Response>> {
    let (mode, b) = (cfg.mode, &req.bootstrap);
    if mode == PdMode::Null {
        return Ok(Plan::Local);
    }
    let refuse = |m: String| {
        Box::new(sglang_error(
            StatusCode::BAD_REQUEST,
            req.route,
            req.stream,
            &m,
        ))
    };
    let Some(room) = b.room else {
        let rid = b.rid.clone().unwrap_or_else(|| id.to_string());
        return Err(refuse(format!(
            "Invalid request: Disaggregated request received without bootstrap room id. \
             req.rid='{rid}'"
        )));
    };
    if b.is_fake() {
        return Ok(match mode {
            PdMode::Prefill => Plan::LocalOneToken,
            _ => Plan::Local,
        });
    }
    match mode {
        PdMode::Prefill => Ok(Plan::Prefill { room }),
        _ => {
            let port = b.port.or(Some(cfg.bootstrap_port).filter(|&p| p != 0));
            let (Some(host), Some(port)) = (b.host.as_deref(), port) else {
                return Err(refuse(
                    "bootstrap_host, bootstrap_port: a decode engine needs the host, and the port \
                     unless its --disaggregation-bootstrap-port names one (where the request's \
                     prefill engine serves its bootstrap)"
                        .into(),
                ));
            };
            let addr = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            Ok(Plan::Decode {
                addr,
                room,
                dp_rank: b.dp_rank.unwrap_or(-1),
            })
        }
    }
}

/// An error in SGLang's shape for `route` (see the module doc).
pub(crate) fn sglang_error(
    status: StatusCode,
    route: Route,
    stream: bool,
    message: &str,
) -> Response {
    let code = status.as_u16();
    let kind = if status.is_client_error() {
        "BadRequestError"
    } else {
        "InternalServerError"
    };
    let body = match route {
        Route::Generate => json!({ "error": { "message": message, "code": code } }),
        _ => {
            json!({ "object": "error", "message": message, "type": kind, "param": null, "code": code })
        }
    };
    if !stream {
        return (status, axum::Json(body)).into_response();
    }
    let event = match route {
        Route::Generate => body,
        _ => json!({ "error": body }),
    };
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from(format!("data: {event}\n\ndata: [DONE]\n\n")))
        .unwrap_or_else(|_| {
            (StatusCode::INTERNAL_SERVER_ERROR, "building the stream").into_response()
        })
}

/// Closes the room when the prefill handler ends, however it ends (the decode side hears
/// `failed` if the KV was not sent).
struct RoomGuard {
    st: Arc<AppState>,
    room: u64,
    id: u64,
}

impl Drop for RoomGuard {
    fn drop(&mut self) {
        let reason = "the prefill engine dropped the request before its KV was sent";
        self.st.pd.rooms.remove_request(self.room, self.id, reason);
    }
}

/// A prefill engine's request: wait for the prefill, the decode side's registration and the
/// transfer, then answer the one token; fail if the decode side never registers within the
/// timeout or its connection closes.
pub(crate) async fn prefill(
    st: Arc<AppState>,
    room: u64,
    reply: Reply,
    mut rx: UnboundedReceiver<Event>,
    mut guard: AbortGuard,
) -> Response {
    let (route, stream) = (reply.req.route, reply.req.stream);
    let fail = |m: &str| sglang_error(StatusCode::INTERNAL_SERVER_ERROR, route, stream, m);
    let pd = &st.pd;
    let mut failed =
        match pd
            .rooms
            .add_request(room, reply.id, guard.commands.clone(), reply.prompt_tokens)
        {
            Ok(rx) => rx,
            Err(m) => return sglang_error(StatusCode::BAD_REQUEST, route, stream, &m),
        };
    let _room = RoomGuard {
        st: st.clone(),
        room,
        id: reply.id,
    };
    let deadline = tokio::time::Instant::now() + pd.cfg.timeout;
    let (mut registered, mut settled) = (false, false);
    loop {
        tokio::select! {
            ev = rx.recv() => match ev {
                Some(Event::FirstToken { .. }) => pd.rooms.prefilled(room),
                Some(Event::Finished { completion_tokens, .. }) => {
                    guard.finished = true;
                    return one_token(&reply, completion_tokens);
                }
                Some(Event::Token { .. }) => {}
                None => return fail("the engine stopped before the request finished"),
            },
            why = &mut failed, if !settled => match why {
                Ok((_, reason)) => return fail(&format!(
                    "KV transfer failed for request rid={} bootstrap_room={room}: {reason}",
                    reply.id
                )),
                // The room closed because its KV was sent: the finish is on its way.
                Err(_) => settled = true,
            },
            _ = tokio::time::sleep_until(deadline), if !registered => {
                if pd.rooms.is_registered(room) {
                    registered = true;
                } else {
                    pd.count(Outcome::Timeout);
                    return fail(&format!(
                        "KV transfer timed out for request rid={} bootstrap_room={room}: no \
                         decode engine registered within {:?} (--disaggregation-timeout)",
                        reply.id, pd.cfg.timeout
                    ));
                }
            }
        }
    }
}

/// The prefill engine's answer: the one token it generated, JSON or SSE.
fn one_token(reply: &Reply, completion: u64) -> Response {
    if !reply.req.stream {
        return axum::Json(reply.final_json(completion)).into_response();
    }
    let body = format!(
        "{}data: [DONE]\n\n",
        reply.chunk(completion, completion, true)
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from(body))
        .unwrap_or_else(|_| {
            (StatusCode::INTERNAL_SERVER_ERROR, "building the stream").into_response()
        })
}

/// Stops waiting for a room whose decode handler went away.
struct ForgetGuard {
    st: Arc<AppState>,
    addr: String,
    room: u64,
}

impl Drop for ForgetGuard {
    fn drop(&mut self) {
        self.st.pd.client.forget(&self.addr, self.room);
    }
}

/// A decode engine's request: register its room with the prefill engine at `addr`, wait for
/// the KV (bounded by the timeout), then let the rank decode it and reply as usual.
pub(crate) async fn decode(
    st: Arc<AppState>,
    plan: (String, u64, i32),
    reply: Reply,
    rx: UnboundedReceiver<Event>,
    guard: AbortGuard,
) -> Response {
    let (addr, room, dp_rank) = plan;
    let (route, stream) = (reply.req.route, reply.req.stream);
    let pd = &st.pd;
    let started = Instant::now();
    let _forget = ForgetGuard {
        st: st.clone(),
        addr: addr.clone(),
        room,
    };
    let waited = tokio::time::timeout(pd.cfg.timeout, pd.client.await_kv(&addr, room, dp_rank));
    let message = match waited.await {
        Ok(Ok(_)) => {
            pd.count(Outcome::Transferred);
            let latency_s = started.elapsed().as_secs_f64() * pd.time_scale;
            let arrived = Command::KvArrived {
                id: reply.id,
                latency_s,
            };
            if guard.commands.send(arrived).is_err() {
                let m = "the engine is shutting down";
                return sglang_error(StatusCode::SERVICE_UNAVAILABLE, route, stream, m);
            }
            return if stream {
                stream_response(reply, rx, guard)
            } else {
                json_response(reply, rx, guard).await
            };
        }
        Ok(Err(reason)) => {
            pd.count(Outcome::Failed);
            format!(
                "Decode handshake failed for request rid={} bootstrap_room={room}: {reason}",
                reply.id
            )
        }
        Err(_) => {
            pd.count(Outcome::Timeout);
            format!(
                "KV transfer timed out for request rid={} bootstrap_room={room}: no KV from {addr} \
                 within {:?} (--disaggregation-timeout)",
                reply.id, pd.cfg.timeout
            )
        }
    };
    sglang_error(StatusCode::INTERNAL_SERVER_ERROR, route, stream, &message)
}
