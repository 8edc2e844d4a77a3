//! Router-wide counters (`Metrics`) and the `/metrics` page.
//!
//! The page is written through `loadlink_wire::prom`, the one Prometheus writer: each family is
//! opened once and all its samples follow, with typed label sets. Every per-worker reading is
//! taken from one `Load` per worker per scrape, so the gauges of a worker agree with each other.

use crate::book::{Load, Source, Worker};
use crate::state::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use loadlink_wire::FrameError;
use loadlink_wire::prom::{Exposition, MetricType, Number};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Router-wide counters.
#[derive(Default)]
pub struct Metrics {
    pub decisions: AtomicU64,
    pub fallback_decisions: AtomicU64,
    pub retries: AtomicU64,
    /// Responses by status class, indexed like [`STATUS_CLASSES`].
    pub status: [AtomicU64; 4],
    /// Time to upstream response headers, cumulative histogram over [`TTFB_BUCKETS_MS`].
    pub ttfb_buckets: [AtomicU64; 10],
    pub ttfb_sum_us: AtomicU64,
    pub ttfb_count: AtomicU64,
}

pub const TTFB_BUCKETS_MS: [f64; 10] = [
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0, 5000.0,
];

/// The `class` labels of `loadlink_router_responses_total`.
pub const STATUS_CLASSES: [&str; 4] = ["2xx", "4xx", "5xx", "other"];

impl Metrics {
    pub fn count_status(&self, s: u16) {
        let i = match s {
            200..=299 => 0,
            400..=499 => 1,
            500..=599 => 2,
            _ => 3,
        };
        self.status[i].fetch_add(1, Relaxed);
    }

    pub fn observe_ttfb(&self, d: Duration) {
        let ms = d.as_secs_f64() * 1000.0;
        for (i, b) in TTFB_BUCKETS_MS.iter().enumerate() {
            if ms <= *b {
                self.ttfb_buckets[i].fetch_add(1, Relaxed);
            }
        }
        self.ttfb_sum_us.fetch_add(d.as_micros() as u64, Relaxed);
        self.ttfb_count.fetch_add(1, Relaxed);
    }

    /// The router-wide families.
    fn write(&self, e: &mut Exposition) {
        let counters = [
            (
                "loadlink_router_decisions_total",
                "Routing decisions",
                &self.decisions,
            ),
            (
                "loadlink_router_fallback_decisions_total",
                "Decisions that chose a worker priced on in-flight fallback",
                &self.fallback_decisions,
            ),
            (
                "loadlink_router_retries_total",
                "Upstream attempts retried on another worker",
                &self.retries,
            ),
        ];
        for (name, help, c) in counters {
            e.single(name, MetricType::Counter, help, c.load(Relaxed));
        }
        let mut f = e.family(
            "loadlink_router_responses_total",
            MetricType::Counter,
            "Responses by status class",
        );
        for (class, n) in STATUS_CLASSES.iter().zip(&self.status) {
            f.sample(&[("class", class)], n.load(Relaxed));
        }
        let (buckets, floor) = cumulative(&TTFB_BUCKETS_MS, &self.ttfb_buckets);
        e.family(
            "loadlink_router_upstream_headers_seconds",
            MetricType::Histogram,
            "Time to upstream response headers",
        )
        .histogram(
            &(),
            buckets,
            self.ttfb_count.load(Relaxed).max(floor),
            self.ttfb_sum_us.load(Relaxed) as f64 / 1e6,
        );
    }
}

/// A histogram's cumulative buckets (`(le seconds, count)` from bounds in ms), read while it may
/// be observed: an observation between two reads could make a bucket look larger than the next,
/// which is not a valid page; each is read as at least the one before. Also the largest, a floor
/// for the count read after them.
pub(crate) fn cumulative(bounds_ms: &[f64], counts: &[AtomicU64]) -> (Vec<(f64, u64)>, u64) {
    let mut floor = 0;
    let buckets = bounds_ms
        .iter()
        .zip(counts)
        .map(|(ms, n)| {
            floor = floor.max(n.load(Relaxed));
            (ms / 1000.0, floor)
        })
        .collect();
    (buckets, floor)
}

loadlink_wire::label_set! {
    /// `{worker="URL"}`.
    struct WorkerLabels<'a> { worker: &'a str }
}

loadlink_wire::label_set! {
    /// `{worker="URL",source="engine|fallback"}`.
    struct SourcedLabels<'a> { worker: &'a str, source: &'static str }
}

loadlink_wire::label_set! {
    /// `{worker="URL",rank="R"}`.
    struct RankLabels<'a> { worker: &'a str, rank: usize }
}

loadlink_wire::label_set! {
    /// `{worker="URL",reason="<FrameError::reason>"}`, and for workers on fallback for good,
    /// `{worker="URL",reason="why it cannot be priced on engine load"}`.
    struct ReasonLabels<'a> { worker: &'a str, reason: &'a str }
}

/// Workers that are on fallback for good (no load range, discovery failed, or their sockets could
/// not be opened), with the reason: the cause is on the page, not only in a log line.
fn write_reasons(e: &mut Exposition, loads: &[(&Worker, Load)]) {
    let mut f = e.family(
        "loadlink_worker_no_load_reason",
        MetricType::Gauge,
        "1 for a worker priced on in-flight only for good, labelled with why",
    );
    for (w, _) in loads {
        if let Some(reason) = &w.no_load_reason {
            f.sample(
                &ReasonLabels {
                    worker: &w.url,
                    reason,
                },
                1,
            );
        }
    }
}

/// One reading of a worker, taken with the `Load` of this scrape.
type WorkerReading = fn(&Worker, &Load) -> Number;

/// The per-worker families labelled `{worker}` only.
const WORKER_FAMILIES: [(&str, MetricType, &str, WorkerReading); 9] = [
    (
        "loadlink_worker_load_age_seconds",
        MetricType::Gauge,
        "Age of the oldest rank snapshot (NaN: none)",
        |_, l| match l.age_ms {
            u64::MAX => Number::Float(f64::NAN),
            ms => Number::Float(ms as f64 / 1000.0),
        },
    ),
    (
        "loadlink_worker_inflight",
        MetricType::Gauge,
        "Open in-flight guards of this router",
        |w, _| w.inflight().into(),
    ),
    (
        "loadlink_worker_requests_total",
        MetricType::Counter,
        "Requests dispatched",
        |w, _| w.requests_total.load(Relaxed).into(),
    ),
    (
        "loadlink_worker_failures_total",
        MetricType::Counter,
        "Failed upstream attempts",
        |w, _| w.failures_total.load(Relaxed).into(),
    ),
    (
        "loadlink_worker_breaker_open",
        MetricType::Gauge,
        "1 while the circuit breaker is open",
        |w, _| w.breaker_open().into(),
    ),
    (
        "loadlink_worker_healthy",
        MetricType::Gauge,
        "1 while health checks pass",
        |w, _| w.is_healthy().into(),
    ),
    (
        "loadlink_worker_routed_prompt_tokens_total",
        MetricType::Counter,
        "Prompt tokens of requests routed here after a cache lookup",
        |w, _| w.routed_prompt_tokens.load(Relaxed).into(),
    ),
    (
        "loadlink_worker_routed_cached_tokens_total",
        MetricType::Counter,
        "Of those, tokens the router believed cached here (ratio: the hit rate it routed for)",
        |w, _| w.routed_cached_tokens.load(Relaxed).into(),
    ),
    (
        "loadlink_worker_engine_priced",
        MetricType::Gauge,
        "1 when priced on engine load, 0 on fallback",
        |_, l| (l.source == Source::Engine).into(),
    ),
];

/// A rank's figures: the `{worker, rank}` families (bounded by each worker's rank budget).
type RankReading = fn(&crate::book::RankState) -> u64;

const RANK_FAMILIES: [(&str, MetricType, &str, RankReading); 9] = [
    (
        "loadlink_rank_messages_total",
        MetricType::Counter,
        "Load messages received per rank",
        |r| r.messages.load(Relaxed),
    ),
    (
        "loadlink_rank_seq_gaps_total",
        MetricType::Counter,
        "Sequence numbers skipped (PUB drops)",
        |r| r.gaps.load(Relaxed),
    ),
    (
        "loadlink_rank_restarts_total",
        MetricType::Counter,
        "Publisher restarts detected (seq went back)",
        |r| r.restarts.load(Relaxed),
    ),
    (
        "loadlink_rank_engine_requests",
        MetricType::Gauge,
        "Running + waiting requests the rank last reported",
        |r| {
            r.running
                .load(Relaxed)
                .saturating_add(r.waiting.load(Relaxed))
                .max(0) as u64
        },
    ),
    (
        "loadlink_rank_backlog_tokens",
        MetricType::Gauge,
        "Prompt tokens waiting for prefill the rank last reported",
        |r| r.backlog.load(Relaxed).max(0) as u64,
    ),
    (
        "loadlink_rank_inflight",
        MetricType::Gauge,
        "This router's open requests routed to the rank by name",
        |r| r.routed().inflight().max(0) as u64,
    ),
    (
        "loadlink_rank_routed_requests_total",
        MetricType::Counter,
        "Requests this router routed to the rank by name (X-Data-Parallel-Rank / routed_dp_rank)",
        |r| r.routed().requests_total.load(Relaxed),
    ),
    (
        "loadlink_rank_routed_prompt_tokens_total",
        MetricType::Counter,
        "Prompt tokens of requests routed to the rank after a cache lookup",
        |r| r.routed().prompt_tokens.load(Relaxed),
    ),
    (
        "loadlink_rank_routed_cached_tokens_total",
        MetricType::Counter,
        "Of those, tokens the router believed cached on the rank (ratio: its routed hit rate)",
        |r| r.routed().cached_tokens.load(Relaxed),
    ),
];

/// The per-worker, per-rank and dropped-frame families.
fn write_workers(e: &mut Exposition, loads: &[(&Worker, Load)]) {
    let mut f = e.family(
        "loadlink_worker_load",
        MetricType::Gauge,
        "Load a policy sees (requests), with its source",
    );
    for (w, l) in loads {
        let labels = SourcedLabels {
            worker: &w.url,
            source: l.source.as_str(),
        };
        f.sample(&labels, l.requests);
    }
    for (name, ty, help, read) in WORKER_FAMILIES {
        let mut f = e.family(name, ty, help);
        for (w, l) in loads {
            f.sample(&WorkerLabels { worker: &w.url }, read(w, l));
        }
    }
    for (name, ty, help, read) in RANK_FAMILIES {
        let mut f = e.family(name, ty, help);
        for (w, _) in loads {
            for r in w.ranks.iter() {
                f.sample(
                    &RankLabels {
                        worker: &w.url,
                        rank: r.rank,
                    },
                    read(r),
                );
            }
        }
    }
    let mut f = e.family(
        "loadlink_rank_utilisation",
        MetricType::Gauge,
        "Share of the rank's time its prefill is busy (1 while its queue does not drain), smoothed over 5 s (NaN: not measured)",
    );
    for (w, _) in loads {
        for r in w.ranks.iter() {
            let labels = RankLabels {
                worker: &w.url,
                rank: r.rank,
            };
            f.sample(&labels, Number::Float(r.rho().unwrap_or(f64::NAN)));
        }
    }
    let mut f = e.family(
        "loadlink_frames_dropped_total",
        MetricType::Counter,
        "Load frames dropped, by reason",
    );
    for (w, _) in loads {
        for (reason, n) in FrameError::REASONS.iter().zip(&w.dropped) {
            f.sample(
                &ReasonLabels {
                    worker: &w.url,
                    reason,
                },
                n.load(Relaxed),
            );
        }
    }
}

/// The whole `/metrics` page.
pub fn render(st: &AppState) -> String {
    let workers = st.fleet.workers();
    let loads: Vec<(&Worker, Load)> = workers
        .iter()
        .map(|w| (&**w, w.load(st.cfg.load_signal, st.cfg.freshness_ms)))
        .collect();
    let mut e = Exposition::new();
    st.metrics.write(&mut e);
    st.executor.write(&mut e);
    write_workers(&mut e, &loads);
    write_reasons(&mut e, &loads);
    write_refusals(&mut e, st, &loads);
    crate::poll::metrics::write(&mut e, &loads, st.cfg.freshness_ms);
    match st.fleet.ingest_stats() {
        Some(s) => s.write(&mut e),
        None => crate::ingest::stats::IngestStats::default().write(&mut e),
    }
    st.cache.write_metrics(&mut e, &workers);
    e.single(
        "loadlink_chat_unkeyed_total",
        MetricType::Counter,
        "Chat requests routed without a cache key: their chat template failed to render or passed its bounds (--tokenizer)",
        st.prefix.tokenizer.unkeyed_chats(),
    );
    write_control(&mut e, st);
    crate::models::metrics::write(&mut e, st);
    st.fleet.adapters.write_metrics(&mut e);
    if st.cfg.pd.is_some() {
        st.pd.write(&mut e, st);
    }
    e.finish()
}

/// What peers sent that was refused ([`crate::budget`]): fleet-wide by reason (every reason, zeros
/// included, so a rate query never misses a series), and per worker for the reasons it hit.
fn write_refusals(e: &mut Exposition, st: &AppState, loads: &[(&Worker, Load)]) {
    let mut f = e.family(
        "loadlink_peer_refusals_total",
        MetricType::Counter,
        "Input from workers and clients refused or dropped for exceeding a budget, by reason",
    );
    for (r, n) in st.fleet.refusals.iter() {
        f.sample(&[("reason", r.as_str())], n);
    }
    let mut f = e.family(
        "loadlink_worker_refusals_total",
        MetricType::Counter,
        "Input from this worker refused or dropped for exceeding a budget, by reason",
    );
    for (w, _) in loads {
        for (r, n) in w.refusals.counts().iter().filter(|(_, n)| *n > 0) {
            f.sample(
                &ReasonLabels {
                    worker: &w.url,
                    reason: r.as_str(),
                },
                n,
            );
        }
    }
}

/// Admission and membership: what the router refused and how its fleet changed.
fn write_control(e: &mut Exposition, st: &AppState) {
    let a = &st.admission;
    let mut f = e.family(
        "loadlink_admission_refused_total",
        MetricType::Counter,
        "Requests answered 429 by admission control, by reason",
    );
    for (why, n) in crate::admission::Refusal::ALL.iter().zip(&a.refused) {
        f.sample(&[("reason", why.as_str())], n.load(Relaxed));
    }
    let m = &st.membership;
    let singles = [
        (
            "loadlink_admission_queued",
            MetricType::Gauge,
            "Requests waiting in the admission queue",
            a.queued.load(Relaxed) as u64,
        ),
        (
            "loadlink_admission_admitted_after_wait_total",
            MetricType::Counter,
            "Requests admitted after waiting in the queue",
            a.admitted_after_wait.load(Relaxed),
        ),
        (
            "loadlink_request_work_running",
            MetricType::Gauge,
            "Requests whose CPU work (parse, tokenize, hash) runs on the request-work pool",
            a.work.running() as u64,
        ),
        (
            "loadlink_request_work_waiting",
            MetricType::Gauge,
            "Requests whose CPU work waits for a request-work thread",
            a.work.waiting() as u64,
        ),
        (
            "loadlink_membership_refreshes_total",
            MetricType::Counter,
            "Worker-list refreshes from --worker-urls-file or --worker-dns",
            m.refreshes.load(Relaxed),
        ),
        (
            "loadlink_membership_errors_total",
            MetricType::Counter,
            "Failed refreshes (the workers were kept)",
            m.errors.load(Relaxed),
        ),
        (
            "loadlink_membership_added_total",
            MetricType::Counter,
            "Workers added by the file or DNS",
            m.added.load(Relaxed),
        ),
        (
            "loadlink_membership_removed_total",
            MetricType::Counter,
            "Workers removed by the file or DNS",
            m.removed.load(Relaxed),
        ),
    ];
    for (name, ty, help, v) in singles {
        e.single(name, ty, help, v);
    }
}

pub async fn page(State(st): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render(&st),
    )
        .into_response()
}
