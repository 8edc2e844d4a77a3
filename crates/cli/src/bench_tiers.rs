//! `loadlink bench sim --scenario tiers`: a host KV tier, priced tier-aware or tier-blind
//! (`loadlink_bench::scenario::tiers`): the table, the JSON and the TTFT plot.

use anyhow::Result;
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
    let json = tiers::rows_json(&rows, load);
    let plain = crate::bench_cmd::plain_rows(
        rows.into_iter().map(|r| (r.variant.label(), r.outcome)),
        load,
    );
    crate::bench_cmd::write_report(out, s, (seed, load), "", json.into(), &plain)
}
