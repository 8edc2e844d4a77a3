//! Pages of hundreds of thousands of samples, as a hostile (or just huge) worker's `/metrics` can
//! be: the strict parser and the scraped-load reader must be linear in the page, so these finish
//! in well under a second in a release build. Timings are printed (`--nocapture`), not asserted.

use loadlink_wire::polled::loads_from_metrics;
use loadlink_wire::prom::parse;
use std::fmt::Write;
use std::time::Instant;

const SAMPLES: usize = 200_000;

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let v = f();
    eprintln!("{what}: {:?}", t.elapsed());
    v
}

#[test]
fn one_family_of_200k_series_parses() {
    let mut page = String::from("# TYPE big gauge\n");
    for i in 0..SAMPLES {
        writeln!(page, "big{{series=\"{i}\",other=\"x\"}} {i}").unwrap();
    }
    let scrape = timed("200k series of one gauge", || parse(&page)).expect("parses");
    assert_eq!(scrape.families[0].samples.len(), SAMPLES);
    // The repeated-series rule still holds at that size.
    page.push_str("big{other=\"x\",series=\"7\"} 1\n");
    let err = parse(&page).expect_err("a repeated series");
    assert_eq!(err.line, SAMPLES + 2, "{err}");
}

#[test]
fn many_families_and_histograms_parse() {
    let mut page = String::new();
    for f in 0..SAMPLES / 10 {
        writeln!(page, "# HELP g{f} help\n# TYPE g{f} gauge\ng{f} 1").unwrap();
    }
    page.push_str("# TYPE h histogram\n");
    for s in 0..SAMPLES / 20 {
        for (le, n) in [("0.1", 1), ("1", 2), ("+Inf", 3)] {
            writeln!(page, "h_bucket{{s=\"{s}\",le=\"{le}\"}} {n}").unwrap();
        }
        writeln!(page, "h_sum{{s=\"{s}\"}} 1.5\nh_count{{s=\"{s}\"}} 3").unwrap();
    }
    let scrape = timed("20k families and 10k histogram series", || parse(&page)).expect("parses");
    assert_eq!(scrape.families.len(), SAMPLES / 10 + 1);
    assert!(scrape.family("g19999").is_some());
    assert_eq!(scrape.value("h_count", &[("s", "9999")]), Some(3.0));
}

#[test]
fn a_vllm_page_of_100k_engines_is_read() {
    let mut page = String::new();
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting"] {
        writeln!(page, "# TYPE {name} gauge").unwrap();
        for e in 0..SAMPLES / 2 {
            writeln!(page, "{name}{{engine=\"{e}\",model_name=\"m\"}} 1.0").unwrap();
        }
    }
    let (_, snaps) = timed("100k vLLM engines", || loads_from_metrics(&page)).expect("reads");
    assert_eq!(snaps.len(), SAMPLES / 2);
    assert_eq!(
        snaps.last().map(|s| s.dp_rank),
        Some(SAMPLES as i64 / 2 - 1)
    );
}
