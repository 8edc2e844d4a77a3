//! S6: prefill–decode disaggregation. S3's mix (same arrivals, calibrated on 4 schedulers) on
//! 2 prefill + 2 decode engines against 4 aggregated engines of the same hardware (S3's per-engine
//! rates), both behind S3's 2 router replicas with 25% direct traffic. The PD rows vary the prefill
//! policy (`min_ttft`, `cache_aware`, `round_robin`) under the decode policy `decode_load`, and the
//! decode policy (`decode_load`, `round_robin`, least in-flight) under `min_ttft`. What it asks:
//! what does splitting the fleet cost or buy in TTFT and in decode speed (time per output token),
//! how much of the cache reuse survives on half as many prefill engines, and how long KV waits
//! for its link.

use super::{CACHE_VARIANTS, Scenario, Variant, arrivals, sim_config};
use crate::report::{Row, row_json};
use crate::sim::{
    DecodePolicy, KvLink, Outcome, PdFleet, SimConfig, quantile, simulate_with_queues,
};
use crate::workload::Arrival;
use loadlink_router::{LoadSignal, Policy};
use serde_json::{Value, json};
use std::fmt::Write;

/// Prefill engines of S6's PD fleet (the rest of its 4 engines decode).
pub const PREFILL_ENGINES: usize = 2;

/// S6's engines, either fleet (S3's).
pub const ENGINES: usize = 4;

/// One S6 row: the fleet (aggregated, or PD with its decode policy) and the (prefill) router.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PdVariant {
    /// `None`: 4 aggregated engines; else the PD fleet's decode policy.
    pub decode: Option<DecodePolicy>,
    /// The router of the aggregated fleet, or of the PD fleet's prefill side.
    pub router: Variant,
    /// The decode engines' `max_running_requests` (`None`: the scenario's, as every engine's).
    pub decode_batch: Option<usize>,
    /// Prefill engines of a PD fleet (the rest of the scenario's engines decode).
    pub prefill: usize,
}

impl PdVariant {
    /// `aggregated 4`, `PD 2P+2D`, or `PD 2P+2D b128` for a decode batch of its own.
    pub fn fleet_label(&self) -> String {
        let split = format!("PD {}P+{}D", self.prefill, ENGINES - self.prefill);
        match (self.decode, self.decode_batch) {
            (None, _) => format!("aggregated {ENGINES}"),
            (Some(_), None) => split,
            (Some(_), Some(b)) => format!("{split} b{b}"),
        }
    }

    /// The decode policy's label (`-` when aggregated).
    pub fn decode_label(&self) -> String {
        self.decode.map_or_else(|| "-".into(), DecodePolicy::label)
    }

    /// `PD 2P+2D: min_ttft / kv-index + decode_load`.
    pub fn label(&self) -> String {
        match self.decode {
            None => format!("{}: {}", self.fleet_label(), self.router.label),
            Some(_) => format!(
                "{}: {} + {}",
                self.fleet_label(),
                self.router.label,
                self.decode_label()
            ),
        }
    }
}

/// `loadlink route`'s default router (`min_ttft` on the KV index), and the prefill default of
/// `loadlink route --pd`.
pub const DEFAULT_ROUTER: &str = "min_ttft / kv-index";

/// The prefill (and aggregated) routers S6 compares.
const ROUTERS: [&str; 3] = [DEFAULT_ROUTER, "cache_aware / inflight", "round_robin"];

/// Least in-flight: the production `least_load` policy on this router's in-flight counts.
pub const LEAST_INFLIGHT: DecodePolicy =
    DecodePolicy::Policy(Policy::LeastLoad, LoadSignal::Inflight);

/// The decode policies S6 compares under the default prefill router.
pub const DECODE_POLICIES: [DecodePolicy; 3] = [
    DecodePolicy::DecodeLoad,
    DecodePolicy::Policy(Policy::RoundRobin, LoadSignal::Inflight),
    LEAST_INFLIGHT,
];

fn router(label: &str) -> Variant {
    *CACHE_VARIANTS
        .iter()
        .find(|v| v.label == label)
        .expect("S6 compares routers of CACHE_VARIANTS")
}

/// A decode engine's batch when it may use its KV pool for decoding alone: twice the scenario's
/// (S3's engines hold about 150 of its requests in KV).
pub const WIDE_DECODE_BATCH: usize = 128;

/// Every S6 row: each router on the aggregated fleet; each prefill router with `decode_load`; the
/// other decode policies with the default prefill router; then the default pair on decode engines
/// of [`WIDE_DECODE_BATCH`], and on 1 prefill + 3 decode engines (S3's mix asks about 2.4 times
/// more decode time than prefill time of an engine).
pub fn variants() -> Vec<PdVariant> {
    let row = |decode, label: &str| PdVariant {
        decode,
        router: router(label),
        decode_batch: None,
        prefill: PREFILL_ENGINES,
    };
    let aggregated = ROUTERS.iter().map(|l| row(None, l));
    let prefill = ROUTERS
        .iter()
        .map(|l| row(Some(DecodePolicy::DecodeLoad), l));
    let decode = DECODE_POLICIES[1..]
        .iter()
        .map(|&d| row(Some(d), DEFAULT_ROUTER));
    let wide = PdVariant {
        decode_batch: Some(WIDE_DECODE_BATCH),
        ..row(Some(DecodePolicy::DecodeLoad), DEFAULT_ROUTER)
    };
    let one_prefill = PdVariant {
        prefill: 1,
        ..row(Some(DecodePolicy::DecodeLoad), DEFAULT_ROUTER)
    };
    aggregated
        .chain(prefill)
        .chain(decode)
        .chain([wide, one_prefill])
        .collect()
}

/// The simulator's configuration for `v`: the scenario's 4 engines, aggregated or split into
/// the variant's prefill engines and decode engines of the scenario's model (a decode batch
/// of the variant's own), joined by links of `link`.
pub fn pd_config(s: &Scenario, v: &PdVariant, link: KvLink) -> SimConfig {
    let mut cfg = sim_config(s, &v.router, None);
    if let Some(decode_policy) = v.decode {
        for m in &mut cfg.engines[v.prefill..] {
            m.max_running_requests = v.decode_batch.unwrap_or(m.max_running_requests);
        }
        cfg.pd = Some(PdFleet {
            prefill: v.prefill,
            decode_policy,
            link,
        });
    }
    cfg
}

/// Runs `v` on given arrivals (generate them once, from the scenario, for every row).
pub fn run_pd_variant(s: &Scenario, arrivals: &[Arrival], v: &PdVariant, link: KvLink) -> Outcome {
    simulate_with_queues(&pd_config(s, v, link), arrivals, s.duration_s * 4.0).0
}

/// One measured S6 row.
pub struct PdRow {
    pub variant: PdVariant,
    pub load: f64,
    pub outcome: Outcome,
}

/// Every S6 row on one seed; `progress` hears each row's label before it runs.
pub fn comparison(
    s: &Scenario,
    seed: u64,
    load: f64,
    link: KvLink,
    mut progress: impl FnMut(&str),
) -> Vec<PdRow> {
    let arrivals = arrivals(s, seed, load);
    variants()
        .into_iter()
        .map(|v| {
            progress(&v.label());
            PdRow {
                variant: v,
                load,
                outcome: run_pd_variant(s, &arrivals, &v, link),
            }
        })
        .collect()
}

/// The rows as JSON: each row's usual figures, its fleet and decode policy, time per output token
/// and the transfer waits.
pub fn rows_json(rows: &[PdRow]) -> Vec<Value> {
    rows.iter()
        .map(|r| {
            let o = &r.outcome;
            let mut j = row_json(&Row {
                label: r.variant.router.label.to_string(),
                load: r.load,
                outcome: o.clone(),
            });
            let waits = o.transfer_waits();
            j["fleet"] = json!(r.variant.fleet_label());
            j["decode_policy"] = json!(r.variant.decode.map(DecodePolicy::label));
            j["transfer_wait_p50_s"] = json!((!waits.is_empty()).then(|| quantile(&waits, 0.5)));
            j["transfer_wait_p99_s"] = json!((!waits.is_empty()).then(|| quantile(&waits, 0.99)));
            j
        })
        .collect()
}

/// Milliseconds, or `-` for an empty sample.
fn ms(v: &[f64], p: f64) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        format!("{:.1}ms", quantile(v, p) * 1e3)
    }
}

/// The rows as a table.
pub fn table(rows: &[PdRow]) -> String {
    let mut s = format!(
        "{:<17} {:<23} {:<15} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}\n",
        "fleet",
        "router (prefill)",
        "decode",
        "TTFT p50",
        "TTFT p99",
        "cache hit",
        "TPOT p50",
        "TPOT p99",
        "xfer p50",
        "xfer p99",
        "req/s"
    );
    for r in rows {
        let o = &r.outcome;
        let waits = o.transfer_waits();
        let _ = writeln!(
            s,
            "{:<17} {:<23} {:<15} {:>8.3}s {:>8.3}s {:>8.1}% {:>9} {:>9} {:>9} {:>9} {:>7.2}",
            r.variant.fleet_label(),
            r.variant.router.label,
            r.variant.decode_label(),
            quantile(&o.ttft, 0.5),
            quantile(&o.ttft, 0.99),
            o.cache_hit_rate().unwrap_or(0.0) * 100.0,
            ms(&o.tpot, 0.5),
            ms(&o.tpot, 0.99),
            ms(&waits, 0.5),
            ms(&waits, 0.99),
            o.completed as f64 / o.makespan.max(1e-9),
        );
    }
    s
}

/// A live S6 run's rows: TTFT, the prefill engines' cache hit rate and time per output token.
pub fn live_table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<40} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}\n",
        "router", "TTFT p50", "TTFT p99", "cache hit", "TPOT p50", "TPOT p99", "completed"
    );
    for r in rows {
        let o = &r.outcome;
        let hit = o
            .cache_hit_rate()
            .map_or_else(|| "?".into(), |h| format!("{:.1}%", h * 100.0));
        let _ = writeln!(
            s,
            "{:<40} {:>8.3}s {:>8.3}s {:>9} {:>9} {:>9} {:>5}/{:<4}",
            r.label,
            quantile(&o.ttft, 0.5),
            quantile(&o.ttft, 0.99),
            hit,
            ms(&o.tpot, 0.5),
            ms(&o.tpot, 0.99),
            o.completed,
            o.submitted,
        );
    }
    s
}

#[cfg(test)]
mod tests;
