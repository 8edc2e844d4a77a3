//! S5: DP ranks as routing targets. The same 8 schedulers and the same arrivals (S3's mix,
//! calibrated on 8 schedulers) as 8 one-rank engines and as 2 engines of 4 DP ranks; on 2 × 4 the
//! routers either route each rank as a candidate or send to the engine and let its dispatcher pick
//! a rank by load alone (rank-blind). What the comparison asks: does routing ranks keep the reuse
//! and the tail of the 8 × 1 fleet, and what does rank-blind routing lose?

use super::{CACHE_VARIANTS, Scenario, Variant, arrivals, sim_config};
use crate::report::{Row, row_json};
use crate::sim::{Outcome, QueueStats, RankRouting, SimConfig, quantile, simulate_with_queues};
use crate::workload::Arrival;
use serde_json::{Value, json};
use std::fmt::Write;

/// A fleet shape: `engines` engines of `ranks` DP ranks each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fleet {
    pub engines: usize,
    pub ranks: usize,
}

impl Fleet {
    pub fn label(self) -> String {
        format!("{}×{}", self.engines, self.ranks)
    }
}

/// The two shapes of S5's 8 schedulers.
pub const ONE_RANK: Fleet = Fleet {
    engines: 8,
    ranks: 1,
};
pub const FOUR_RANKS: Fleet = Fleet {
    engines: 2,
    ranks: 4,
};

/// One S5 row: a fleet shape, whether ranks are routed, and the router.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankVariant {
    pub fleet: Fleet,
    pub routing: RankRouting,
    pub router: Variant,
}

impl RankVariant {
    /// `2×4 rank-aware` (a one-rank fleet has nothing to route: `8×1`).
    pub fn fleet_label(&self) -> String {
        match self.fleet.ranks {
            1 => self.fleet.label(),
            _ => format!("{} {}", self.fleet.label(), self.routing.as_str()),
        }
    }

    /// `2×4 rank-aware: min_ttft / kv-index`.
    pub fn label(&self) -> String {
        format!("{}: {}", self.fleet_label(), self.router.label)
    }
}

/// The router of the acceptance bounds: `loadlink route`'s default (`min_ttft` on the KV index).
pub const DEFAULT_ROUTER: &str = "min_ttft / kv-index";

/// The routers S5 compares: S3's cache-blind baselines and `min_ttft` on either cache view. (The
/// clairvoyant bound is left out: it addresses every scheduler directly, so it does not depend on
/// the fleet's shape, and its forward simulations cost most of a run.)
const ROUTERS: [&str; 4] = [
    "round_robin",
    "power_of_two / backlog",
    "min_ttft / approx",
    DEFAULT_ROUTER,
];

fn router(label: &str) -> Variant {
    *CACHE_VARIANTS
        .iter()
        .find(|v| v.label == label)
        .expect("S5 compares routers of CACHE_VARIANTS")
}

/// Every S5 row: each router on 8 × 1, on 2 × 4 routed per rank, and on 2 × 4 routed whole.
pub fn variants() -> Vec<RankVariant> {
    let shapes = [
        (ONE_RANK, RankRouting::PerRank),
        (FOUR_RANKS, RankRouting::PerRank),
        (FOUR_RANKS, RankRouting::Whole),
    ];
    shapes
        .iter()
        .flat_map(|&(fleet, routing)| {
            ROUTERS.iter().map(move |l| RankVariant {
                fleet,
                routing,
                router: router(l),
            })
        })
        .collect()
}

/// The simulator's configuration for `v`: the scenario's, on `v`'s fleet shape.
pub fn rank_config(s: &Scenario, v: &RankVariant) -> SimConfig {
    let fleet = Scenario {
        engines: v.fleet.engines,
        ranks: v.fleet.ranks,
        ..s.clone()
    };
    SimConfig {
        rank_routing: v.routing,
        ..sim_config(&fleet, &v.router, None)
    }
}

/// Runs `v` on given arrivals (generate them once, from the scenario, for every row).
pub fn run_rank_variant(
    s: &Scenario,
    arrivals: &[Arrival],
    v: &RankVariant,
) -> (Outcome, QueueStats) {
    simulate_with_queues(&rank_config(s, v), arrivals, s.duration_s * 4.0)
}

/// One measured S5 row.
pub struct RankRow {
    pub variant: RankVariant,
    pub load: f64,
    pub outcome: Outcome,
    pub queues: QueueStats,
}

/// Every S5 row on one seed; `progress` hears each row's label before it runs.
pub fn comparison(
    s: &Scenario,
    seed: u64,
    load: f64,
    mut progress: impl FnMut(&str),
) -> Vec<RankRow> {
    let arrivals = arrivals(s, seed, load);
    variants()
        .into_iter()
        .map(|v| {
            progress(&v.label());
            let (outcome, queues) = run_rank_variant(s, &arrivals, &v);
            RankRow {
                variant: v,
                load,
                outcome,
                queues,
            }
        })
        .collect()
}

fn hit(o: &Outcome) -> f64 {
    o.cache_hit_rate().unwrap_or(0.0)
}

fn p99(o: &Outcome) -> f64 {
    quantile(&o.ttft, 0.99)
}

/// The rows as JSON: each row's usual figures, its fleet and routing, and the queue figures.
pub fn rows_json(rows: &[RankRow]) -> Vec<Value> {
    rows.iter()
        .map(|r| {
            let mut j = row_json(&Row {
                label: r.variant.router.label.to_string(),
                load: r.load,
                outcome: r.outcome.clone(),
            });
            j["fleet"] = json!(r.variant.fleet.label());
            j["engines"] = json!(r.variant.fleet.engines);
            j["ranks"] = json!(r.variant.fleet.ranks);
            j["rank_routing"] = json!(r.variant.routing.as_str());
            j["queue_hot_fraction"] = json!(r.queues.hot_fraction);
            j["queue_hot_longest_s"] = json!(r.queues.hot_longest_s);
            j
        })
        .collect()
}

/// The rows as a table.
pub fn table(rows: &[RankRow]) -> String {
    let mut s = format!(
        "{:<18} {:<24} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>8}\n",
        "fleet",
        "variant",
        "TTFT p50",
        "TTFT p99",
        "wait p99",
        "cache hit",
        "req/s",
        "queue CV",
        "hot q %"
    );
    for r in rows {
        let o = &r.outcome;
        let _ = writeln!(
            s,
            "{:<18} {:<24} {:>8.3}s {:>8.3}s {:>8.3}s {:>8.1}% {:>8.2} {:>9.3} {:>7.1}%",
            r.variant.fleet_label(),
            r.variant.router.label,
            quantile(&o.ttft, 0.5),
            p99(o),
            quantile(&o.waits(), 0.99),
            hit(o) * 100.0,
            o.completed as f64 / o.makespan.max(1e-9),
            o.queue_cv,
            r.queues.hot_fraction * 100.0,
        );
    }
    s
}

/// The acceptance figures of the default router: each 2 × 4 row's hit rate and TTFT p99 as a
/// multiple of the 8 × 1 row's, with the bounds (rank-aware: ≥ 0.95× the hit rate, ≤ 1.05× the
/// p99); rank-blind for contrast.
pub fn acceptance(rows: &[RankRow]) -> String {
    let by = |fleet: Fleet, routing: RankRouting| {
        rows.iter().find(|r| {
            r.variant.router.label == DEFAULT_ROUTER
                && r.variant.fleet == fleet
                && (fleet.ranks == 1 || r.variant.routing == routing)
        })
    };
    let Some(base) = by(ONE_RANK, RankRouting::PerRank) else {
        return String::new();
    };
    let mut s = String::new();
    for routing in [RankRouting::PerRank, RankRouting::Whole] {
        let Some(r) = by(FOUR_RANKS, routing) else {
            continue;
        };
        let (h, p) = (
            hit(&r.outcome) / hit(&base.outcome),
            p99(&r.outcome) / p99(&base.outcome),
        );
        let verdict = match routing {
            RankRouting::PerRank if h >= 0.95 && p <= 1.05 => "within the bounds",
            RankRouting::PerRank => "OUTSIDE the bounds (hit ≥ 0.95×, p99 ≤ 1.05×)",
            RankRouting::Whole => "for contrast",
        };
        let _ = writeln!(
            s,
            "{DEFAULT_ROUTER}, {}: cache hit {:.3}× and TTFT p99 {:.3}× those of 8×1: {verdict}",
            r.variant.fleet_label(),
            h,
            p
        );
    }
    s
}

#[cfg(test)]
mod tests;
