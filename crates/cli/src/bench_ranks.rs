//! `loadlink bench sim --scenario s5`: DP ranks as routing targets. Every router on 8 engines × 1
//! rank and on 2 engines × 4 ranks, routed per rank and whole (`loadlink_bench::scenario::ranks`):
//! the table, the default router's acceptance figures against issue 20's bounds, the JSON and the
//! default router's TTFT plot.

use anyhow::Result;
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
    let json = ranks::rows_json(&rows);
    let default: Vec<Row> = rows
        .into_iter()
        .filter(|r| r.variant.router.label == ranks::DEFAULT_ROUTER)
        .map(|r| Row {
            label: r.variant.label(),
            load,
            outcome: r.outcome,
        })
        .collect();
    crate::bench_cmd::write_report(out, s, (seed, load), "-ranks", json.into(), &default)
}
