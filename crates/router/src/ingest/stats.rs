//! Ingest-wide counters, shown on `/metrics`: messages received, snapshots decoded (fewer than
//! messages when a backlog is collapsed to its newest), drains (wake-ups), and the delivery lag of
//! each decoded snapshot — the time from its `timestamp` (set by the publisher when it took the
//! snapshot) to its numbers being in the book. On one host that is the load-change-to-book latency;
//! across hosts it also carries their clock difference.

use loadlink_wire::prom::{Exposition, MetricType};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bounds (seconds) of the delivery-lag histogram.
pub const LAG_BUCKETS_S: [f64; 11] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0, 5.0,
];

/// Counters shared by every ingest thread.
#[derive(Default)]
pub struct IngestStats {
    pub messages: AtomicU64,
    pub decoded: AtomicU64,
    pub drains: AtomicU64,
    pub wakeups: AtomicU64,
    pub subscriptions: AtomicU64,
    /// Sweeps of a quiet socket that found messages no edge had announced.
    pub rescued: AtomicU64,
    /// Load sockets redialled after a long silence (a lost or refused connection).
    pub redials: AtomicU64,
    lag_buckets: [AtomicU64; LAG_BUCKETS_S.len()],
    lag_count: AtomicU64,
    lag_sum_us: AtomicU64,
}

impl IngestStats {
    /// Records one decoded snapshot's delivery lag (negative clock differences count as 0).
    pub fn observe_lag(&self, seconds: f64) {
        let s = if seconds.is_finite() {
            seconds.max(0.0)
        } else {
            return;
        };
        if let Some(i) = LAG_BUCKETS_S.iter().position(|b| s <= *b) {
            self.lag_buckets[i].fetch_add(1, Relaxed);
        }
        self.lag_count.fetch_add(1, Relaxed);
        self.lag_sum_us.fetch_add((s * 1e6) as u64, Relaxed);
    }

    /// Cumulative bucket counts, as Prometheus wants them.
    pub fn lag_cumulative(&self) -> Vec<(f64, u64)> {
        let mut acc = 0;
        LAG_BUCKETS_S
            .iter()
            .zip(&self.lag_buckets)
            .map(|(b, n)| {
                acc += n.load(Relaxed);
                (*b, acc)
            })
            .collect()
    }

    /// The `loadlink_ingest_*` families.
    pub fn write(&self, e: &mut Exposition) {
        let counters = [
            (
                "loadlink_ingest_messages_total",
                "Load messages received by the ingest threads",
                &self.messages,
            ),
            (
                "loadlink_ingest_decoded_total",
                "Snapshots decoded (only the newest of a rank's queued messages is decoded)",
                &self.decoded,
            ),
            (
                "loadlink_ingest_drains_total",
                "Ready sockets drained",
                &self.drains,
            ),
            (
                "loadlink_ingest_wakeups_total",
                "Returns from epoll_wait",
                &self.wakeups,
            ),
            (
                "loadlink_ingest_rescued_total",
                "Quiet sockets whose once-a-second sweep found messages no readiness edge announced",
                &self.rescued,
            ),
            (
                "loadlink_ingest_redials_total",
                "Load sockets redialled after 5 s of silence (a connection libzmq dropped for a protocol error, e.g. an oversized message, is not redialled by libzmq)",
                &self.redials,
            ),
        ];
        for (name, help, c) in counters {
            e.single(name, MetricType::Counter, help, c.load(Relaxed));
        }
        e.single(
            "loadlink_ingest_subscriptions",
            MetricType::Gauge,
            "Rank load sockets held by the ingest threads",
            self.subscriptions.load(Relaxed),
        );
        e.family(
            "loadlink_ingest_lag_seconds",
            MetricType::Histogram,
            "From a snapshot's timestamp to its numbers in the book",
        )
        .histogram(
            &(),
            self.lag_cumulative(),
            self.lag_count.load(Relaxed),
            self.lag_sum_us.load(Relaxed) as f64 / 1e6,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_histogram_is_cumulative() {
        let s = IngestStats::default();
        s.observe_lag(0.0003);
        s.observe_lag(0.003);
        s.observe_lag(-1.0);
        s.observe_lag(f64::NAN);
        let c = s.lag_cumulative();
        assert_eq!(c[0], (0.0005, 2));
        assert_eq!(c[3], (0.005, 3));
        assert_eq!(c.last().unwrap().1, 3);
    }
}
