//! Executor lateness: a ticker task on the router's own tokio runtime that measures how late each
//! tick fires. Every request, discovery and poll shares that runtime, so a task that blocks it (CPU
//! work or a blocking call where it must not be) delays everything; this probe makes such a stall
//! visible in `/metrics` (`loadlink_executor_lateness_seconds`, and the worst since start in
//! `loadlink_executor_lateness_max_seconds`) instead of leaving it to be inferred from latencies.
//! It costs one timer wake-up per period (1 ms by default).

use loadlink_wire::prom::{Exposition, MetricType};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::time::{Instant, MissedTickBehavior};

/// The probe's period in the router.
pub const PERIOD: Duration = Duration::from_millis(1);

/// Upper bounds (ms) of the lateness histogram's buckets.
pub const LATENESS_BUCKETS_MS: [f64; 7] = [1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 1000.0];

/// What the ticker measured.
#[derive(Debug, Default)]
pub struct ExecutorProbe {
    /// Cumulative counts per bucket of [`LATENESS_BUCKETS_MS`].
    buckets: [AtomicU64; LATENESS_BUCKETS_MS.len()],
    ticks: AtomicU64,
    sum_us: AtomicU64,
    max_us: AtomicU64,
}

impl ExecutorProbe {
    /// Records one tick that fired `late` after its deadline.
    pub fn observe(&self, late: Duration) {
        let us = late.as_micros().min(u64::MAX as u128) as u64;
        let ms = us as f64 / 1000.0;
        for (bound, n) in LATENESS_BUCKETS_MS.iter().zip(&self.buckets) {
            if ms <= *bound {
                n.fetch_add(1, Relaxed);
            }
        }
        self.ticks.fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
        self.max_us.fetch_max(us, Relaxed);
    }

    /// The worst lateness seen since start.
    pub fn max(&self) -> Duration {
        Duration::from_micros(self.max_us.load(Relaxed))
    }

    pub fn ticks(&self) -> u64 {
        self.ticks.load(Relaxed)
    }

    /// Starts the ticker on the current runtime, ticking every `period`; it runs until aborted.
    pub fn spawn(self: &Arc<Self>, period: Duration) -> tokio::task::JoinHandle<()> {
        let probe = self.clone();
        let period = period.max(Duration::from_micros(100));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            // After a stall, measure the next tick from when it fired: one stall is one late tick,
            // not a burst of catch-up ticks that each look on time.
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            tick.tick().await;
            let mut deadline = Instant::now() + period;
            loop {
                tick.tick().await;
                let now = Instant::now();
                probe.observe(now.saturating_duration_since(deadline));
                deadline = now + period;
            }
        })
    }

    pub fn write(&self, e: &mut Exposition) {
        // The ticker observes while this reads: each bucket at least the one before it.
        let (buckets, floor) = crate::metrics::cumulative(&LATENESS_BUCKETS_MS, &self.buckets);
        e.family(
            "loadlink_executor_lateness_seconds",
            MetricType::Histogram,
            "How late the router's executor ran a periodic probe task (a blocked executor delays every request)",
        )
        .histogram(
            &(),
            buckets,
            self.ticks().max(floor),
            self.sum_us.load(Relaxed) as f64 / 1e6,
        );
        e.single(
            "loadlink_executor_lateness_max_seconds",
            MetricType::Gauge,
            "The latest the executor probe ever fired, since start",
            self.max().as_secs_f64(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_max_is_kept() {
        let p = ExecutorProbe::default();
        p.observe(Duration::from_micros(500));
        p.observe(Duration::from_millis(7));
        p.observe(Duration::from_millis(3));
        assert_eq!(p.ticks(), 3);
        assert_eq!(p.max(), Duration::from_millis(7));
        let counts: Vec<u64> = p.buckets.iter().map(|b| b.load(Relaxed)).collect();
        assert_eq!(counts, vec![1, 1, 2, 3, 3, 3, 3]);
    }

    #[test]
    fn a_bucket_read_mid_observation_is_never_below_the_one_before() {
        // As a scrape can read it: bucket 0 counted an observation that bucket 1 has not yet.
        let counts = [3u64, 2, 5].map(AtomicU64::new);
        let (buckets, floor) = crate::metrics::cumulative(&[1.0, 2.0, 5.0], &counts);
        assert_eq!(buckets, vec![(0.001, 3), (0.002, 3), (0.005, 5)]);
        assert_eq!(floor, 5);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_executor_shows_as_a_late_tick() {
        let p = Arc::new(ExecutorProbe::default());
        let task = p.spawn(Duration::from_millis(1));
        while p.ticks() < 5 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Hold the runtime's only thread for 40 ms, as CPU work on the executor would: the ticker
        // cannot run meanwhile, so its next tick is at least ~39 ms late, however loaded the host.
        std::thread::sleep(Duration::from_millis(40));
        let seen = p.ticks();
        while p.ticks() < seen + 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(
            p.max() >= Duration::from_millis(35),
            "the stall is measured: {:?}",
            p.max()
        );
        task.abort();
    }
}
