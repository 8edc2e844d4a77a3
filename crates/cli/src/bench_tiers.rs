//! `loadlink bench sim --scenario tiers`: a host KV tier, priced tier-aware or tier-blind
//! (`loadlink_bench::scenario::tiers`): the table, the JSON and the TTFT plot.

use anyhow::Result;
use loadlink_bench::plot;
use loadlink_bench::report::Row;
use loadlink_bench::scenario::{Scenario, tiers};
use std::io::Write;
use std::path::Path;

/// The tier comparison on one seed: table, JSON (`{stem}-seed{seed}.json`) and TTFT plot.
pub fn run(s: &Scenario, seed: u64, load: f64, out: &Path) -> Result<()> {
    let rows = tiers::comparison(s, seed, load, |label| {
        eprint!("\r{label:<48}");
        let _ = std::io::stderr().flush();
    });
    eprintln!();
    print!("{}", tiers::table(&rows));
    let doc = serde_json::json!({ "scenario": s.name, "about": s.about, "seed": seed, "load": load, "publish_point": s.publish_point.as_str(), "duration_s": s.duration_s, "rows": tiers::rows_json(&rows, load) });
    let stem = format!("{}-seed{seed}", crate::bench_cmd::stem(s));
    let plain: Vec<Row> = rows
        .into_iter()
        .map(|r| Row {
            label: r.variant.label(),
            load,
            outcome: r.outcome,
        })
        .collect();
    let plots = plot::ttft_cdf(
        &out.join(format!("{stem}-ttft-cdf")),
        &plot::ttft_title(s.name, false, s.publish_point.as_str(), load),
        &plain,
    )?;
    let path = out.join(format!("{stem}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    println!("wrote {}", crate::bench_cmd::names(&path, &plots));
    Ok(())
}
