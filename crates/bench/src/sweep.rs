//! The load sweep of the placement comparison (issue 24): each router variant at each offered load
//! on one workload and seed, reduced to the four figures the acceptance reads: cache hit rate, p50
//! and p99 TTFT, and p99 wait (TTFT minus the request's own prefill on an idle engine). Oracles
//! (simulation only, perfect knowledge) run beside the production policies; the **bound** at a
//! load is, per figure, the best any oracle reached. [`check`] reads the acceptance off the rows:
//! the default policy against the best production policy and the bound, its cliffs between
//! adjacent loads, and any production figure that beats the bound (then the bound is wrong).

use crate::scenario::{Scenario, Variant, arrivals, run_arrivals};
use crate::sim::{SimRouter, quantile};

pub mod recovery;

/// Who produced a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// A policy a router runs.
    Production,
    /// A simulation-only router with perfect knowledge.
    Oracle,
    /// Per figure, the best oracle at that load.
    Bound,
}

/// One variant at one load.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepRow {
    pub load: f64,
    pub label: String,
    pub kind: RowKind,
    /// Prompt tokens served from a cache, of all prompt tokens (0–1).
    pub hit: f64,
    pub p50: f64,
    pub p99: f64,
    pub wait_p99: f64,
    /// p99 TTFT over every request, the cold start included.
    pub p99_whole_run: f64,
    /// The first router's mean utilisation estimate over the engines (`None`: never known).
    pub rho: Option<f64>,
    pub completed: usize,
    pub submitted: usize,
}

impl SweepRow {
    pub fn json(&self) -> serde_json::Value {
        let kind = match self.kind {
            RowKind::Production => "production",
            RowKind::Oracle => "oracle",
            RowKind::Bound => "bound",
        };
        serde_json::json!({ "load": self.load, "label": self.label, "kind": kind, "hit": self.hit, "p50_s": self.p50, "p99_s": self.p99, "wait_p99_s": self.wait_p99, "p99_whole_run_s": self.p99_whole_run, "warmup_s": WARMUP_S, "mean_rho": self.rho, "completed": self.completed, "submitted": self.submitted })
    }
}

/// Seconds at the start of a run left out of a sweep's figures: every run starts with empty
/// caches, and a session workload's first minutes recompute every history (a transient of its own,
/// the same for every router, that [`recovery`]'s burst measures as recovery); the sweep compares
/// routers in the state a load sustains. Two minutes: the longest cold start measured on the
/// sweep's workloads at their knee (agentic, load 0.85: p50 back to steady within 120 s).
pub const WARMUP_S: f64 = 120.0;

/// Whether a variant is an oracle (simulation only) or a production policy.
pub fn kind_of(v: &Variant) -> RowKind {
    match v.router {
        SimRouter::Policy(_) => RowKind::Production,
        _ => RowKind::Oracle,
    }
}

/// The row of one run: figures over the requests arriving after [`WARMUP_S`] (hit rate: over the
/// prompt tokens computed after it), and the whole run's p99 beside them.
pub fn row(
    load: f64,
    v: &Variant,
    o: &crate::sim::Outcome,
    q: &crate::sim::QueueStats,
) -> SweepRow {
    let (ttft, waits) = o.since(WARMUP_S);
    SweepRow {
        load,
        label: v.label.to_string(),
        kind: kind_of(v),
        hit: o.hit_rate_since(WARMUP_S).unwrap_or(0.0),
        p50: quantile(&ttft, 0.5),
        p99: quantile(&ttft, 0.99),
        wait_p99: quantile(&waits, 0.99),
        p99_whole_run: quantile(&o.ttft, 0.99),
        rho: q.mean_utilisation,
        completed: o.completed,
        submitted: o.submitted,
    }
}

/// Runs every variant at every load (each load's arrivals drawn once and shared), on up to
/// `threads` threads; rows in (load, variant) order, followed by each load's bound when oracles
/// ran. `progress` is told each finished run.
pub fn run(
    s: &Scenario,
    seed: u64,
    loads: &[f64],
    variants: &[Variant],
    threads: usize,
    progress: &(dyn Fn(f64, &str) + Sync),
) -> Vec<SweepRow> {
    let mut rows = Vec::new();
    for &load in loads {
        let a = arrivals(s, seed, load);
        let done = par_map(variants, threads, |v| {
            let (o, q) = run_arrivals(s, &a, v);
            progress(load, v.label);
            row(load, v, &o, &q)
        });
        rows.extend(done);
    }
    let bounds = bound(&rows);
    rows.extend(bounds);
    rows
}

/// `f` over `items` on up to `threads` threads (each takes the next item when it is free: the
/// runs differ in length), results in the items' order.
pub fn par_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.clamp(1, items.len().max(1)))
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(k) else {
                            return mine;
                        };
                        mine.push((k, f(item)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a sweep run panicked"))
            .collect()
    });
    done.sort_by_key(|(k, _)| *k);
    done.into_iter().map(|(_, r)| r).collect()
}

/// Per load with oracle rows: the best oracle figure of each kind (most hits, least TTFT and
/// wait), as one `bound` row.
pub fn bound(rows: &[SweepRow]) -> Vec<SweepRow> {
    let mut out: Vec<SweepRow> = Vec::new();
    for r in rows.iter().filter(|r| r.kind == RowKind::Oracle) {
        match out.iter_mut().find(|b| b.load == r.load) {
            Some(b) => {
                b.hit = b.hit.max(r.hit);
                b.p50 = b.p50.min(r.p50);
                b.p99 = b.p99.min(r.p99);
                b.wait_p99 = b.wait_p99.min(r.wait_p99);
            }
            None => out.push(SweepRow {
                label: "bound".into(),
                kind: RowKind::Bound,
                ..r.clone()
            }),
        }
    }
    out
}

/// One way a sweep misses the acceptance.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub load: f64,
    pub what: String,
}

/// Acceptance thresholds (issue 24): against the best production policy, the bound, and the
/// previous load point.
pub const HIT_VS_BEST: f64 = 0.9;
pub const P99_VS_BEST: f64 = 1.1;
pub const WAIT_VS_BOUND: f64 = 1.5;
pub const WAIT_SLACK_S: f64 = 0.020;
pub const MAX_HIT_DROP: f64 = 0.10;
pub const MAX_P50_RISE: f64 = 2.0;

/// Every way the rows miss the acceptance for the policy labelled `default`.
pub fn check(rows: &[SweepRow], default: &str) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut flag = |load: f64, what: String| v.push(Violation { load, what });
    let mut prev: Option<&SweepRow> = None;
    for d in rows.iter().filter(|r| r.label == default) {
        let at = |k: RowKind| rows.iter().filter(move |r| r.load == d.load && r.kind == k);
        let best_hit = at(RowKind::Production).map(|r| r.hit).fold(0.0, f64::max);
        let best_p99 = at(RowKind::Production)
            .map(|r| r.p99)
            .fold(f64::INFINITY, f64::min);
        if d.hit < HIT_VS_BEST * best_hit {
            flag(
                d.load,
                format!(
                    "hit {:.1}% < 0.9 × best {:.1}%",
                    d.hit * 100.0,
                    best_hit * 100.0
                ),
            );
        }
        if d.p99 > P99_VS_BEST * best_p99 {
            flag(
                d.load,
                format!("p99 {:.3}s > 1.1 × best {:.3}s", d.p99, best_p99),
            );
        }
        if let Some(b) = at(RowKind::Bound).next() {
            if d.wait_p99 > WAIT_VS_BOUND * b.wait_p99 + WAIT_SLACK_S {
                flag(
                    d.load,
                    format!(
                        "wait p99 {:.3}s > 1.5 × bound {:.3}s + 20 ms",
                        d.wait_p99, b.wait_p99
                    ),
                );
            }
            for p in at(RowKind::Production) {
                let beaten = [
                    (p.hit > b.hit + 1e-9, "hit"),
                    (p.p50 < b.p50 - 1e-9, "p50"),
                    (p.p99 < b.p99 - 1e-9, "p99"),
                    (p.wait_p99 < b.wait_p99 - 1e-9, "wait p99"),
                ];
                for (_, fig) in beaten.iter().filter(|(yes, _)| *yes) {
                    flag(
                        d.load,
                        format!("bound beaten on {fig} by {}: the bound is wrong", p.label),
                    );
                }
            }
        }
        if let Some(p) = prev {
            if p.hit - d.hit > MAX_HIT_DROP {
                flag(
                    d.load,
                    format!(
                        "cliff: hit {:.1}% → {:.1}% from load {:.2}",
                        p.hit * 100.0,
                        d.hit * 100.0,
                        p.load
                    ),
                );
            }
            if d.p50 > MAX_P50_RISE * p.p50 {
                flag(
                    d.load,
                    format!(
                        "cliff: p50 {:.3}s → {:.3}s from load {:.2}",
                        p.p50, d.p50, p.load
                    ),
                );
            }
        }
        prev = Some(d);
    }
    v
}

/// The largest relative hit loss of `label` between adjacent loads: `(from, to, share lost)`.
pub fn worst_hit_loss(rows: &[SweepRow], label: &str) -> Option<(f64, f64, f64)> {
    let mine: Vec<&SweepRow> = rows.iter().filter(|r| r.label == label).collect();
    mine.windows(2)
        .filter(|w| w[0].hit > 0.0)
        .map(|w| (w[0].load, w[1].load, 1.0 - w[1].hit / w[0].hit))
        .max_by(|a, b| a.2.total_cmp(&b.2))
}

/// The rows as a table, one line per (load, variant).
pub fn table(rows: &[SweepRow]) -> String {
    let mut out = format!(
        "{:<6}{:<34}{:>8}{:>10}{:>10}{:>10}{:>7}{:>14}\n",
        "load", "variant", "hit", "p50", "p99", "wait p99", "ρ", "done"
    );
    let mut loads: Vec<f64> = rows.iter().map(|r| r.load).collect();
    loads.dedup();
    loads.sort_by(f64::total_cmp);
    loads.dedup();
    for l in loads {
        for r in rows.iter().filter(|r| r.load == l) {
            out += &format!(
                "{:<6.2}{:<34}{:>7.1}%{:>9.3}s{:>9.3}s{:>9.3}s{:>7}{:>14}\n",
                r.load,
                r.label,
                r.hit * 100.0,
                r.p50,
                r.p99,
                r.wait_p99,
                r.rho.map_or("-".to_string(), |x| format!("{x:.2}")),
                format!("{}/{}", r.completed, r.submitted)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests;
