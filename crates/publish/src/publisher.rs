//! The `Publisher`: once per scheduler cycle, collect the rank's load at most once and hand the
//! same snapshot (encoded once) to every sink that is due.
//!
//! It is the single owner of cadence (per-sink call intervals, `force`), of isolation (a failing or
//! panicking sink never stops the others; a failing collection publishes nothing) and of failure
//! reporting (first occurrence, then every Nth, with the count; a success ends the episode).

use crate::sink::{Encoded, Sink, WriteOutcome};
use loadlink_wire::LoadSnapshot;
use loadlink_wire::codec::encode_snapshot;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What SGLang calls the load inquirer: reads live scheduler state into a snapshot.
pub trait LoadSource {
    fn collect(&mut self) -> Result<LoadSnapshot, String>;
}

impl<F: FnMut() -> Result<LoadSnapshot, String>> LoadSource for F {
    fn collect(&mut self) -> Result<LoadSnapshot, String> {
        self()
    }
}

/// Default N of "report the first failure, then every Nth".
pub const DEFAULT_REPORT_EVERY: u64 = 1000;

/// Counts the failures of one episode and says when to report.
#[derive(Debug, Clone)]
pub struct FailureThrottle {
    every: u64,
    count: u64,
}

impl FailureThrottle {
    pub fn new(every: u64) -> Self {
        FailureThrottle {
            every: every.max(1),
            count: 0,
        }
    }

    /// Records a failure; returns the episode's count when this one should be reported.
    pub fn failed(&mut self) -> Option<u64> {
        self.count += 1;
        (self.count == 1 || self.count.is_multiple_of(self.every)).then_some(self.count)
    }

    /// A success ends the episode.
    pub fn succeeded(&mut self) {
        self.count = 0;
    }
}

/// Counters of one sink, shared with metrics readers.
#[derive(Debug, Default)]
pub struct SinkStats {
    pub published: AtomicU64,
    pub dropped: AtomicU64,
    pub skipped: AtomicU64,
    pub failed: AtomicU64,
}

/// A report of a failure the throttle let through.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureReport {
    /// `"collect"` or the sink's name.
    pub origin: &'static str,
    /// Whether the failing part serves in-engine consumers (error) or routers (warning).
    pub internal: bool,
    /// Failures so far in this episode.
    pub count: u64,
    pub message: String,
}

fn log_report(r: &FailureReport) {
    if r.internal {
        tracing::error!(
            origin = r.origin,
            count = r.count,
            "load publish failed ({} in a row): {}",
            r.count,
            r.message
        );
    } else {
        tracing::warn!(
            origin = r.origin,
            count = r.count,
            "load publish failed ({} in a row): {}; routers fall back to their in-flight signal",
            r.count,
            r.message
        );
    }
}

struct Slot {
    sink: Box<dyn Sink>,
    calls: u32,
    due: bool,
    throttle: FailureThrottle,
    stats: Arc<SinkStats>,
}

/// Result of one `publish()` call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CycleReport {
    pub collected: bool,
    pub due: usize,
    pub sent: usize,
    pub failed: usize,
}

pub struct Publisher<S: LoadSource> {
    source: S,
    slots: Vec<Slot>,
    buf: Vec<u8>,
    collect_throttle: FailureThrottle,
    collect_failures: Arc<AtomicU64>,
    reporter: Box<dyn FnMut(&FailureReport) + Send>,
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .map_or_else(|| "panicked".into(), |m| format!("panicked: {m}"))
}

impl<S: LoadSource> Publisher<S> {
    /// A publisher over `sinks`, in the order given (put internal sinks first).
    pub fn new(source: S, sinks: Vec<Box<dyn Sink>>) -> Self {
        Self::with_report_every(source, sinks, DEFAULT_REPORT_EVERY)
    }

    pub fn with_report_every(source: S, sinks: Vec<Box<dyn Sink>>, every: u64) -> Self {
        Publisher {
            source,
            slots: sinks
                .into_iter()
                .map(|sink| Slot {
                    sink,
                    calls: 0,
                    due: false,
                    throttle: FailureThrottle::new(every),
                    stats: Arc::default(),
                })
                .collect(),
            buf: Vec::with_capacity(1024),
            collect_throttle: FailureThrottle::new(every),
            collect_failures: Arc::default(),
            reporter: Box::new(log_report),
        }
    }

    /// Replaces the default (tracing) failure reporter.
    pub fn with_reporter(mut self, reporter: impl FnMut(&FailureReport) + Send + 'static) -> Self {
        self.reporter = Box::new(reporter);
        self
    }

    /// `(sink name, counters)` for every sink, for metrics.
    pub fn stats(&self) -> Vec<(&'static str, Arc<SinkStats>)> {
        self.slots
            .iter()
            .map(|s| (s.sink.name(), s.stats.clone()))
            .collect()
    }

    pub fn collect_failures(&self) -> Arc<AtomicU64> {
        self.collect_failures.clone()
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    /// One scheduler cycle. `force` makes every sink due (e.g. on idle or a state change).
    pub fn publish(&mut self, force: bool) -> CycleReport {
        let mut report = CycleReport::default();
        for slot in &mut self.slots {
            slot.calls += 1;
            slot.due = force || slot.calls >= slot.sink.interval();
            if slot.due {
                slot.calls = 0;
                report.due += 1;
            }
        }
        if report.due == 0 {
            return report;
        }
        let snapshot = match catch_unwind(AssertUnwindSafe(|| self.source.collect())) {
            Ok(Ok(s)) => {
                self.collect_throttle.succeeded();
                s
            }
            Ok(Err(e)) => return self.collect_failed(report, e),
            Err(p) => return self.collect_failed(report, panic_message(p)),
        };
        report.collected = true;
        self.buf.clear();
        encode_snapshot(&snapshot, &mut self.buf);
        let encoded = Encoded {
            snapshot: &snapshot,
            bytes: &self.buf,
        };
        for slot in self.slots.iter_mut().filter(|s| s.due) {
            let result = catch_unwind(AssertUnwindSafe(|| slot.sink.write(encoded)));
            let error = match result {
                Ok(Ok(outcome)) => {
                    slot.throttle.succeeded();
                    let counter = match outcome {
                        WriteOutcome::Sent => {
                            report.sent += 1;
                            &slot.stats.published
                        }
                        WriteOutcome::Dropped => &slot.stats.dropped,
                        WriteOutcome::Skipped => &slot.stats.skipped,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Ok(Err(e)) => e.to_string(),
                Err(p) => panic_message(p),
            };
            report.failed += 1;
            slot.stats.failed.fetch_add(1, Ordering::Relaxed);
            if let Some(count) = slot.throttle.failed() {
                (self.reporter)(&FailureReport {
                    origin: slot.sink.name(),
                    internal: slot.sink.internal(),
                    count,
                    message: error,
                });
            }
        }
        report
    }

    fn collect_failed(&mut self, report: CycleReport, message: String) -> CycleReport {
        self.collect_failures.fetch_add(1, Ordering::Relaxed);
        if let Some(count) = self.collect_throttle.failed() {
            (self.reporter)(&FailureReport {
                origin: "collect",
                internal: true,
                count,
                message,
            });
        }
        report
    }

    /// Closes every sink.
    pub fn close(&mut self) {
        self.slots.iter_mut().for_each(|s| s.sink.close());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_reports_first_then_every_nth_and_resets() {
        let mut t = FailureThrottle::new(3);
        let got: Vec<_> = (0..7).map(|_| t.failed()).collect();
        assert_eq!(got, [Some(1), None, Some(3), None, None, Some(6), None]);
        t.succeeded();
        assert_eq!(t.failed(), Some(1));
    }
}
