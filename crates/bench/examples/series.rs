//! One run's course over time, per window: the fleet's hit rate on the prompt tokens computed in
//! the window, the p50 and p99 TTFT of the requests that arrived in it, the prompt tokens per
//! second the fleet took in, and the fleet's eviction regret at the window's end (the share of the
//! pools' evictions needed again, as the first router's KV index sees it). A sweep point is one number for 600 s; a metastable collapse is a
//! moment inside it (when it starts, whether it ends after the arrivals stop), which only the
//! series shows.
//!
//! `cargo run --release -p loadlink-bench --example series -- SCENARIO LOAD SEED LABEL[,…]
//! [WINDOW_S] [DURATION_S]` (LABEL: a sweep label, `min_ttft / kv-index` or `oracle queue`, say;
//! defaults: 30 s windows, the scenario's duration).

use loadlink_bench::scenario::saturation::{SWEEP_VARIANTS, sweep_oracles};
use loadlink_bench::scenario::{arrivals, by_name, run_arrivals};
use loadlink_bench::sim::{Outcome, quantile};

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |k: usize, what: &str| {
        args.get(k).cloned().ok_or(format!(
            "missing {what}: SCENARIO LOAD SEED LABEL[,…] [WINDOW_S] [DURATION_S]"
        ))
    };
    let number = |s: &str, what: &str| {
        s.parse::<f64>()
            .map_err(|e| format!("{what}: expected a number, got {s:?} ({e})"))
    };
    let mut s = by_name(&arg(0, "SCENARIO")?)?;
    let load = number(&arg(1, "LOAD")?, "LOAD")?;
    let seed = number(&arg(2, "SEED")?, "SEED")? as u64;
    let window = number(&arg(4, "").unwrap_or("30".into()), "WINDOW_S")?;
    if let Ok(d) = arg(5, "") {
        s.duration_s = number(&d, "DURATION_S")?;
    }
    let arrivals = arrivals(&s, seed, load);
    let all: Vec<_> = SWEEP_VARIANTS
        .iter()
        .copied()
        .chain(sweep_oracles())
        .collect();
    for label in arg(3, "LABEL")?.split(',') {
        let Some(v) = all.iter().find(|v| v.label == label) else {
            let known: Vec<_> = all.iter().map(|v| v.label).collect();
            return Err(format!("LABEL: no variant {label:?}; known: {known:?}"));
        };
        let (o, _) = run_arrivals(&s, &arrivals, v);
        println!(
            "== {label}, {} load {load}, seed {seed}: {} completed",
            s.name, o.completed
        );
        println!("from_s hit n p50_s p99_s prompt_ktok_per_s regret");
        print_windows(&o, window);
    }
    Ok(())
}

/// One line per window until the samples end.
fn print_windows(o: &Outcome, window: f64) {
    let at = |t: f64| o.cache_series.iter().find(|x| x.0 >= t).map(|x| (x.1, x.2));
    let mut t = 0.0;
    while let (Some((c0, p0)), Some((c1, p1))) = (at(t), at(t + window)) {
        let ttft: Vec<f64> = (0..o.ttft.len())
            .filter(|&i| (t..t + window).contains(&o.arrived[i]))
            .map(|i| o.ttft[i])
            .collect();
        let computed = p1.saturating_sub(p0);
        let regret = o.regret_series.iter().find(|x| x.0 >= t + window);
        println!(
            "{t:.0} {:.1}% {} {:.3} {:.2} {:.1} {:.2}",
            100.0 * c1.saturating_sub(c0) as f64 / computed.max(1) as f64,
            ttft.len(),
            quantile(&ttft, 0.5),
            quantile(&ttft, 0.99),
            computed as f64 / window / 1e3,
            regret.map_or(f64::NAN, |r| r.1)
        );
        t += window;
    }
}
