//! Load polling, for workers that publish no load socket: at discovery, [`probe`] finds whether a
//! worker serves `GET /v1/loads` (SGLang) or scheduler gauges on `GET /metrics` (vLLM, SGLang) and
//! how many ranks it has; then one tokio task per worker ([`spawn`]), owned by the fleet, fetches
//! that source every `--load-poll-interval-ms` and stores each rank's snapshot in the book through
//! [`Worker::apply_at`], exactly where a pushed snapshot goes. So polled load obeys the same
//! freshness bound, gets the same dispatched-since-snapshot correction (it matters more here: a
//! polled snapshot is older), and reports its age the same way.
//!
//! Each worker's polls use one HTTP connection (a dedicated client keeping one idle connection
//! per host) and each is bounded by `--load-poll-timeout-ms`; a failed poll is counted and kept
//! as the worker's last error, shown in `/workers` once the worker has fallen back to in-flight.
//! The request path is untouched: it reads the book's atomics as before.

pub mod metrics;

use crate::book::{LoadSourceKind, Worker};
use crate::fleet::HttpClient;
use axum::body::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use loadlink_wire::LoadSnapshot;
use loadlink_wire::polled::{loads_from_json, loads_from_metrics};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::AbortHandle;

/// How often and how long to poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollConfig {
    /// `--load-poll-interval-ms`; zero: polling is off (such workers are priced on in-flight).
    pub interval: Duration,
    /// `--load-poll-timeout-ms`: a poll (connect, headers, body) not done by then fails.
    pub timeout: Duration,
}

pub const DEFAULT_POLL_INTERVAL_MS: u64 = 100;
pub const DEFAULT_POLL_TIMEOUT_MS: u64 = 500;

impl Default for PollConfig {
    fn default() -> Self {
        PollConfig {
            interval: Duration::from_millis(DEFAULT_POLL_INTERVAL_MS),
            timeout: Duration::from_millis(DEFAULT_POLL_TIMEOUT_MS),
        }
    }
}

/// Largest body a poll reads (a real vLLM `/metrics` page is some hundred kB).
const MAX_POLL_BODY: usize = 8 << 20;

/// The pollers' client: one kept-alive connection per worker.
pub fn poll_client() -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(Duration::from_secs(2)));
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1)
        .build(conn)
}

/// A polled source found at discovery: what to fetch and how many ranks it reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Polled {
    pub kind: LoadSourceKind,
    pub ranks: usize,
}

/// Why a fetch gave no body.
struct FetchFailure {
    why: String,
    timed_out: bool,
}

/// `GET url+path` within `timeout`: the body of a 2xx answer.
async fn fetch(
    client: &HttpClient,
    url: &str,
    path: &str,
    timeout: Duration,
) -> Result<Bytes, FetchFailure> {
    let fail = |why: String| FetchFailure {
        why: format!("GET {path}: {why}"),
        timed_out: false,
    };
    let req = hyper::Request::get(format!("{url}{path}"))
        .body(Full::default())
        .map_err(|e| fail(format!("bad URL: {e}")))?;
    let exchange = async {
        let resp = client.request(req).await.map_err(|e| fail(e.to_string()))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(fail(format!("answered {status}")));
        }
        Limited::new(resp.into_body(), MAX_POLL_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| fail(format!("reading the body: {e}")))
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(FetchFailure {
            why: format!("GET {path}: timed out after {} ms", timeout.as_millis()),
            timed_out: true,
        }),
    }
}

/// The path a polled source fetches.
fn path(kind: LoadSourceKind) -> &'static str {
    match kind {
        LoadSourceKind::ScrapeMetrics => "/metrics",
        _ => "/v1/loads?include=core",
    }
}

/// A fetched body read as per-rank snapshots.
fn read(kind: LoadSourceKind, body: &[u8]) -> Result<Vec<LoadSnapshot>, String> {
    match kind {
        LoadSourceKind::ScrapeMetrics => loads_from_metrics(&String::from_utf8_lossy(body))
            .map(|(_, snaps)| snaps)
            .map_err(|e| e.to_string()),
        _ => loads_from_json(body).map_err(|e| e.to_string()),
    }
}

/// Ranks a page reports: one past the highest `dp_rank`.
fn rank_count(snaps: &[LoadSnapshot]) -> usize {
    snaps
        .iter()
        .map(|s| s.dp_rank as usize + 1)
        .max()
        .unwrap_or(0)
}

/// Finds a worker's polled source: `/v1/loads` first, then `/metrics`; or why neither works.
pub async fn probe(client: &HttpClient, url: &str, timeout: Duration) -> Result<Polled, String> {
    let mut why = Vec::new();
    for kind in [LoadSourceKind::PollLoads, LoadSourceKind::ScrapeMetrics] {
        let got = fetch(client, url, path(kind), timeout)
            .await
            .map_err(|f| f.why)
            .and_then(|body| read(kind, &body));
        match got {
            Ok(snaps) => {
                return Ok(Polled {
                    kind,
                    ranks: rank_count(&snaps),
                });
            }
            Err(e) => why.push(e),
        }
    }
    Err(why.join("; "))
}

/// Starts polling `worker` (whose source is polled) on the current tokio runtime; `None` outside
/// one. The task runs until aborted by the fleet.
pub fn spawn(worker: Arc<Worker>, client: HttpClient, cfg: PollConfig) -> Option<AbortHandle> {
    let rt = tokio::runtime::Handle::try_current().ok()?;
    Some(rt.spawn(run(worker, client, cfg)).abort_handle())
}

async fn run(worker: Arc<Worker>, client: HttpClient, cfg: PollConfig) {
    // A per-worker phase, so a fleet's polls do not all leave at once.
    let phase = worker
        .url
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(0x100_0000_01B3) ^ u64::from(b))
        % (cfg.interval.as_micros() as u64).max(1);
    tokio::time::sleep(Duration::from_micros(phase)).await;
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0i64;
    loop {
        tick.tick().await;
        poll_once(&worker, &client, cfg.timeout, seq).await;
        seq += 1;
    }
}

/// One poll: fetch, read, store every known rank at the time the answer arrived.
async fn poll_once(worker: &Worker, client: &HttpClient, timeout: Duration, seq: i64) {
    let source = &worker.load_source;
    let started = Instant::now();
    let body = match fetch(client, &worker.url, path(source.kind), timeout).await {
        Ok(b) => b,
        Err(f) => return source.failed(f.why, f.timed_out),
    };
    let snaps = match read(source.kind, &body) {
        Ok(s) => s,
        Err(e) => return source.failed(e, false),
    };
    let now = worker.now_ms();
    for s in &snaps {
        let rank = s.dp_rank as usize;
        if worker.apply_at(rank, s, now) {
            worker.account_seq(rank, seq);
        }
    }
    source.succeeded(started.elapsed());
}
