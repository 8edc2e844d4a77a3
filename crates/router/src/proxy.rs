//! The proxy path: pick a worker, open an in-flight guard, forward, and stream the answer back.
//!
//! The guard rides on the response body and is released when the body ends or is dropped (client
//! disconnect included) — never at headers, so a streaming response counts for its whole life.
//! Connect errors and 502/503/504 are retried on another worker with exponential backoff and
//! jitter, only before any byte reached the client; they also feed the worker's circuit breaker.
//! Upstream sockets use TCP_NODELAY and responses are passed through frame by frame (no buffering).

use crate::adapters::AdapterTicket;
use crate::admission;
use crate::book::{InflightGuard, Source};
use crate::budget::Refusal as BudgetRefusal;
use crate::cache::{ChainNamespace, Lookup};
use crate::candidate::{RANK_HEADER, RankField};
use crate::fleet::{FleetView, Roster};
use crate::models::{Asked, SetId};
use crate::rank_route::{ClientRank, with_rank_field};
use crate::request_work::WorkError;
use crate::retry::{Backoff, all_failed, retryable};
use crate::state::{AppState, error_response};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;
use http_body_util::Full;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

mod body;
pub use body::GuardedBody;
pub(crate) use body::pass_through;

const FORWARDED_HEADERS: [header::HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::AUTHORIZATION,
    header::ACCEPT,
    header::USER_AGENT,
];

/// The handler of every proxied route: reads the body within its size and time bounds, then
/// [`forward`]s it.
pub async fn proxied(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    match read_body(&st, &parts, body).await {
        Ok(bytes) if st.cfg.pd.is_some() && crate::pd::pd_route(parts.uri.path()) => {
            crate::pd::forward::forward(st, parts.method, parts.uri, parts.headers, bytes).await
        }
        Ok(bytes) => forward(st, parts.method, parts.uri, parts.headers, bytes).await,
        Err(refusal) => refusal,
    }
}

/// The request body, or the 413/408 to answer instead (a 413 is counted as `request_too_large`).
async fn read_body(st: &AppState, parts: &Parts, body: Body) -> Result<Bytes, Response> {
    let limit = st.cfg.max_body_bytes;
    let too_big = || {
        st.fleet.refusals.add(BudgetRefusal::RequestTooLarge, 1);
        error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body exceeds --max-body-bytes ({limit} bytes)"),
        )
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_big());
    }
    let read = axum::body::to_bytes(body, limit);
    match tokio::time::timeout(Duration::from_millis(st.cfg.body_timeout_ms), read).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(_)) => Err(too_big()),
        Err(_) => Err(error_response(
            StatusCode::REQUEST_TIMEOUT,
            &format!(
                "the request body did not arrive within --body-timeout-ms ({} ms)",
                st.cfg.body_timeout_ms
            ),
        )),
    }
}

/// The request as each attempted worker receives it.
pub(crate) struct Outgoing {
    method: Method,
    path_and_query: String,
    /// The route (the path without its query): decides where a routed rank goes.
    path_len: usize,
    headers: HeaderMap,
    body: Bytes,
    /// How a routed rank travels (`--dp-rank-field`).
    rank_field: RankField,
    /// The client named the rank itself: the router adds none.
    pub(crate) client_named_rank: bool,
}

impl Outgoing {
    pub(crate) fn new(
        method: Method,
        uri: &Uri,
        headers: HeaderMap,
        body: Bytes,
        rank_field: RankField,
    ) -> Self {
        let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
        Outgoing {
            method,
            path_len: uri.path().len(),
            path_and_query,
            headers,
            body,
            rank_field,
            client_named_rank: false,
        }
    }

    fn path(&self) -> &str {
        &self.path_and_query[..self.path_len]
    }

    /// The upstream request to `worker_url`, with the forwarded headers only, and `rank` (the DP
    /// rank the router chose, if it chose one) in the header and/or body field the route takes.
    fn to(
        &self,
        worker_url: &str,
        rank: Option<u32>,
    ) -> Result<hyper::Request<Full<Bytes>>, axum::http::Error> {
        self.with_body(worker_url, rank, &self.body)
    }

    /// [`Outgoing::to`] with `body` in place of the client's (a PD attempt's, with its room).
    pub(crate) fn with_body(
        &self,
        worker_url: &str,
        rank: Option<u32>,
        body: &Bytes,
    ) -> Result<hyper::Request<Full<Bytes>>, axum::http::Error> {
        let mut req = hyper::Request::builder()
            .method(self.method.clone())
            .uri(format!("{worker_url}{}", self.path_and_query));
        for h in &FORWARDED_HEADERS {
            if let Some(v) = self.headers.get(h) {
                req = req.header(h, v);
            }
        }
        // A client's own rank header travels as it came (the router then did not choose one).
        if let Some(v) = self.headers.get(RANK_HEADER) {
            req = req.header(RANK_HEADER, v);
        }
        let Some(rank) = rank.filter(|_| !self.client_named_rank) else {
            return req.body(Full::new(body.clone()));
        };
        let path = self.path();
        if self.rank_field.header_on(path) {
            req = req.header(RANK_HEADER, rank);
        }
        let body = match self.rank_field.body_on(path) {
            true => with_rank_field(body, rank).unwrap_or_else(|| body.clone()),
            false => body.clone(),
        };
        req.body(Full::new(body))
    }
}

/// How one attempt on one worker ended.
enum Attempt {
    /// An answer for the client (the worker's, or a refusal to forward at all).
    Answered(Response),
    /// A retryable failure, described for the log and the final 502.
    Failed(String),
}

/// Forwards one request. `body` has already been read (and size-checked).
pub async fn forward(
    st: Arc<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let roster = st.fleet.roster();
    let workers = &roster.workers;
    if workers.is_empty() {
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "no workers configured; start with --worker-urls or add one with POST /workers",
        );
    }
    let budget = match admission::slo_budget(
        headers
            .get(admission::SLO_HEADER)
            .and_then(|v| v.to_str().ok()),
    ) {
        Ok(b) => b,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, &e),
    };
    let cfg = &st.cfg;
    let (client_rank, asked) = match read_request(&st, uri.path(), &headers, &body).await {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    let model = match crate::models::answer::resolve(&st, &roster, uri.path(), &asked) {
        Ok(m) => m,
        Err(refused) => return refused,
    };
    let ns = crate::models::answer::namespace(&roster, &asked, &model);
    let mut out = Outgoing::new(method, &uri, headers, body, cfg.dp_rank_field);
    out.client_named_rank = client_rank.rank().is_some();
    // Ranks are candidates when the chosen one can reach the engine on this route, and the
    // client did not name one itself (then only that rank's candidates qualify).
    let ranked = roster.candidates.any_ranked && cfg.dp_rank_field.travels(uri.path());
    let target = Target {
        set: model.set,
        ranked,
        ns: (&ns).into(),
    };
    let lookup = match cache_lookup(&st, uri.path(), &out.body, &roster, target).await {
        Ok(l) => l,
        Err(refused) => return refused,
    };
    let mut adapter_costs = Vec::new();
    let mut view = FleetView::new(workers, cfg.load_signal, cfg.freshness_ms);
    view.targets = roster.targets_for(model.set, ranked);
    let adapter = model
        .adapter
        .as_deref()
        .and_then(|a| match roster.models.knows_adapter(a) {
            // Only adapters a worker lists take a place in the book's bounded name table: a
            // client's made-up `lora_path`s cannot fill it.
            true => st.fleet.adapters.intern(a),
            false => st.fleet.adapters.id(a),
        });
    if let Some(id) = adapter {
        let book = &st.fleet.adapters;
        book.fill_costs(view.targets, id, view.now_ms, &mut adapter_costs);
        view = view.with_adapter_costs(&adapter_costs);
    }
    view.pinned_rank = client_rank.rank();
    if let Some(l) = &lookup {
        view = view.with_lookup(l).with_reuse(&st.cache.reuse);
    }
    let first = admission::admit(&st, &mut view, budget, |v| {
        dispatch(&st, v, lookup.as_ref(), asked.stream, 0)
    })
    .await;
    let mut next = match first {
        Ok(d) => d,
        Err(refused) => return refused,
    };
    let mut backoff = Backoff::new(cfg.retry_initial_backoff_ms, cfg.retry_max_backoff_ms);
    let mut last_error = String::new();
    for attempt in 0..=cfg.max_retries {
        if attempt > 0 {
            view.now_ms = workers[0].now_ms();
            next = dispatch(&st, &view, lookup.as_ref(), asked.stream, attempt);
        }
        let Some(Dispatch { seq, idx, guard }) = next.take() else {
            break;
        };
        let worker = view.worker(idx);
        let rank = view.targets.rank(idx);
        let ticket = adapter
            .map(|id| AdapterTicket::dispatched(&st.fleet.adapters, worker, rank, id, view.now_ms));
        if let Some(l) = &lookup {
            if attempt == 0 {
                st.cache.record_placed(l, view.now_ms);
            }
            st.cache.record_dispatch(l, view.targets, idx, view.now_ms);
            worker.count_prefix_on(rank, l.prompt.prompt_tokens, l.cached[idx]);
        }
        match try_worker(&st, (guard, ticket), &out, started).await {
            Attempt::Answered(resp) => return resp,
            Attempt::Failed(failure) => {
                worker.failed(cfg.breaker_threshold, cfg.breaker_cooldown_ms);
                tracing::debug!("attempt {attempt} failed: {failure}");
                last_error = failure;
                view.exclude(idx);
            }
        }
        if attempt < cfg.max_retries {
            backoff.wait(seq).await;
        }
    }
    all_failed(&st, &last_error)
}

/// The rank the client named itself, if any (a 400 for one the engine would refuse), and the
/// model, adapter and namespace fields of the body. Parsing a large body runs on the request-work
/// pool, off the executor, as the cache lookup does.
pub(crate) async fn read_request(
    st: &Arc<AppState>,
    path: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(ClientRank, Asked), Response> {
    let work = &st.admission.work;
    let of = |path: &str, headers: &HeaderMap, body: &[u8]| {
        ClientRank::of(path, headers, body).map(|r| (r, Asked::of(body)))
    };
    let read = if work.inline(body.len()) {
        of(path, headers, body)
    } else {
        let (path, headers, body) = (path.to_string(), headers.clone(), body.clone());
        work.run(move || of(&path, &headers, &body))
            .await
            .map_err(|e| work_refused(st, &e))?
    };
    read.map_err(|e| error_response(StatusCode::BAD_REQUEST, &e))
}

/// This request's cached prefix on every candidate, when the policy prices caches. The parse,
/// tokenization and hashing of a large body run on the request-work pool, off the executor
/// ([`crate::request_work`]); a full pool is answered 503 at once.
/// Whom a request may go to (its model's candidates, ranked or whole) and the namespace its cache
/// lives in.
#[derive(Clone, Copy)]
pub(crate) struct Target {
    pub(crate) set: SetId,
    pub(crate) ranked: bool,
    pub(crate) ns: ChainNamespace,
}

pub(crate) async fn cache_lookup(
    st: &Arc<AppState>,
    path: &str,
    body: &Bytes,
    roster: &Arc<Roster>,
    t: Target,
) -> Result<Option<Lookup>, Response> {
    let uses_cache = match &st.cfg.pd {
        Some(pd) if crate::pd::pd_route(path) => pd.prefill_policy.uses_cache(),
        _ => st.cfg.policy.uses_cache(),
    };
    if !uses_cache {
        return Ok(None);
    }
    let Some(now) = roster.workers.first().map(|w| w.now_ms()) else {
        return Ok(None);
    };
    let work = &st.admission.work;
    let look = move |st: &AppState, path: &str, body: &[u8], roster: &Roster| {
        let targets = roster.targets_for(t.set, t.ranked);
        st.cache
            .lookup_in(&st.prefix, path, body, t.ns, targets, now)
    };
    if work.inline(body.len()) {
        return Ok(look(st, path, body, roster));
    }
    let (job_st, path, body, job_roster) =
        (st.clone(), path.to_string(), body.clone(), roster.clone());
    work.run(move || look(&job_st, &path, &body, &job_roster))
        .await
        .map_err(|e| work_refused(st, &e))
}

/// The 503 for request work the pool could not take (counted as `request_too_large`).
pub(crate) fn work_refused(st: &AppState, e: &WorkError) -> Response {
    st.fleet.refusals.add(BudgetRefusal::RequestTooLarge, 1);
    if st.admission.work.note_refusal() {
        tracing::warn!("request refused: {e}");
    }
    let mut r = error_response(StatusCode::SERVICE_UNAVAILABLE, &e.to_string());
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(1u64));
    r
}

/// A dispatch: the candidate picked for one attempt, with its in-flight guard (the dispatch is
/// counted from the moment this exists, on the worker and on the rank it names).
struct Dispatch {
    seq: u64,
    idx: usize,
    guard: InflightGuard,
}

/// Picks a worker for this attempt and counts the dispatch (a `streaming` one as unstarted until
/// its first answer bytes). `None`: nobody is available.
fn dispatch(
    st: &AppState,
    view: &FleetView<'_>,
    lookup: Option<&Lookup>,
    streaming: bool,
    attempt: u32,
) -> Option<Dispatch> {
    let (seq, idx) = pick(st, view, attempt)?;
    let worker = view.worker(idx).clone();
    let uncached = match lookup {
        Some(l) => l.prompt.prompt_tokens.saturating_sub(l.cached[idx]),
        None => crate::book::DISPATCH_TOKENS_GUESS as u64,
    };
    let guard = InflightGuard::to_target(worker, view.targets.rank(idx), uncached);
    let guard = match streaming {
        true => guard.awaiting_first_bytes(),
        false => guard,
    };
    Some(Dispatch { seq, idx, guard })
}

/// Picks a worker for this attempt (at the view's `now`) and counts the decision. `None`: nobody
/// is available. Workers over an admission cap are left out while any other may take the request
/// ([`admission::rules::pick`]).
fn pick(st: &AppState, view: &FleetView<'_>, attempt: u32) -> Option<(u64, usize)> {
    let cfg = &st.cfg;
    let seq = st.seq.fetch_add(1, Relaxed);
    let idx = admission::rules::pick(&cfg.policy, view, &cfg.admission, seq)?;
    if attempt > 0 {
        st.metrics.retries.fetch_add(1, Relaxed);
    }
    // Same `now` as the pick: no second clock read on the request path.
    let priced = view.load_of(idx);
    if priced.source == Source::Fallback {
        st.metrics.fallback_decisions.fetch_add(1, Relaxed);
    }
    st.metrics.decisions.fetch_add(1, Relaxed);
    Some((seq, idx))
}

/// One attempt on the guard's worker; the guard (counted at dispatch) rides on the answer.
async fn try_worker(
    st: &AppState,
    (guard, ticket): (InflightGuard, Option<AdapterTicket>),
    out: &Outgoing,
    started: Instant,
) -> Attempt {
    let worker = guard.worker().clone();
    let req = match out.to(&worker.url, guard.rank()) {
        Ok(r) => r,
        Err(e) => {
            return Attempt::Answered(error_response(
                StatusCode::BAD_REQUEST,
                &format!("cannot forward this request: {e}"),
            ));
        }
    };
    let timeout = Duration::from_millis(st.cfg.upstream_timeout_ms);
    match tokio::time::timeout(timeout, st.client.request(req)).await {
        Ok(Ok(resp)) if !retryable(resp.status()) => {
            worker.succeeded();
            st.metrics.observe_ttfb(started.elapsed());
            st.metrics.count_status(resp.status().as_u16());
            Attempt::Answered(pass_through(resp, guard, ticket))
        }
        Ok(Ok(resp)) => Attempt::Failed(format!("{} answered {}", worker.url, resp.status())),
        Ok(Err(e)) => Attempt::Failed(format!("{}: {e}", worker.url)),
        Err(_) => Attempt::Failed(format!(
            "{}: no response headers within {} ms",
            worker.url, st.cfg.upstream_timeout_ms
        )),
    }
}
