//! The load-source families of the router's `/metrics`: each worker's source (configured and
//! current, as `/workers` shows them) and, for polled workers, the poll counters and latency.

use crate::book::source::POLL_BUCKETS_S;
use crate::book::{Load, Worker};
use loadlink_wire::prom::{Exposition, MetricType};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

loadlink_wire::label_set! {
    /// `{worker, source, configured}`: the source priced on now, and the one chosen at discovery.
    struct SourceLabels<'a> { worker: &'a str, source: &'static str, configured: &'static str }
}

loadlink_wire::label_set! {
    /// `{worker="URL"}`.
    struct PolledLabels<'a> { worker: &'a str }
}

type Counter = fn(&crate::book::LoadSourceState) -> &AtomicU64;

const POLL_COUNTERS: [(&str, &str, Counter); 3] = [
    (
        "loadlink_worker_load_polls_total",
        "Load polls answered with a usable body (poll_loads and scrape_metrics workers)",
        |s| &s.polls,
    ),
    (
        "loadlink_worker_load_poll_failures_total",
        "Load polls that failed (connection, status, body or timeout)",
        |s| &s.failures,
    ),
    (
        "loadlink_worker_load_poll_timeouts_total",
        "Load polls cut at --load-poll-timeout-ms",
        |s| &s.timeouts,
    ),
];

/// Writes the source family for every worker and the poll families for the polled ones.
pub fn write(e: &mut Exposition, loads: &[(&Worker, Load)], freshness_ms: u64) {
    let mut f = e.family(
        "loadlink_worker_load_source",
        MetricType::Gauge,
        "1 per worker, labelled with the load source it is priced on now (push, poll_loads, \
         scrape_metrics, inflight) and the one chosen at discovery",
    );
    for (w, l) in loads {
        let labels = SourceLabels {
            worker: &w.url,
            source: w.source_status(l, freshness_ms).0,
            configured: w.load_source.kind.as_str(),
        };
        f.sample(&labels, 1);
    }
    let polled: Vec<&Worker> = loads
        .iter()
        .map(|(w, _)| *w)
        .filter(|w| w.load_source.kind.polled())
        .collect();
    for (name, help, read) in POLL_COUNTERS {
        let mut f = e.family(name, MetricType::Counter, help);
        for w in &polled {
            f.sample(
                &PolledLabels { worker: &w.url },
                read(&w.load_source).load(Relaxed),
            );
        }
    }
    let mut f = e.family(
        "loadlink_worker_load_poll_seconds",
        MetricType::Histogram,
        "Latency of answered load polls",
    );
    for w in &polled {
        let s = &w.load_source;
        let buckets = POLL_BUCKETS_S
            .iter()
            .zip(&s.latency_buckets)
            .map(|(b, n)| (*b, n.load(Relaxed)));
        f.histogram(
            &PolledLabels { worker: &w.url },
            buckets,
            s.polls.load(Relaxed),
            s.latency_sum_us.load(Relaxed) as f64 / 1e6,
        );
    }
}
