//! `loadlink bench sim --scenario s6`: prefill–decode disaggregation in the simulator. S3's
//! arrivals on 4 aggregated engines and on 2 prefill + 2 decode engines, the prefill and decode
//! policies varied (`loadlink_bench::scenario::pd`): the table (TTFT, cache hit rate, time per
//! output token, transfer wait), the JSON and the TTFT plot of every row.

use anyhow::Result;
use loadlink_bench::report::Row;
use loadlink_bench::scenario::{Scenario, pd};
use loadlink_bench::sim::KvLink;
use std::io::Write;
use std::path::Path;

/// S6 on one seed: every row on the same arrivals; table, JSON (`{stem}-pd-seed{seed}.json`) and
/// the TTFT plot.
pub fn run(s: &Scenario, seed: u64, load: f64, out: &Path) -> Result<()> {
    let link = KvLink::DEFAULT;
    println!(
        "PD fleets: {} prefill + {} decode engines (and 1 + {}); KV {} bytes/token over {} GB/s \
         per (prefill, decode) pair",
        pd::PREFILL_ENGINES,
        s.engines - pd::PREFILL_ENGINES,
        s.engines - 1,
        link.bytes_per_token,
        link.gb_s
    );
    let rows = pd::comparison(s, seed, load, link, |label| {
        eprint!("\r{label:<64}");
        let _ = std::io::stderr().flush();
    });
    eprintln!();
    print!("{}", pd::table(&rows));
    let json = pd::rows_json(&rows);
    let plotted: Vec<Row> = rows
        .into_iter()
        .map(|r| Row {
            label: r.variant.label(),
            load,
            outcome: r.outcome,
        })
        .collect();
    crate::bench_cmd::write_report(out, s, (seed, load), "-pd", json.into(), &plotted)
}
