//! `loadlink bench sim --scenario s5`: DP ranks as routing targets. Every router on 8 engines × 1
//! rank and on 2 engines × 4 ranks, routed per rank and whole (`loadlink_bench::scenario::ranks`):
//! the table, the default router's acceptance figures against issue 20's bounds, the JSON and the
//! default router's TTFT plot.

use anyhow::Result;
use loadlink_bench::plot;
use loadlink_bench::report::Row;
use loadlink_bench::scenario::{Scenario, ranks};
use std::io::Write;
use std::path::Path;

/// S5 on one seed: every router on 8 × 1 and on 2 × 4 routed per rank and whole; table, the
/// default router's acceptance figures, JSON (`{stem}-ranks-seed{seed}.json`) and the default
/// router's TTFT plot on the three fleets.
pub fn run(s: &Scenario, seed: u64, load: f64, out: &Path) -> Result<()> {
    let rows = ranks::comparison(s, seed, load, |label| {
        eprint!("\r{label:<48}");
        let _ = std::io::stderr().flush();
    });
    eprintln!();
    print!("{}{}", ranks::table(&rows), ranks::acceptance(&rows));
    let doc = serde_json::json!({ "scenario": s.name, "about": s.about, "seed": seed, "load": load, "publish_point": s.publish_point.as_str(), "duration_s": s.duration_s, "rows": ranks::rows_json(&rows) });
    let stem = format!("{}-ranks-seed{seed}", crate::bench_cmd::stem(s));
    let default: Vec<Row> = rows
        .into_iter()
        .filter(|r| r.variant.router.label == ranks::DEFAULT_ROUTER)
        .map(|r| Row {
            label: r.variant.label(),
            load,
            outcome: r.outcome,
        })
        .collect();
    let plots = plot::ttft_cdf(
        &out.join(format!("{stem}-ttft-cdf")),
        &plot::ttft_title(s.name, false, s.publish_point.as_str(), load),
        &default,
    )?;
    let path = out.join(format!("{stem}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    println!("wrote {}", crate::bench_cmd::names(&path, &plots));
    Ok(())
}
