//! A PD request's client stream: the decode engine's SSE answer, passed through frame by frame,
//! watched by its prefill leg. The decode engine reports its own failures in-stream; but when the
//! prefill leg fails first (its engine killed mid-transfer, its answer cut or carrying an error
//! event), the client must not wait for the decode engine's timeout nor see a cut connection: the
//! stream ends at once, after the current event, with an error event and `data: [DONE]`.
//!
//! The prefill leg is drained by a task of its own (holding the prefill guard); a client that
//! leaves before the decode stream ended aborts it, closing the prefill connection too.

use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::response::Response;
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

/// How a prefill answer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefillEnd {
    Clean,
    /// Why it failed.
    Failed(String),
}

/// The client's body of a streamed PD answer (see the module docs).
pub struct PdStream {
    decode: Option<Body>,
    prefill: Option<oneshot::Receiver<PrefillEnd>>,
    drain: AbortHandle,
    st: Arc<AppState>,
    /// Whether the bytes passed so far end an SSE event (`\n\n`), so an added event stands alone.
    at_boundary: bool,
    finished: bool,
}

impl PdStream {
    /// `resp` (the decode engine's answer, already guarded) with its body watched by `prefill`.
    pub fn wrap(
        resp: Response,
        prefill: oneshot::Receiver<PrefillEnd>,
        drain: AbortHandle,
        st: Arc<AppState>,
    ) -> Response {
        let (parts, body) = resp.into_parts();
        let watched = PdStream {
            decode: Some(body),
            prefill: Some(prefill),
            drain,
            st,
            at_boundary: true,
            finished: false,
        };
        Response::from_parts(parts, Body::new(watched))
    }

    /// The frame that ends the client's stream after the prefill leg failed.
    fn failure(&mut self, why: &str) -> Frame<Bytes> {
        self.st.pd.prefill_failed_mid_stream.fetch_add(1, Relaxed);
        self.decode = None; // closes the decode leg and releases its guard now
        self.finished = true;
        let msg = serde_json::json!({ "error": {
            "message": format!("the prefill leg failed: {why}"),
            "code": 502,
        }});
        let sep = if self.at_boundary { "" } else { "\n\n" };
        Frame::data(Bytes::from(format!("{sep}data: {msg}\n\ndata: [DONE]\n\n")))
    }
}

impl HttpBody for PdStream {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        if let Some(rx) = self.prefill.as_mut() {
            match Pin::new(rx).poll(cx) {
                Poll::Ready(Ok(PrefillEnd::Clean)) => self.prefill = None,
                Poll::Ready(Ok(PrefillEnd::Failed(why))) => {
                    return Poll::Ready(Some(Ok(self.failure(&why))));
                }
                Poll::Ready(Err(_)) => {
                    return Poll::Ready(Some(Ok(self.failure("its drain stopped"))));
                }
                Poll::Pending => {}
            }
        }
        let Some(decode) = self.decode.as_mut() else {
            return Poll::Ready(None);
        };
        let r = Pin::new(decode).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref().filter(|d| !d.is_empty()) {
                    self.at_boundary = d.ends_with(b"\n\n");
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.finished = true,
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.finished
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for PdStream {
    fn drop(&mut self) {
        // A client gone before the decode stream ended: the prefill leg is of no use now.
        if !self.finished {
            self.drain.abort();
        }
    }
}
