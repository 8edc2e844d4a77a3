//! Load polling, for workers that publish no load socket: at discovery, [`probe`] finds whether a
//! worker serves `GET /v1/loads` (SGLang) or scheduler gauges on `GET /metrics` (vLLM, SGLang) and
//! how many ranks it has; then one tokio task per worker ([`spawn`]), owned by the fleet, fetches
//! that source every `--load-poll-interval-ms` and stores each rank's snapshot in the book through
//! [`Worker::apply_at`], exactly where a pushed snapshot goes. So polled load obeys the same
//! freshness bound, gets the same dispatched-since-snapshot correction (it matters more here: a
//! polled snapshot is older), and reports its age the same way.
//!
//! Each worker's polls use one HTTP connection (a dedicated client keeping one idle connection
//! per host) and each is bounded by `--load-poll-timeout-ms` and `--load-poll-max-body-bytes`; a
//! failed poll is counted and kept as the worker's last error, shown in `/workers` once the worker
//! has fallen back to in-flight, and one cut by a budget is also counted as a refusal
//! ([`Refusal::TimedOut`], [`Refusal::BodyTooLarge`]).
//!
//! A page is the peer's: it names its ranks (a slot each, up to the worker's rank bound; see
//! [`crate::book::ranks`]) and may be large, so a body above [`PARSE_INLINE_BYTES`] is parsed on
//! the blocking pool, never on the executor. The request path is untouched: it reads the book's
//! atomics as before.

pub mod metrics;

use crate::book::{LoadSourceKind, Worker};
use crate::budget::{Budgets, Refusal};
use crate::peer_http::HttpClient;
use axum::body::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use loadlink_wire::LoadSnapshot;
use loadlink_wire::polled::{PolledError, loads_from_json, loads_from_metrics_within};
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
    /// `--load-poll-max-body-bytes` ([`Budgets::poll_body_bytes`]): a longer body fails the poll.
    pub max_body_bytes: usize,
    /// `--max-ranks` ([`Budgets::max_ranks`]): the rank bound of a worker that advertises no
    /// `dp_size`.
    pub max_ranks: usize,
}

pub const DEFAULT_POLL_INTERVAL_MS: u64 = 100;
pub const DEFAULT_POLL_TIMEOUT_MS: u64 = 500;

impl Default for PollConfig {
    fn default() -> Self {
        let budgets = Budgets::default();
        PollConfig {
            interval: Duration::from_millis(DEFAULT_POLL_INTERVAL_MS),
            timeout: Duration::from_millis(DEFAULT_POLL_TIMEOUT_MS),
            max_body_bytes: budgets.poll_body_bytes,
            max_ranks: budgets.max_ranks,
        }
    }
}

impl PollConfig {
    /// The rank bound of a polled worker: its advertised `dp_size` when it has one (never above
    /// the rank budget), else the rank budget.
    pub fn rank_bound(&self, advertised_dp_size: Option<usize>) -> usize {
        advertised_dp_size
            .filter(|n| *n > 0)
            .map_or(self.max_ranks, |n| n.min(self.max_ranks))
    }
}

/// Bodies up to this size are parsed on the poller's task; larger ones on the blocking pool (a
/// real vLLM `/metrics` page is some hundred kB; a `/v1/loads` body well under this).
pub const PARSE_INLINE_BYTES: usize = 64 << 10;

/// The pollers' client: one kept-alive connection per worker.
pub fn poll_client() -> HttpClient {
    crate::peer_http::pooled_client(1)
}

/// A polled source found at discovery: what to fetch, and how many ranks its page reported then
/// (the worker's ranks get slots as they report, [`crate::book::ranks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Polled {
    pub kind: LoadSourceKind,
    pub ranks: usize,
}

/// Why a fetch gave no body, and the budget it broke, if any.
struct FetchFailure {
    why: String,
    refusal: Option<Refusal>,
}

/// `GET url+path` within `timeout`: the body of a 2xx answer, at most `max_body` bytes.
async fn fetch(
    client: &HttpClient,
    url: &str,
    path: &str,
    timeout: Duration,
    max_body: usize,
) -> Result<Bytes, FetchFailure> {
    let fail = |why: String| FetchFailure {
        why: format!("GET {path}: {why}"),
        refusal: None,
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
        match Limited::new(resp.into_body(), max_body).collect().await {
            Ok(b) => Ok(b.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(FetchFailure {
                why: format!(
                    "GET {path}: body larger than {max_body} bytes (--load-poll-max-body-bytes)"
                ),
                refusal: Some(Refusal::BodyTooLarge),
            }),
            Err(e) => Err(fail(format!("reading the body: {e}"))),
        }
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(FetchFailure {
            why: format!(
                "GET {path}: not complete within {} ms (--load-poll-timeout-ms)",
                timeout.as_millis()
            ),
            refusal: Some(Refusal::TimedOut),
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

/// Scheduler-gauge samples a scraped page may hold per rank of its bound: each rank has up to
/// six gauges, with room for a second label set (a model name) on each.
const SAMPLES_PER_RANK: usize = 12;

/// Bytes a `/v1/loads?include=core` page may take per rank of its bound (a rank's core entry is
/// a few hundred bytes of JSON), at least [`PARSE_INLINE_BYTES`]: parsing JSON costs several
/// times its size in memory, so the page's budget follows the ranks it may carry, not only
/// `--load-poll-max-body-bytes`.
const LOADS_BYTES_PER_RANK: usize = 2 << 10;

/// The body budget of a poll of `kind` for a worker whose ranks are bounded by `bound`.
fn body_budget(kind: LoadSourceKind, max_body: usize, bound: usize) -> usize {
    match kind {
        LoadSourceKind::ScrapeMetrics => max_body,
        _ => max_body.min(
            bound
                .saturating_mul(LOADS_BYTES_PER_RANK)
                .max(PARSE_INLINE_BYTES),
        ),
    }
}

/// Entries a `/v1/loads` page lists, counted without parsing it (its `"dp_rank"` keys).
fn listed_ranks(body: &[u8]) -> usize {
    const KEY: &[u8] = b"\"dp_rank\"";
    body.windows(KEY.len()).filter(|w| *w == KEY).count()
}

/// Why a body gave no snapshots, and the refusal it counts as (when it broke a budget).
type ReadError = (String, Option<Refusal>);

/// A fetched body read as per-rank snapshots; a page with more gauge samples than
/// [`SAMPLES_PER_RANK`] × `max_ranks` is refused unread.
fn read(
    kind: LoadSourceKind,
    body: &[u8],
    max_ranks: usize,
) -> Result<Vec<LoadSnapshot>, ReadError> {
    match kind {
        LoadSourceKind::ScrapeMetrics => loads_from_metrics_within(
            &String::from_utf8_lossy(body),
            max_ranks.saturating_mul(SAMPLES_PER_RANK),
        )
        .map(|(_, snaps)| snaps)
        .map_err(|e| {
            let refusal =
                matches!(e, PolledError::OverBudget { .. }).then_some(Refusal::RankOutOfRange);
            (e.to_string(), refusal)
        }),
        _ => match listed_ranks(body) {
            // Twice the bound leaves room for a rank listed twice; more is refused unparsed.
            n if n > max_ranks.saturating_mul(2) => Err((
                format!("/v1/loads: {n} ranks listed, more than twice the bound of {max_ranks}"),
                Some(Refusal::RankOutOfRange),
            )),
            _ => loads_from_json(body).map_err(|e| (e.to_string(), None)),
        },
    }
}

/// [`read`], on the blocking pool when the body is larger than [`PARSE_INLINE_BYTES`].
async fn read_off_executor(
    kind: LoadSourceKind,
    body: Bytes,
    max_ranks: usize,
) -> Result<Vec<LoadSnapshot>, ReadError> {
    if body.len() <= PARSE_INLINE_BYTES {
        return read(kind, &body, max_ranks);
    }
    tokio::task::spawn_blocking(move || read(kind, &body, max_ranks))
        .await
        .unwrap_or_else(|e| Err((format!("parsing the body failed: {e}"), None)))
}

/// Distinct ranks a page reports (it comes sorted by rank).
fn rank_count(snaps: &[LoadSnapshot]) -> usize {
    let mut ranks: Vec<i64> = snaps.iter().map(|s| s.dp_rank).collect();
    ranks.dedup();
    ranks.len()
}

/// Finds a worker's polled source: `/v1/loads` first, then `/metrics`; or why neither works.
/// Bodies are bounded by the default [`Budgets::poll_body_bytes`]; see [`probe_with`].
pub async fn probe(client: &HttpClient, url: &str, timeout: Duration) -> Result<Polled, String> {
    let cfg = PollConfig {
        timeout,
        ..PollConfig::default()
    };
    probe_with(client, url, &cfg).await.map_err(|(why, _)| why)
}

/// [`probe`] within `cfg`'s timeout and body budget; a failure says why and which budgets the
/// worker's answers broke (for the caller to count: there is no `Worker` yet).
pub async fn probe_with(
    client: &HttpClient,
    url: &str,
    cfg: &PollConfig,
) -> Result<Polled, (String, Vec<Refusal>)> {
    let mut why = Vec::new();
    let mut refused = Vec::new();
    for kind in [LoadSourceKind::PollLoads, LoadSourceKind::ScrapeMetrics] {
        let budget = body_budget(kind, cfg.max_body_bytes, cfg.max_ranks);
        let got = match fetch(client, url, path(kind), cfg.timeout, budget).await {
            Ok(body) => read_off_executor(kind, body, cfg.max_ranks).await,
            Err(f) => Err((f.why, f.refusal)),
        };
        let got = got.map_err(|(e, refusal)| {
            refused.extend(refusal);
            e
        });
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
    Err((why.join("; "), refused))
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
        poll_once(&worker, &client, &cfg, seq).await;
        seq = seq.wrapping_add(1) & i64::MAX;
    }
}

/// One poll: fetch, read, store every rank the worker may have at the time the answer arrived.
async fn poll_once(worker: &Worker, client: &HttpClient, cfg: &PollConfig, seq: i64) {
    let source = &worker.load_source;
    let started = Instant::now();
    let budget = body_budget(source.kind, cfg.max_body_bytes, worker.ranks.bound());
    let fetched = fetch(client, &worker.url, path(source.kind), cfg.timeout, budget).await;
    let body = match fetched {
        Ok(b) => b,
        Err(f) => {
            if let Some(r) = f.refusal {
                worker.refusals.refuse(r, || f.why.clone());
            }
            return source.failed(f.why, f.refusal == Some(Refusal::TimedOut));
        }
    };
    let snaps = match read_off_executor(source.kind, body, worker.ranks.bound()).await {
        Ok(s) => s,
        Err((why, refusal)) => {
            if let Some(r) = refusal {
                worker.refusals.refuse(r, || why.clone());
            }
            return source.failed(why, false);
        }
    };
    let now = worker.now_ms();
    let bound = worker.ranks.bound();
    // The page is sorted by rank: the ranks past the bound are a tail, refused in one go (a page
    // of a million ranks costs one refusal, not a million), and a rank listed twice is applied
    // once (its last entry).
    let within = snaps.partition_point(|s| usize::try_from(s.dp_rank).is_ok_and(|r| r < bound));
    if let Some(first) = snaps.get(within) {
        let beyond = snaps.len() - within;
        worker.refusals.refuse(Refusal::RankOutOfRange, || {
            format!(
                "rank {} and {} more entries of the page are not below the bound {bound} (the \
                 advertised dp_size, else --max-ranks)",
                first.dp_rank,
                beyond - 1
            )
        });
    }
    let page = &snaps[..within];
    for (i, s) in page.iter().enumerate() {
        if page
            .get(i + 1)
            .is_some_and(|next| next.dp_rank == s.dp_rank)
        {
            continue;
        }
        let rank = s.dp_rank as usize; // below the bound, checked above
        if worker.apply_at(rank, s, now) {
            worker.account_seq(rank, seq);
        }
    }
    source.succeeded(started.elapsed());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(ranks: usize) -> String {
        let rows: Vec<String> = (0..ranks)
            .map(|r| format!(r#"{{"dp_rank":{r},"num_running_reqs":1,"num_waiting_reqs":0}}"#))
            .collect();
        format!(r#"{{"loads":[{}]}}"#, rows.join(","))
    }

    #[test]
    fn a_loads_page_listing_more_than_twice_its_bound_is_refused_unparsed() {
        let ok = read(LoadSourceKind::PollLoads, page(8).as_bytes(), 4).unwrap();
        assert_eq!(
            ok.len(),
            8,
            "twice the bound is still read (ranks past it are the book's)"
        );
        let (why, refusal) = read(LoadSourceKind::PollLoads, page(9).as_bytes(), 4).unwrap_err();
        assert_eq!(refusal, Some(Refusal::RankOutOfRange));
        assert!(why.contains("9 ranks listed"), "{why}");
    }

    #[test]
    fn a_loads_page_is_budgeted_by_its_ranks_and_metrics_by_the_flag() {
        let max = 8 << 20;
        assert_eq!(body_budget(LoadSourceKind::PollLoads, max, 1024), 2 << 20);
        assert_eq!(
            body_budget(LoadSourceKind::PollLoads, max, 1),
            PARSE_INLINE_BYTES
        );
        assert_eq!(body_budget(LoadSourceKind::PollLoads, 1000, 1024), 1000);
        assert_eq!(body_budget(LoadSourceKind::ScrapeMetrics, max, 1), max);
    }
}
