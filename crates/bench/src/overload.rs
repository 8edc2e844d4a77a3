//! Overload evidence (issue 15, admission control): a scenario offered more than its fleet
//! sustains, routed by `min_ttft` with and without the router's admission control, measured as
//! **goodput** (requests whose first token came within a TTFT budget, per second of the run) and
//! the TTFT of the requests that were admitted. Without admission every request is forwarded and
//! the queues grow for as long as the overload lasts; with it, routed requests beyond what the
//! fleet can serve within the cap are refused (429 at once, or after a bounded wait in the FIFO),
//! so those admitted keep a short queue. Direct traffic bypasses the routers and is never refused.
//!
//! The admission rule is production's (`sim/admission.rs`); the caps are the router's flags.

use crate::scenario::{self, MIN_TTFT, Scenario, Variant};
use crate::sim::{CacheView, Outcome, QueueStats, SimRouter, quantile};
use crate::workload::Arrival;
use loadlink_router::admission::{AdmissionConfig, Overload};
use loadlink_router::{LoadSignal, Policy};

/// The caps and the budget of one overload comparison (the router flags of the same names).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverloadParams {
    /// A request counts towards goodput when its TTFT is at most this.
    pub ttft_budget_ms: u64,
    /// `--max-predicted-wait-ms` of the admission variants.
    pub max_predicted_wait_ms: u64,
    /// `--max-engine-requests` of an extra reject variant, if given.
    pub max_engine_requests: Option<i64>,
    /// Also the predicted-wait variants with `--admission-spare-running`.
    pub spare_running: bool,
    /// `--admission-queue-size` (per router replica).
    pub queue_size: usize,
    /// `--admission-queue-timeout-ms`.
    pub queue_timeout_ms: u64,
    /// How many times a client sends a refused request again, after its `Retry-After`
    /// (`SimConfig::client_retries`; 0: it gives up at the first 429).
    pub client_retries: u32,
}

impl Default for OverloadParams {
    fn default() -> Self {
        OverloadParams {
            ttft_budget_ms: 1000,
            max_predicted_wait_ms: 500,
            max_engine_requests: None,
            spare_running: false,
            queue_size: 32,
            queue_timeout_ms: 500,
            client_retries: 0,
        }
    }
}

/// One row: a router and its admission settings.
#[derive(Debug, Clone)]
pub struct OverloadVariant {
    pub label: String,
    pub router: Variant,
    pub admission: Option<AdmissionConfig>,
}

const P2C_BACKLOG: Variant = Variant {
    label: "power_of_two / backlog",
    router: SimRouter::Policy(Policy::PowerOfTwo),
    signal: LoadSignal::Backlog,
    cache: CacheView::Blind,
};

const MIN_TTFT_INDEX: Variant = Variant {
    label: "min_ttft",
    router: SimRouter::Policy(MIN_TTFT),
    signal: LoadSignal::Backlog,
    cache: CacheView::Index,
};

/// Backlog P2C and `min_ttft` without admission; `min_ttft` with a predicted-wait cap in reject
/// and queue mode; with `max_engine_requests`, also a reject variant on that cap; with
/// `spare_running`, the two predicted-wait variants again, sparing running sessions.
pub fn variants(p: &OverloadParams) -> Vec<OverloadVariant> {
    let wait = AdmissionConfig {
        max_predicted_wait_ms: Some(p.max_predicted_wait_ms),
        ..Default::default()
    };
    let w = p.max_predicted_wait_ms;
    let queue = Overload::Queue {
        size: p.queue_size,
        timeout_ms: p.queue_timeout_ms,
    };
    let mut v = vec![
        OverloadVariant {
            label: "power_of_two / backlog, no admission".into(),
            router: P2C_BACKLOG,
            admission: None,
        },
        OverloadVariant {
            label: "min_ttft, no admission".into(),
            router: MIN_TTFT_INDEX,
            admission: None,
        },
        OverloadVariant {
            label: format!("min_ttft, reject, predicted wait ≤ {w} ms"),
            router: MIN_TTFT_INDEX,
            admission: Some(wait),
        },
        OverloadVariant {
            label: format!(
                "min_ttft, queue {} / {} ms, predicted wait ≤ {w} ms",
                p.queue_size, p.queue_timeout_ms
            ),
            router: MIN_TTFT_INDEX,
            admission: Some(AdmissionConfig {
                overload: queue,
                ..wait
            }),
        },
    ];
    if let Some(n) = p.max_engine_requests {
        v.push(OverloadVariant {
            label: format!("min_ttft, reject, --max-engine-requests {n}"),
            router: MIN_TTFT_INDEX,
            admission: Some(AdmissionConfig {
                max_engine_requests: Some(n),
                ..Default::default()
            }),
        });
    }
    if p.spare_running {
        let spared: Vec<_> = v[2..4]
            .iter()
            .map(|o| OverloadVariant {
                label: format!("{}, running sessions spared", o.label),
                router: o.router,
                admission: o.admission.map(|a| AdmissionConfig {
                    spare_running: true,
                    ..a
                }),
            })
            .collect();
        v.extend(spared);
    }
    v
}

/// What one overload variant measured.
#[derive(Debug, Clone)]
pub struct OverloadRow {
    pub label: String,
    pub offered: usize,
    pub outcome: Outcome,
    pub queues: QueueStats,
    /// Completed requests with TTFT within the budget, per second of the run (from the first
    /// arrival to the last completion, which without admission is long after the last arrival).
    pub goodput_rps: f64,
    /// Completed requests per second of the run.
    pub throughput_rps: f64,
}

/// Runs every variant on the same arrivals.
pub fn compare(
    s: &Scenario,
    arrivals: &[Arrival],
    p: &OverloadParams,
    mut progress: impl FnMut(&str),
) -> Vec<OverloadRow> {
    let budget_s = p.ttft_budget_ms as f64 / 1e3;
    variants(p)
        .into_iter()
        .map(|v| {
            progress(&v.label);
            let (outcome, queues) =
                scenario::run_admitted(s, arrivals, &v.router, (v.admission, p.client_retries));
            let good = outcome.ttft.iter().filter(|&&t| t <= budget_s).count();
            let run_s = outcome.makespan.max(s.duration_s);
            OverloadRow {
                label: v.label,
                offered: arrivals.len(),
                goodput_rps: good as f64 / run_s,
                throughput_rps: outcome.completed as f64 / run_s,
                outcome,
                queues,
            }
        })
        .collect()
}

/// The comparison as a fixed-width table.
pub fn table(rows: &[OverloadRow], p: &OverloadParams) -> String {
    let mut t = format!(
        "{:<52} {:>8} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9}\n",
        "variant",
        "retried",
        "rejected",
        "abandoned",
        "req/s",
        format!("good ≤{}ms", p.ttft_budget_ms),
        "TTFT p50",
        "TTFT p90",
        "TTFT p99",
        "queue CV"
    );
    for r in rows {
        let o = &r.outcome;
        t += &format!(
            "{:<52} {:>7.1}% {:>7.1}% {:>8.1}% {:>9.2} {:>10.2} {:>8.3}s {:>8.3}s {:>8.3}s {:>9.2}\n",
            r.label,
            100.0 * o.retried as f64 / r.offered.max(1) as f64,
            100.0 * o.rejected as f64 / r.offered.max(1) as f64,
            100.0 * o.abandoned as f64 / r.offered.max(1) as f64,
            r.throughput_rps,
            r.goodput_rps,
            quantile(&o.ttft, 0.5),
            quantile(&o.ttft, 0.9),
            quantile(&o.ttft, 0.99),
            o.queue_cv
        );
    }
    t
}

/// The rows as JSON (no per-request samples).
pub fn rows_json(rows: &[OverloadRow]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            let o = &r.outcome;
            serde_json::json!({
                "makespan_s": o.makespan,
                "variant": r.label,
                "offered": r.offered,
                "sent": o.submitted,
                "retried": o.retried,
                "rejected": o.rejected,
                "abandoned": o.abandoned,
                "completed": o.completed,
                "throughput_rps": r.throughput_rps,
                "goodput_rps": r.goodput_rps,
                "ttft_p50_s": quantile(&o.ttft, 0.5),
                "ttft_p90_s": quantile(&o.ttft, 0.9),
                "ttft_p99_s": quantile(&o.ttft, 0.99),
                "wait_p99_s": quantile(&o.waits(), 0.99),
                "queue_cv": o.queue_cv,
                "queue_hot_fraction": r.queues.hot_fraction,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// S0 (one router, no direct traffic) at 150% for 60 s: without admission the queue grows and
    /// the tail goes past the cap; a predicted-wait cap rejects some requests and keeps the
    /// admitted ones' p99 TTFT near it.
    #[test]
    fn a_predicted_wait_cap_rejects_under_overload_and_bounds_the_admitted_tail() {
        let mut s = scenario::by_name("s0").unwrap();
        s.duration_s = 60.0;
        let arrivals = scenario::arrivals(&s, 3, 1.5);
        let p = OverloadParams::default();
        let rows = compare(&s, &arrivals, &p, |_| {});
        let by = |prefix: &str| rows.iter().find(|r| r.label.starts_with(prefix)).unwrap();
        let open = by("min_ttft, no admission");
        let reject = by("min_ttft, reject");
        let queue = by("min_ttft, queue");
        assert_eq!(open.outcome.rejected, 0);
        assert_eq!(open.outcome.completed, arrivals.len());
        let p99 = |r: &OverloadRow| quantile(&r.outcome.ttft, 0.99);
        assert!(p99(open) > 2.0, "open p99 {}", p99(open));
        for r in [reject, queue] {
            let o = &r.outcome;
            assert!(o.rejected > 0, "{}", r.label);
            assert_eq!(o.completed + o.rejected, arrivals.len(), "{}", r.label);
            assert!(p99(r) < 1.0, "{}: p99 {}", r.label, p99(r));
            assert!(r.goodput_rps > open.goodput_rps, "{}", r.label);
        }
        // Some requests refused on arrival were admitted from the queue when room came.
        assert!(
            queue.outcome.rejected < reject.outcome.rejected,
            "queue {} vs reject {}",
            queue.outcome.rejected,
            reject.outcome.rejected
        );
    }

    /// The same overload with clients that send a refused request again after its `Retry-After`
    /// (at least 1 s), twice at most: fewer requests are refused for good, each refused one
    /// tried three times, and a request that completed after a retry has its TTFT counted from
    /// its first try, so it is at least a second.
    #[test]
    fn refused_clients_retry_after_retry_after_and_their_ttft_counts_from_the_first_try() {
        let mut s = scenario::by_name("s0").unwrap();
        s.duration_s = 60.0;
        let arrivals = scenario::arrivals(&s, 3, 1.5);
        let reject = &variants(&OverloadParams::default())[2];
        assert!(reject.label.starts_with("min_ttft, reject"));
        let run = |retries| {
            scenario::run_admitted(&s, &arrivals, &reject.router, (reject.admission, retries)).0
        };
        let (once, thrice) = (run(0), run(2));
        assert_eq!(once.retried, 0);
        assert!(
            thrice.rejected < once.rejected,
            "{} vs {}",
            thrice.rejected,
            once.rejected
        );
        assert_eq!(thrice.completed + thrice.rejected, arrivals.len());
        // Every request refused for good used both retries; the rest of the retries led to a
        // completion, at most two per request.
        let retried_then_served = thrice.retried - 2 * thrice.rejected;
        assert!(retried_then_served > 0, "some retries were served");
        let slow = thrice.ttft.iter().filter(|&&t| t >= 1.0).count();
        assert!(
            slow >= retried_then_served.div_ceil(2),
            "{slow} requests at ≥ 1 s, {retried_then_served} retries served"
        );
    }
}
