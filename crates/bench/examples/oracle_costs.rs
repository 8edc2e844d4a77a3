//! What each oracle of the bound's family costs to simulate, beside what it achieves: per
//! scenario and load, the wall time of one run and its hit rate, p50, p99 and wait p99 TTFT,
//! with `min_ttft` on the KV index (fleet-aware, and fleet-blind as before issue 24) as the
//! production reference. The sweep runs every oracle at every
//! load point, so an oracle much dearer than greedy makes the sweep unaffordable.
//!
//! `cargo run --release -p loadlink-bench --example oracle_costs -- [SCENARIO[,…]] [LOAD[,…]]
//! [DURATION_S] [SEED] [ORACLE-LABEL-SUBSTRING]` (defaults: s3, 0.85,1.0, 300, 1, all).

use loadlink_bench::scenario::saturation::SWEEP_VARIANTS;
use loadlink_bench::scenario::{Variant, arrivals, by_name, run_arrivals};
use loadlink_bench::sim::{CacheView, ORACLES, quantile};
use loadlink_router::LoadSignal;
use std::time::Instant;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |k: usize, default: &str| args.get(k).cloned().unwrap_or(default.into());
    let parse = |s: &str, what: &str| {
        s.parse::<f64>()
            .map_err(|e| format!("{what}: expected a number, got {s:?} ({e})"))
    };
    let loads: Vec<f64> = (arg(1, "0.85,1.0").split(','))
        .map(|l| parse(l, "LOAD"))
        .collect::<Result<_, _>>()?;
    let duration = parse(&arg(2, "300"), "DURATION_S")?;
    let seed = parse(&arg(3, "1"), "SEED")? as u64;
    let only = arg(4, "");
    let reference = SWEEP_VARIANTS
        .iter()
        .filter(|v| v.label.starts_with("min_ttft") && v.label.ends_with("kv-index"));
    let oracles = ORACLES.iter().map(|&(label, router)| Variant {
        label,
        router,
        signal: LoadSignal::Backlog,
        cache: CacheView::Blind,
    });
    let variants: Vec<Variant> = (reference.copied())
        .chain(oracles)
        .filter(|v| v.label.contains(only.as_str()))
        .collect();
    println!("scenario load variant wall_s hit p50_s p99_s wait_p99_s completed/submitted");
    for name in arg(0, "s3").split(',') {
        let mut s = by_name(name)?;
        s.duration_s = duration;
        for &load in &loads {
            let arrivals = arrivals(&s, seed, load);
            for v in &variants {
                let start = Instant::now();
                let (o, _) = run_arrivals(&s, &arrivals, v);
                let wall = start.elapsed().as_secs_f64();
                println!(
                    "{name} {load:.2} {:?} {wall:.1} {:.3} {:.3} {:.3} {:.3} {}/{}",
                    v.label,
                    o.cache_hit_rate().unwrap_or(f64::NAN),
                    quantile(&o.ttft, 0.5),
                    quantile(&o.ttft, 0.99),
                    quantile(&o.waits(), 0.99),
                    o.completed,
                    o.submitted,
                );
            }
        }
    }
    Ok(())
}
