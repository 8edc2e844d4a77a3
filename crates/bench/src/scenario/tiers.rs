//! The host-tier scenario (`bench sim --scenario tiers`): chat sessions that go idle long enough
//! for their device pages to be evicted, then come back. Engines with a host tier (HiCache) keep
//! those pages on the host and load them back; the question is how a router should price such a
//! hit. Three fleets on the same arrivals:
//!
//! * **no host tier**: today's engine; an evicted session is recomputed wherever it goes;
//! * **host tier, miss**: `min_ttft` on the KV index, pricing a host-tier hit as a miss (as a
//!   router that indexes the device tier only believes: the complaint of SGLang #39108);
//! * **host tier, tier-blind**: the same, pricing it as free (as a router that records `medium`
//!   but ignores it does);
//! * **host tier, tier-aware**: the same, pricing it at its load-back time;
//! * `cache_aware` on the index (which counts any-tier hits as hits) for reference;
//! * and a **slow host tier** (a disk or remote tier: 15k tokens/s, hardly faster than the 10k
//!   tokens/s prefill), tier-blind and tier-aware, where a free host hit is furthest from the
//!   truth.
//!
//! Reported: the hit rate per tier (device hits, host-tier hits loaded back), and TTFT.

use super::{MIN_TTFT, Scenario, Variant, Workload, arrivals, run_arrivals, variant};
use crate::report::Row;
use crate::report::row_json;
use crate::sim::{CacheView, Outcome, SimRouter, quantile};
use crate::workload::{ChatSessions, Len, Shape};
use loadlink_engine::PublishPoint;
use loadlink_engine::host_tier::{DEFAULT_LOAD_TOKENS_PER_S, HostTierConfig};
use loadlink_engine::model::ModelConfig;
use loadlink_router::policy::{CacheAware, MinTtft, TierPricing};
use loadlink_router::{LoadSignal, Policy};
use serde_json::{Value, json};
use std::fmt::Write;

/// Device KV per engine, tokens (the simulated engine's default): a full running batch and some
/// of the idle sessions; at this load about 500 sessions are alive, some 450k tokens per engine.
pub const DEVICE_TOKENS: u64 = 200_000;
/// Host KV per engine, tokens: enough for every idle session (HiCache's default host pool is
/// twice the device pool, `--hicache-ratio 2`; hosts with room run larger ones).
pub const HOST_TOKENS: u64 = 4 * DEVICE_TOKENS;

/// The scenario: 4 engines with a host tier, 1 router, no direct traffic; chat sessions with a
/// long system prompt, 6 turns, a minute of idleness between turns on average.
pub fn scenario() -> Scenario {
    let model = ModelConfig {
        max_running_requests: 64,
        max_total_tokens: DEVICE_TOKENS,
        host_tier: HostTierConfig {
            tokens: HOST_TOKENS,
            ..HostTierConfig::default()
        },
        ..ModelConfig::default()
    };
    Scenario {
        name: "tiers",
        about: "4 engines with a host KV tier, 1 router, chat sessions (2k-token system prompt, 6 \
                turns, 60 s mean idle between turns) whose device pages are evicted while idle; \
                70% of cache-blind capacity",
        engines: 4,
        ranks: 1,
        routers: 1,
        direct_fraction: 0.0,
        direct: crate::sim::DirectTarget::Uniform,
        load: 0.7,
        duration_s: 600.0,
        model,
        publish_point: PublishPoint::default(),
        workload: Workload::Prefix(vec![(
            1.0,
            Shape::Chat(ChatSessions {
                turns: 6,
                system: Len::new(2048.0, 0.3),
                user: Len::new(128.0, 0.6),
                think_mean_s: 60.0,
                ..ChatSessions::default()
            }),
        )]),
        delivery: crate::sim::LoadDelivery::Push,
    }
}

const fn min_ttft(tier_pricing: TierPricing) -> Policy {
    let Policy::MinTtft(p) = MIN_TTFT else {
        unreachable!()
    };
    Policy::MinTtft(MinTtft { tier_pricing, ..p })
}

/// A slow host tier's load-back rate, tokens/s (a disk or remote tier).
pub const SLOW_LOAD_TOKENS_PER_S: f64 = 15_000.0;

/// One row: the engines' host tier (`None`: none; else its load rate, which the router knows as
/// if advertised), and the router.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierVariant {
    pub host_tier: Option<f64>,
    pub router: Variant,
}

impl TierVariant {
    pub fn label(&self) -> String {
        let fleet = match self.host_tier {
            None => "no host tier".to_string(),
            Some(r) if r == DEFAULT_LOAD_TOKENS_PER_S => "host tier".to_string(),
            Some(r) => format!("slow host tier ({}k/s)", r / 1e3),
        };
        format!("{fleet} · {}", self.router.label)
    }
}

const fn row(host_tier: Option<f64>, label: &'static str, policy: Policy) -> TierVariant {
    let policy = match (policy, host_tier) {
        (Policy::MinTtft(p), Some(rate)) => Policy::MinTtft(MinTtft {
            host_load_tokens_per_s: rate,
            ..p
        }),
        (p, _) => p,
    };
    TierVariant {
        host_tier,
        router: variant(
            label,
            SimRouter::Policy(policy),
            LoadSignal::Backlog,
            CacheView::Index,
        ),
    }
}

const FAST: Option<f64> = Some(DEFAULT_LOAD_TOKENS_PER_S);
const SLOW: Option<f64> = Some(SLOW_LOAD_TOKENS_PER_S);

/// The comparison's rows, in report order.
pub const TIER_VARIANTS: [TierVariant; 7] = [
    row(None, "min_ttft", MIN_TTFT),
    row(
        FAST,
        "cache_aware",
        Policy::CacheAware(CacheAware {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
        }),
    ),
    row(FAST, "min_ttft miss", min_ttft(TierPricing::Miss)),
    row(FAST, "min_ttft tier-blind", min_ttft(TierPricing::Blind)),
    row(FAST, "min_ttft tier-aware", min_ttft(TierPricing::Aware)),
    row(SLOW, "min_ttft tier-blind", min_ttft(TierPricing::Blind)),
    row(SLOW, "min_ttft tier-aware", min_ttft(TierPricing::Aware)),
];

/// One row's result.
pub struct TierRow {
    pub variant: TierVariant,
    pub outcome: Outcome,
}

/// Every row of [`TIER_VARIANTS`] on the same arrivals (calibrated on the fleet as given);
/// `progress` hears each row's label before it runs.
pub fn comparison(s: &Scenario, seed: u64, load: f64, progress: impl Fn(&str)) -> Vec<TierRow> {
    rows_of(&TIER_VARIANTS, s, seed, load, progress)
}

/// [`comparison`] of the rows `variants`.
pub fn rows_of(
    variants: &[TierVariant],
    s: &Scenario,
    seed: u64,
    load: f64,
    progress: impl Fn(&str),
) -> Vec<TierRow> {
    let arrivals = arrivals(s, seed, load);
    variants
        .iter()
        .map(|&v| {
            progress(&v.label());
            let mut fleet = s.clone();
            match v.host_tier {
                None => fleet.model.host_tier.tokens = 0,
                Some(rate) => fleet.model.host_tier.load_tokens_per_s = rate,
            }
            let (outcome, _) = run_arrivals(&fleet, &arrivals, &v.router);
            TierRow {
                variant: v,
                outcome,
            }
        })
        .collect()
}

/// The table: hit rate per tier and TTFT per row.
pub fn table(rows: &[TierRow]) -> String {
    let mut t = format!(
        "{:<48} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "fleet · router", "device %", "host %", "TTFT p50", "TTFT p90", "TTFT p99", "done"
    );
    for r in rows {
        let o = &r.outcome;
        let (d, h) = o.tier_hit_rates().unwrap_or((f64::NAN, f64::NAN));
        let _ = writeln!(
            t,
            "{:<48} {:>9.1} {:>9.1} {:>8.3}s {:>8.3}s {:>8.3}s {:>9}",
            r.variant.label(),
            d * 100.0,
            h * 100.0,
            quantile(&o.ttft, 0.5),
            quantile(&o.ttft, 0.9),
            quantile(&o.ttft, 0.99),
            o.completed
        );
    }
    t
}

/// The rows as JSON: each row's usual fields plus its per-tier hit rates.
pub fn rows_json(rows: &[TierRow], load: f64) -> Vec<Value> {
    rows.iter()
        .map(|r| {
            let row = Row {
                label: r.variant.label(),
                load,
                outcome: r.outcome.clone(),
            };
            let mut v = row_json(&row);
            let (d, h) = r.outcome.tier_hit_rates().unwrap_or((f64::NAN, f64::NAN));
            v["host_tier"] = json!(r.variant.host_tier.is_some());
            v["host_load_tokens_per_s"] = json!(r.variant.host_tier);
            v["device_hit_rate"] = json!(d);
            v["host_hit_rate"] = json!(h);
            v["loaded_back_tokens"] = json!(r.outcome.loaded_back_tokens);
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_sessions_come_back_from_the_host_and_tier_pricing_changes_the_route() {
        let mut s = scenario();
        s.duration_s = 90.0;
        // Fleet pricing pins sessions to their holders near saturation whatever the tier term
        // says; the tier term is compared on its own (fleet-blind) for the slow tier.
        let fleet_blind = |mut t: TierVariant| {
            if let SimRouter::Policy(Policy::MinTtft(p)) = &mut t.router.router {
                p.fleet_pricing = loadlink_router::policy::FleetPricing::Blind;
            }
            t
        };
        let v = &TIER_VARIANTS;
        let (slow_b, slow_a) = (fleet_blind(v[5]), fleet_blind(v[6]));
        let rows = rows_of(&[v[0], v[2], v[3], slow_b, slow_a], &s, 1, s.load, |_| {});
        let (none, miss, blind, slow_blind, slow_aware) = (0, 1, 2, 3, 4);
        let rate = |i: usize| rows[i].outcome.tier_hit_rates().unwrap();
        assert_eq!(rate(none).1, 0.0, "no host tier: no host hits");
        assert!(
            rate(blind).1 > 0.0,
            "sessions were loaded back from the host"
        );
        assert!(
            rate(blind).0 + rate(blind).1 > rate(none).0,
            "a host tier raises the any-tier hit rate"
        );
        assert!(
            rate(miss).1 < rate(blind).1,
            "priced as a miss, host-tier prefixes are used less: {:?} vs {:?}",
            rate(miss),
            rate(blind)
        );
        assert!(
            rows[slow_blind].outcome.ttft != rows[slow_aware].outcome.ttft,
            "on a slow host tier, blind and aware pricing route differently"
        );
    }
}
