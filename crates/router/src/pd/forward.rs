//! A PD request from arrival to answer: read it as any request (its model, the rank a client
//! named, its batch size), resolve its model on each side, look its prompt up in the prefill
//! side's caches, admit it on each side (each side's caps), then attempt pairs
//! ([`super::pair::run`]) until one answers.
//!
//! **Retries.** A leg that cannot connect or answers 502–504 before anything reached the client
//! fails its attempt; the next attempt draws a new room, leaves the failed worker out of its side,
//! and picks both legs again (the failed pair's other leg was already dropped). So a room is
//! never sent to two prefill engines, and a decode engine never waits for a room no prefill
//! engine holds. Backoff and the retry budget are the router's (`--max-retries`).

use super::body::{Bootstrap, Shape, shape, url_host, with_bootstrap};
use super::metrics::Outcome;
use super::pair::{self, PairEnd};
use super::{PdConfig, Role, fresh_room};
use crate::admission;
use crate::book::InflightGuard;
use crate::cache::Lookup;
use crate::fleet::FleetView;
use crate::policy::Policy;
use crate::proxy::{Outgoing, Target, cache_lookup, read_request, work_refused};
use crate::retry::{Backoff, all_failed};
use crate::state::{AppState, error_response};
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// Forwards one PD request (a generation route, `--pd`). `body` has been read and size-checked.
pub async fn forward(
    st: Arc<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = attempt_pairs(&st, method, uri, headers, body).await;
    let (resp, outcome) = match answer {
        Ok(a) => a,
        Err((resp, outcome)) => (resp, outcome),
    };
    st.pd.outcome(outcome);
    resp
}

type Refused = (Response, Outcome);

fn no_pair(st: &AppState, status: StatusCode, msg: &str) -> Refused {
    st.metrics.count_status(status.as_u16());
    (error_response(status, msg), Outcome::NoPair)
}

async fn attempt_pairs(
    st: &Arc<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(Response, Outcome), Refused> {
    let started = Instant::now();
    let Some(pd) = st.cfg.pd.as_ref() else {
        return Err(no_pair(
            st,
            StatusCode::INTERNAL_SERVER_ERROR,
            "not a PD router",
        ));
    };
    let roster = st.fleet.roster();
    let Some(sides) = roster.pd.as_deref() else {
        let msg = "no prefill or decode worker: give --prefill/--decode, or workers whose \
                   /server_info says disaggregation_mode prefill or decode";
        return Err(no_pair(st, StatusCode::SERVICE_UNAVAILABLE, msg));
    };
    for (side, name) in [(&sides.prefill, "prefill"), (&sides.decode, "decode")] {
        if side.workers.is_empty() {
            let msg = format!("no {name} worker in the fleet: a PD request needs one of each");
            return Err(no_pair(st, StatusCode::SERVICE_UNAVAILABLE, &msg));
        }
    }
    let cfg = &st.cfg;
    let budget = admission::slo_budget(
        headers
            .get(admission::SLO_HEADER)
            .and_then(|v| v.to_str().ok()),
    )
    .map_err(|e| bad_request(st, &e))?;
    let path = uri.path().to_string();
    let (client_rank, asked) = read_request(st, &path, &headers, &body)
        .await
        .map_err(|r| (r, Outcome::NoPair))?;
    let shape = body_shape(st, &path, body).await?;
    let resolve = crate::models::answer::resolve_counted;
    let pmodel =
        resolve(st, &sides.prefill, &path, &asked, true).map_err(|r| (r, Outcome::NoPair))?;
    let dmodel =
        resolve(st, &sides.decode, &path, &asked, false).map_err(|r| (r, Outcome::NoPair))?;
    let ns = crate::models::answer::namespace(&sides.prefill, &asked, &pmodel);
    let mut out = Outgoing::new(method, &uri, headers, shape.body.clone(), cfg.dp_rank_field);
    out.client_named_rank = client_rank.rank().is_some();
    let travels = cfg.dp_rank_field.travels(&path);
    let pranked = sides.prefill.candidates.any_ranked && travels;
    let dranked = sides.decode.candidates.any_ranked && travels;
    let target = Target {
        set: pmodel.set,
        ranked: pranked,
        ns: (&ns).into(),
    };
    let lookup = cache_lookup(st, &path, &shape.body, &sides.prefill, target)
        .await
        .map_err(|r| (r, Outcome::NoPair))?;
    let mut pview = FleetView::new(&sides.prefill.workers, cfg.load_signal, cfg.freshness_ms);
    pview.targets = sides.prefill.targets_for(pmodel.set, pranked);
    pview.pinned_rank = client_rank.rank();
    if let Some(l) = &lookup {
        pview = pview.with_lookup(l).with_reuse(&st.cache.reuse);
    }
    let mut dview = FleetView::new(&sides.decode.workers, cfg.load_signal, cfg.freshness_ms);
    dview.targets = sides.decode.targets_for(dmodel.set, dranked);
    let legs = Legs {
        st,
        pd,
        lookup: lookup.as_ref(),
    };
    let p = admission::admit(st, &mut pview, budget, |v| legs.pick(v, Role::Prefill))
        .await
        .map_err(|r| (r, Outcome::NoPair))?;
    let d = admission::admit(st, &mut dview, None, |v| legs.pick(v, Role::Decode))
        .await
        .map_err(|r| (r, Outcome::NoPair))?;
    let (mut p, mut d) = (p, d);
    let mut backoff = Backoff::new(cfg.retry_initial_backoff_ms, cfg.retry_max_backoff_ms);
    let mut last_error = String::new();
    let mut attempted = false;
    for attempt in 0..=cfg.max_retries {
        if attempt > 0 {
            pview.now_ms = pview.workers()[0].now_ms();
            dview.now_ms = pview.now_ms;
            p = legs.pick(&pview, Role::Prefill);
            d = legs.pick(&dview, Role::Decode);
        }
        let (Some(pl), Some(dl)) = (p.take(), d.take()) else {
            break;
        };
        let (pw, prank) = (pview.worker(pl.idx).clone(), pview.targets.rank(pl.idx));
        let (dw, drank) = (dview.worker(dl.idx).clone(), dview.targets.rank(dl.idx));
        if let Some(l) = &lookup {
            if !attempted {
                st.cache.record_placed(l, pview.now_ms);
            }
            st.cache
                .record_dispatch(l, pview.targets, pl.idx, pview.now_ms);
            pw.count_prefix_on(prank, l.prompt.prompt_tokens, l.cached[pl.idx]);
        }
        attempted = true;
        let rooms: Vec<u64> = (0..shape.batch.unwrap_or(1))
            .map(|_| fresh_room())
            .collect();
        let boot = Bootstrap {
            host: url_host(&pw.url),
            port: pw.pd.port(),
            rooms: &rooms,
            prefill_rank: prank,
        };
        let body = with_bootstrap(&shape.body, shape.batch, &boot);
        let (preq, dreq) = match (
            out.with_body(&pw.url, prank, &body),
            out.with_body(&dw.url, drank, &body),
        ) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                return Err(bad_request(
                    st,
                    &format!("cannot forward this request: {e}"),
                ));
            }
        };
        tracing::debug!(prefill = %pw.url, decode = %dw.url, room = rooms[0], "PD attempt {attempt}");
        match pair::run(st, (pl.guard, preq), (dl.guard, dreq), started).await {
            PairEnd::Answered(resp, outcome) => return Ok((resp, outcome)),
            PairEnd::Failed(role, why) => {
                let (view, idx, w) = match role {
                    Role::Decode => (&mut dview, dl.idx, &dw),
                    _ => (&mut pview, pl.idx, &pw),
                };
                w.failed(cfg.breaker_threshold, cfg.breaker_cooldown_ms);
                view.exclude(idx);
                tracing::debug!("PD attempt {attempt} failed: {why}");
                last_error = why;
                if attempt < cfg.max_retries {
                    st.pd.retry(role);
                    st.metrics.retries.fetch_add(1, Relaxed);
                    backoff.wait(pl.seq).await;
                }
            }
        }
    }
    let outcome = if attempted {
        Outcome::Exhausted
    } else {
        Outcome::NoPair
    };
    Err((all_failed(st, &last_error), outcome))
}

fn bad_request(st: &AppState, msg: &str) -> Refused {
    st.metrics.count_status(400);
    (
        error_response(StatusCode::BAD_REQUEST, msg),
        Outcome::NoPair,
    )
}

/// The body's [`Shape`]; a large body is parsed on the request-work pool, off the executor.
async fn body_shape(st: &Arc<AppState>, path: &str, body: Bytes) -> Result<Shape, Refused> {
    let work = &st.admission.work;
    let read = if work.inline(body.len()) {
        shape(path, body)
    } else {
        let path = path.to_string();
        work.run(move || shape(&path, body))
            .await
            .map_err(|e| (work_refused(st, &e), Outcome::NoPair))?
    };
    read.map_err(|e| bad_request(st, &e))
}

/// One side's pick for an attempt, with its in-flight guard (counted from the moment it exists).
struct Leg {
    seq: u64,
    idx: usize,
    guard: InflightGuard,
}

/// What picking a leg needs.
struct Legs<'a> {
    st: &'a AppState,
    pd: &'a PdConfig,
    lookup: Option<&'a Lookup>,
}

impl Legs<'_> {
    /// Picks `role`'s leg over `view` with that side's policy (over its admission caps while any
    /// candidate is within them), and counts it. `None`: nobody on that side is available.
    fn pick(&self, view: &FleetView<'_>, role: Role) -> Option<Leg> {
        let (policy, lookup): (Policy, _) = match role {
            Role::Decode => (self.pd.decode_policy, None),
            _ => (self.pd.prefill_policy, self.lookup),
        };
        let st = self.st;
        let seq = st.pd.next_seq(role);
        let idx = admission::rules::pick(&policy, view, &st.cfg.admission, seq)?;
        st.metrics.decisions.fetch_add(1, Relaxed);
        if view.load_of(idx).source == crate::book::Source::Fallback {
            st.metrics.fallback_decisions.fetch_add(1, Relaxed);
        }
        st.pd.dispatched(role);
        // The decode side computes no prompt: only the prefill leg queues prompt tokens.
        let uncached = match (role, lookup) {
            (Role::Decode, _) => 0,
            (_, Some(l)) => l.prompt.prompt_tokens.saturating_sub(l.cached[idx]),
            (_, None) => crate::book::DISPATCH_TOKENS_GUESS as u64,
        };
        let worker = view.worker(idx).clone();
        let guard = InflightGuard::to_target(worker, view.targets.rank(idx), uncached);
        Some(Leg { seq, idx, guard })
    }
}
