//! One bounded `GET` to a worker, for every request the router makes on its own behalf
//! (discovery's `/server_info`, fan-outs such as `/v1/models`).
//!
//! Why its own module: a timeout around `client.request()` covers only the response headers, and
//! collecting the body afterwards has no bound at all, so a worker that sends headers and then
//! stalls (or dribbles, or streams gigabytes) holds the caller for ever and grows its memory. Here
//! one deadline covers connect, headers and body, and the body is read frame by frame against a
//! byte cap, refused as soon as it would pass it (a `Content-Length` above the cap is refused
//! before any body is read). The two refusals map onto [`Refusal`] reasons so callers count them.

use crate::budget::Refusal;
use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use std::time::Duration;

/// The router's pooled HTTP client to workers (proxying, discovery, fan-outs).
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Builds the pooled upstream client (TCP_NODELAY: no Nagle stall on small SSE events).
pub fn http_client() -> HttpClient {
    pooled_client(1024)
}

/// A client to workers keeping up to `idle_per_host` idle connections per worker (TCP_NODELAY,
/// 2 s connect timeout, idle connections closed after 90 s).
pub fn pooled_client(idle_per_host: usize) -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(Duration::from_secs(2)));
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(idle_per_host)
        .build(conn)
}

/// What a bounded fetch may take: total time and body bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchBudget {
    /// From the first connect attempt to the last body byte.
    pub timeout: Duration,
    /// Largest body accepted.
    pub max_body: usize,
}

/// Why a bounded fetch gave no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerFetchError {
    #[error("bad URL {url:?}: {why}")]
    BadUrl { url: String, why: String },
    #[error("{0}")]
    Transport(String),
    #[error("not complete within {} ms (connect, headers and body)", .0.as_millis())]
    TimedOut(Duration),
    #[error("body larger than the {limit}-byte budget")]
    TooLarge { limit: usize },
}

impl PeerFetchError {
    /// The refusal this failure counts as, if it is one (a peer beyond a budget).
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            PeerFetchError::TimedOut(_) => Some(Refusal::TimedOut),
            PeerFetchError::TooLarge { .. } => Some(Refusal::BodyTooLarge),
            _ => None,
        }
    }
}

/// A complete answer: its status and whole body.
#[derive(Debug, Clone)]
pub struct PeerAnswer {
    pub status: StatusCode,
    pub body: Bytes,
}

/// `GET {url}` within `budget`: the status and the whole body, whatever the status.
pub async fn bounded_get(
    client: &HttpClient,
    url: &str,
    budget: FetchBudget,
) -> Result<PeerAnswer, PeerFetchError> {
    let req = hyper::Request::get(url)
        .body(Full::default())
        .map_err(|e| PeerFetchError::BadUrl {
            url: url.to_string(),
            why: e.to_string(),
        })?;
    match tokio::time::timeout(budget.timeout, exchange(client, req, budget.max_body)).await {
        Ok(r) => r,
        Err(_) => Err(PeerFetchError::TimedOut(budget.timeout)),
    }
}

async fn exchange(
    client: &HttpClient,
    req: hyper::Request<Full<Bytes>>,
    max_body: usize,
) -> Result<PeerAnswer, PeerFetchError> {
    let resp = client
        .request(req)
        .await
        .map_err(|e| PeerFetchError::Transport(e.to_string()))?;
    let status = resp.status();
    let too_large = PeerFetchError::TooLarge { limit: max_body };
    let declared = resp
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return Err(too_large);
    }
    let mut body = resp.into_body();
    // Grows with what arrives, never past the cap: a declared length is not trusted for capacity.
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| PeerFetchError::Transport(format!("reading the body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max_body {
                return Err(too_large);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(PeerAnswer {
        status,
        body: Bytes::from(buf),
    })
}
