//! `loadlink bench sim --scenario models`: three models and 32 LoRA adapters behind one router
//! (`loadlink_bench::scenario::models`): round robin, cache_aware, and min_ttft adapter-blind and
//! adapter-aware on the same arrivals; the table, issue 22's acceptance line, the JSON and the
//! TTFT plot.

use anyhow::Result;
use loadlink_bench::scenario::{Scenario, models};
use std::io::Write;
use std::path::Path;

/// The comparison on one seed: table, acceptance, JSON (`{stem}-seed{seed}.json`) and TTFT plot.
pub fn run(s: &Scenario, seed: u64, load: f64, out: &Path) -> Result<()> {
    let rows = models::comparison(s, seed, load, &models::MODEL_VARIANTS, |label| {
        eprint!("\r{label:<40}");
        let _ = std::io::stderr().flush();
    });
    eprintln!();
    print!("{}{}", models::table(&rows), models::acceptance(&rows));
    let json = models::rows_json(&rows, load);
    let plain = crate::bench_cmd::plain_rows(
        rows.into_iter().map(|r| (r.variant.label(), r.outcome)),
        load,
    );
    crate::bench_cmd::write_report(out, s, (seed, load), "", json.into(), &plain)
}
