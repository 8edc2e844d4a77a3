//! Where a worker's engine load comes from, chosen once at discovery, and how its polls fare.
//!
//! Push (the load socket) is preferred; an engine without one is polled on `GET /v1/loads`
//! (SGLang) or scraped on `GET /metrics` (vLLM, or SGLang without `/v1/loads`); a worker with none
//! of these is priced on this router's in-flight count. Whatever the source, snapshots go through
//! [`Worker::apply_at`], so the freshness bound and the dispatched-since-snapshot correction treat
//! them alike. A source that stops reporting leaves the worker on in-flight after the freshness
//! bound; [`Worker::source_status`] says so, with the last poll error.

use super::{Load, Source, Worker};
use arc_swap::ArcSwapOption;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// A worker's load source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadSourceKind {
    /// The engine's load socket (generation A or B).
    Push,
    /// `GET /v1/loads`, every `--load-poll-interval-ms`.
    PollLoads,
    /// `GET /metrics` (SGLang's or vLLM's gauges), every `--load-poll-interval-ms`.
    ScrapeMetrics,
    /// This router's in-flight count only.
    Inflight,
}

impl LoadSourceKind {
    pub const ALL: [LoadSourceKind; 4] = [
        LoadSourceKind::Push,
        LoadSourceKind::PollLoads,
        LoadSourceKind::ScrapeMetrics,
        LoadSourceKind::Inflight,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LoadSourceKind::Push => "push",
            LoadSourceKind::PollLoads => "poll_loads",
            LoadSourceKind::ScrapeMetrics => "scrape_metrics",
            LoadSourceKind::Inflight => "inflight",
        }
    }

    /// Whether a poller fetches this source.
    pub fn polled(self) -> bool {
        matches!(
            self,
            LoadSourceKind::PollLoads | LoadSourceKind::ScrapeMetrics
        )
    }
}

/// Upper bounds (seconds) of the poll latency histogram.
pub const POLL_BUCKETS_S: [f64; 8] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0];

/// A worker's source and its poll counters (zero for push and in-flight).
#[derive(Debug)]
pub struct LoadSourceState {
    pub kind: LoadSourceKind,
    /// Polls answered with a usable body.
    pub polls: AtomicU64,
    /// Polls that failed (connection, status, body), timeouts included.
    pub failures: AtomicU64,
    /// Polls cut at `--load-poll-timeout-ms`.
    pub timeouts: AtomicU64,
    /// Cumulative latency histogram of answered polls over [`POLL_BUCKETS_S`].
    pub latency_buckets: [AtomicU64; POLL_BUCKETS_S.len()],
    pub latency_sum_us: AtomicU64,
    /// Why the last poll failed; cleared by a good one.
    pub last_error: ArcSwapOption<String>,
}

impl LoadSourceState {
    pub fn new(kind: LoadSourceKind) -> Self {
        LoadSourceState {
            kind,
            polls: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            latency_buckets: Default::default(),
            latency_sum_us: AtomicU64::new(0),
            last_error: ArcSwapOption::empty(),
        }
    }

    /// A poll answered in `took`.
    pub fn succeeded(&self, took: Duration) {
        self.polls.fetch_add(1, Relaxed);
        let s = took.as_secs_f64();
        // Widest bucket first: a scrape reading them narrowest first never sees them decrease.
        for (b, n) in POLL_BUCKETS_S.iter().zip(&self.latency_buckets).rev() {
            if s <= *b {
                n.fetch_add(1, Relaxed);
            }
        }
        self.latency_sum_us
            .fetch_add(took.as_micros() as u64, Relaxed);
        if self.last_error.load().is_some() {
            self.last_error.store(None);
        }
    }

    /// A poll that failed, and why.
    pub fn failed(&self, why: String, timed_out: bool) {
        self.failures.fetch_add(1, Relaxed);
        if timed_out {
            self.timeouts.fetch_add(1, Relaxed);
        }
        self.last_error.store(Some(Arc::new(why)));
    }
}

impl Worker {
    /// The same worker with its load source set (default: push with ranks, in-flight without).
    pub fn with_load_source(mut self, kind: LoadSourceKind) -> Self {
        self.load_source = LoadSourceState::new(kind);
        self
    }

    /// The source this worker is priced on right now given its `load` (the configured one, or
    /// `inflight`), and why it is on in-flight when it is.
    pub fn source_status(&self, load: &Load, freshness_ms: u64) -> (&'static str, Option<String>) {
        let kind = self.load_source.kind;
        if load.source == Source::Engine {
            return (kind.as_str(), None);
        }
        let inflight = LoadSourceKind::Inflight.as_str();
        if let Some(r) = &self.no_load_reason {
            return (inflight, Some(r.clone()));
        }
        let age = match load.age_ms {
            u64::MAX => "no snapshot yet".to_string(),
            ms => format!("last snapshot {ms} ms old"),
        };
        let reason = match (kind.polled(), self.load_source.last_error.load_full()) {
            _ if load.age_ms <= freshness_ms => "the in-flight load signal is configured".into(),
            (true, Some(e)) => format!(
                "{}: {age} (freshness {freshness_ms} ms); last poll failed: {e}",
                kind.as_str()
            ),
            _ => format!("{}: {age} (freshness {freshness_ms} ms)", kind.as_str()),
        };
        (inflight, Some(reason))
    }
}
