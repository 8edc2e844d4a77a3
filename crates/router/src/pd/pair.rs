//! One attempt of a PD request: the same body (with this attempt's room) sent to a prefill and a
//! decode engine at once, and what the client gets.
//!
//! * Both answers' headers are awaited together. A leg that cannot connect, times out or answers
//!   502/503/504 fails the attempt ([`PairEnd::Failed`]): nothing reached the client yet, so the
//!   caller retries with a new room, the failed worker excluded, and the other leg is dropped
//!   here — its connection closed — so no room is ever prefilled on two engines.
//! * A prefill 4xx is passed to the client; any other prefill error answer fails the request (it is
//!   passed through too: the client sees the engine's own error). A decode error answer is the
//!   client's at once, whatever the prefill leg is doing.
//! * A JSON answer waits for both: the decode engine's body is passed on only once the prefill's
//!   ended cleanly, else the client gets a 502 naming the prefill failure.
//! * A streamed (SSE) answer starts at once; the prefill leg is drained beside it
//!   ([`super::stream`]), and a prefill failure after that ends the client's stream with an error
//!   event and `data: [DONE]` — never a cut stream.
//!
//! The prefill in-flight guard lives until the prefill answer ends; the decode guard rides on the
//! client's body, as every proxied answer's does.

use super::metrics::Outcome;
use super::stream::{PdStream, PrefillEnd};
use crate::book::InflightGuard;
use crate::retry::retryable;
use crate::state::{AppState, error_response};
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::Response;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How one attempt ended.
pub enum PairEnd {
    /// The client's answer, and how the request ended.
    Answered(Response, Outcome),
    /// A retryable failure of the leg of `role` (before any byte reached the client).
    Failed(super::Role, String),
}

/// How long a decode engine's own server error waits for a pending prefill leg's verdict (a
/// refused connection is heard in microseconds; a live prefill engine is not waited for).
const PREFILL_VERDICT_WAIT: Duration = Duration::from_millis(500);

/// Bound on what of a prefill answer is kept to look for an error event: its answer is one token.
const PREFILL_SCAN_BYTES: usize = 64 << 10;

type Upstream = Result<Result<hyper::Response<Incoming>, String>, tokio::time::error::Elapsed>;

/// Runs one attempt: `prefill` and `decode` (each with its worker's guard) sent at once.
pub async fn run(
    st: &Arc<AppState>,
    (pg, prefill): (InflightGuard, hyper::Request<Full<Bytes>>),
    (dg, decode): (InflightGuard, hyper::Request<Full<Bytes>>),
    started: Instant,
) -> PairEnd {
    let timeout = Duration::from_millis(st.cfg.upstream_timeout_ms);
    let send = |req| {
        let f = st.client.request(req);
        tokio::time::timeout(timeout, async move { f.await.map_err(|e| e.to_string()) })
    };
    let (p, d) = (send(prefill), send(decode));
    tokio::pin!(p, d);
    let (mut p_resp, mut d_resp) = (None, None);
    let (pu, du) = (pg.worker().url.clone(), dg.worker().url.clone());
    while p_resp.is_none() || d_resp.is_none() {
        tokio::select! {
            r = &mut p, if p_resp.is_none() => match leg(r, &pu, st.cfg.upstream_timeout_ms) {
                Ok(resp) if resp.status().is_success() => p_resp = Some(resp),
                Ok(resp) if !retryable(resp.status()) => {
                    let outcome = match resp.status().is_client_error() {
                        true => Outcome::PrefillRefused,
                        false => Outcome::PrefillFailed,
                    };
                    st.metrics.count_status(resp.status().as_u16());
                    return PairEnd::Answered(prefill_answer(resp, pg), outcome);
                }
                Ok(resp) => return PairEnd::Failed(super::Role::Prefill, format!("prefill {pu} answered {}", resp.status())),
                Err(e) => return PairEnd::Failed(super::Role::Prefill, format!("prefill {e}")),
            },
            r = &mut d, if d_resp.is_none() => match leg(r, &du, st.cfg.upstream_timeout_ms) {
                Ok(resp) if resp.status().is_success() => {
                    st.metrics.observe_ttfb(started.elapsed());
                    d_resp = Some(resp);
                }
                // The decode engine refused or failed on its own: its answer is the client's at
                // once (its prefill leg, dropped here, would only wait for a decode side).
                Ok(resp) if !retryable(resp.status()) => {
                    // A decode engine that cannot reach its prefill engine's bootstrap server
                    // fails the request itself, often before the prefill leg's own refusal is
                    // heard: a pending prefill leg gets a short hearing, and its failure fails
                    // the attempt (retried on another prefill engine), not the request.
                    if resp.status().is_server_error() && p_resp.is_none() {
                        let heard = tokio::time::timeout(PREFILL_VERDICT_WAIT, &mut p).await;
                        if let Ok(r) = heard {
                            match leg(r, &pu, st.cfg.upstream_timeout_ms) {
                                Err(e) => return PairEnd::Failed(super::Role::Prefill, format!("prefill {e}")),
                                Ok(r) if retryable(r.status()) => return PairEnd::Failed(super::Role::Prefill, format!("prefill {pu} answered {}", r.status())),
                                Ok(_) => {}
                            }
                        }
                    }
                    st.metrics.count_status(resp.status().as_u16());
                    return PairEnd::Answered(crate::proxy::pass_through(resp, dg, None), Outcome::Decoded);
                }
                Ok(resp) => return PairEnd::Failed(super::Role::Decode, format!("decode {du} answered {}", resp.status())),
                Err(e) => return PairEnd::Failed(super::Role::Decode, format!("decode {e}")),
            },
        }
    }
    let (Some(p_resp), Some(d_resp)) = (p_resp, d_resp) else {
        return PairEnd::Failed(super::Role::Decode, "no answer".into()); // the loop ends with both
    };
    pg.worker().succeeded();
    dg.worker().succeeded();
    let sse = d_resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if sse {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let drain = tokio::spawn(async move {
            let end = drain_prefill(p_resp, pu).await;
            drop(pg); // the prefill guard ends with its answer
            let _ = tx.send(end);
        });
        st.metrics.count_status(d_resp.status().as_u16());
        let resp = crate::proxy::pass_through(d_resp, dg, None);
        return PairEnd::Answered(
            PdStream::wrap(resp, rx, drain.abort_handle(), st.clone()),
            Outcome::Decoded,
        );
    }
    let end = drain_prefill(p_resp, pu).await;
    drop(pg);
    if let PrefillEnd::Failed(why) = end {
        st.metrics.count_status(502);
        let msg = format!("the prefill leg failed: {why}");
        return PairEnd::Answered(
            error_response(StatusCode::BAD_GATEWAY, &msg),
            Outcome::PrefillFailed,
        );
    }
    st.metrics.count_status(d_resp.status().as_u16());
    PairEnd::Answered(
        crate::proxy::pass_through(d_resp, dg, None),
        Outcome::Decoded,
    )
}

/// One leg's headers, or why it failed (named by `url`).
fn leg(r: Upstream, url: &str, timeout_ms: u64) -> Result<hyper::Response<Incoming>, String> {
    match r {
        Ok(Ok(resp)) => Ok(resp),
        Ok(Err(e)) => Err(format!("{url}: {e}")),
        Err(_) => Err(format!("{url}: no response headers within {timeout_ms} ms")),
    }
}

/// The prefill engine's own error answer, for the client (status and body as it sent them).
fn prefill_answer(resp: hyper::Response<Incoming>, guard: InflightGuard) -> Response {
    crate::proxy::pass_through(resp, guard, None)
}

/// Reads a successful prefill answer to its end: clean, or failed (the body cut, or an error
/// event in a stream).
async fn drain_prefill(resp: hyper::Response<Incoming>, url: String) -> PrefillEnd {
    let mut body = resp.into_body();
    let mut scan = ErrorScan::default();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Some(d) = f.data_ref() {
                    scan.feed(d);
                }
            }
            Err(e) => return PrefillEnd::Failed(format!("{url}: its answer was cut: {e}")),
        }
    }
    match scan.found {
        true => PrefillEnd::Failed(format!("{url}: its stream carried an error event")),
        false => PrefillEnd::Clean,
    }
}

/// Looks for an SSE error event (`data: {"error"`) across frame boundaries, keeping a short tail.
#[derive(Default)]
struct ErrorScan {
    tail: Vec<u8>,
    seen: usize,
    found: bool,
}

const ERROR_EVENT: &[u8] = b"data: {\"error\"";

impl ErrorScan {
    fn feed(&mut self, data: &[u8]) {
        if self.found || self.seen > PREFILL_SCAN_BYTES {
            return;
        }
        self.seen += data.len();
        self.tail.extend_from_slice(data);
        self.found = self
            .tail
            .windows(ERROR_EVENT.len())
            .any(|w| w == ERROR_EVENT);
        let keep = ERROR_EVENT.len() - 1;
        if self.tail.len() > keep {
            self.tail.drain(..self.tail.len() - keep);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_events_are_found_across_frames() {
        let mut s = ErrorScan::default();
        s.feed(b"data: {\"text\":\"a\"}\n\ndata: {\"er");
        assert!(!s.found);
        s.feed(b"ror\":{\"message\":\"x\"}}\n\n");
        assert!(s.found);
        let mut s = ErrorScan::default();
        s.feed(b"data: {\"text\":\"error\"}\n\ndata: [DONE]\n\n");
        assert!(!s.found, "the word in a token is no error event");
    }
}
