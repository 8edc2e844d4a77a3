//! The client's side of a forwarded response: the upstream's status and content headers, and its
//! body streamed through a [`GuardedBody`], which holds the request's in-flight guard (and its
//! adapter ticket) until the body ends, the client goes, or the upstream fails mid-stream.

use crate::adapters::AdapterTicket;
use crate::book::InflightGuard;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};

/// A response body that holds the request's in-flight guard until it ends or is dropped.
///
/// If the upstream dies mid-stream (worker killed), an SSE response ends with a clean error event
/// and `data: [DONE]` instead of a cut connection, so clients can tell "failed" from "truncated".
pub struct GuardedBody {
    inner: hyper::body::Incoming,
    guard: Option<InflightGuard>,
    /// The request's adapter on this worker, released with the guard.
    ticket: Option<AdapterTicket>,
    sse: bool,
    finished: bool,
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match r {
            Poll::Ready(None) => {
                self.guard = None;
                self.ticket = None;
                self.finished = true;
            }
            Poll::Ready(Some(Err(e))) => {
                // Releasing the guard here (not at drop) keeps the in-flight count exact.
                if let Some(w) = self.guard.take().map(|g| g.worker().clone()) {
                    w.failures_total.fetch_add(1, Relaxed);
                }
                self.ticket = None;
                self.finished = true;
                if self.sse {
                    let msg = serde_json::json!({ "error": { "message": format!("the worker failed mid-stream: {e}"), "code": 502 } });
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(format!(
                        "data: {msg}\n\ndata: [DONE]\n\n"
                    ))))));
                }
                return Poll::Ready(Some(Err(e)));
            }
            Poll::Ready(Some(Ok(_))) => {
                if let Some(g) = &mut self.guard {
                    g.started();
                }
            }
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.finished || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The client's response: the upstream status and content headers, and its body streamed through
/// a [`GuardedBody`] that keeps `guard` until the body ends.
pub(crate) fn pass_through(
    resp: hyper::Response<hyper::body::Incoming>,
    guard: InflightGuard,
    ticket: Option<AdapterTicket>,
) -> Response {
    let (parts, incoming) = resp.into_parts();
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let worker_url = HeaderValue::from_str(&guard.worker().url).ok();
    let rank = guard.rank();
    let mut out = Response::new(Body::new(GuardedBody {
        inner: incoming,
        guard: Some(guard),
        ticket,
        sse,
        finished: false,
    }));
    *out.status_mut() = parts.status;
    for h in [header::CONTENT_TYPE, header::CACHE_CONTROL] {
        if let Some(v) = parts.headers.get(&h) {
            out.headers_mut().insert(h, v.clone());
        }
    }
    if let Some(v) = worker_url {
        out.headers_mut().insert("x-loadlink-worker", v);
    }
    if let Some(r) = rank {
        out.headers_mut()
            .insert("x-loadlink-dp-rank", HeaderValue::from(r));
    }
    out
}
