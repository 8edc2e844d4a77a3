//! One run's course over time, per window: the fleet's hit rate on the prompt tokens computed in
//! the window, the p50 and p99 TTFT of the requests that arrived in it, the prompt tokens per
//! second the fleet took in, and the fleet's eviction regret at the window's end (the share of the
//! pools' evictions needed again, as the first router's KV index sees it). A sweep point is one
//! number for 600 s; a metastable collapse is a moment inside it (when it starts, whether it ends
//! after the arrivals stop), which only the series shows.
//!
//! `cargo run --release -p loadlink-bench --example series -- SCENARIO LOAD SEED LABEL[,…]
//! [WINDOW_S] [DURATION_S] [ADMISSION]` (LABEL: a sweep label, `min_ttft / kv-index` or `oracle
//! queue`, say; defaults: 30 s windows, the scenario's duration; ADMISSION, e.g.
//! `wait=500,spare,retries=2`: run the labels behind the routers' admission in reject mode, with
//! clients that retry a refusal, [`admission`]).

use loadlink_bench::scenario::saturation::{SWEEP_VARIANTS, sweep_oracles};
use loadlink_bench::scenario::{arrivals, by_name, run_admitted};
use loadlink_bench::sim::{Outcome, quantile};
use loadlink_router::admission::AdmissionConfig;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |k: usize, what: &str| {
        args.get(k).cloned().ok_or(format!(
            "missing {what}: SCENARIO LOAD SEED LABEL[,…] [WINDOW_S] [DURATION_S] [ADMISSION]"
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
    let (admission, retries) = match arg(6, "") {
        Ok(spec) => admission(&spec).map(|(a, r)| (Some(a), r))?,
        Err(_) => (None, 0),
    };
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
        let (o, _) = run_admitted(&s, &arrivals, v, (admission, retries));
        println!(
            "== {label}, {} load {load}, seed {seed}, admission {admission:?}, {retries} client \
             retries: {} completed, {} retried, {} refused, {} abandoned",
            s.name, o.completed, o.retried, o.rejected, o.abandoned
        );
        let good = o.ttft.iter().filter(|&&t| t <= 1.0).count();
        println!(
            "whole run: {good} with TTFT ≤ 1 s ({:.1} per s of {:.0} s), p50 {:.3} s, p99 {:.2} s",
            good as f64 / o.makespan.max(s.duration_s),
            o.makespan.max(s.duration_s),
            quantile(&o.ttft, 0.5),
            quantile(&o.ttft, 0.99)
        );
        println!("from_s hit n p50_s p99_s prompt_ktok_per_s regret");
        print_windows(&o, window);
    }
    Ok(())
}

/// `wait=MS`, `spare` and `retries=N` (comma-separated): the routers' `--max-predicted-wait-ms`
/// and `--admission-spare-running`, in reject mode, and how many times a client sends a refused
/// request again after its `Retry-After`.
fn admission(spec: &str) -> Result<(AdmissionConfig, u32), String> {
    let (mut a, mut retries) = (AdmissionConfig::default(), 0);
    for part in spec.split(',') {
        match part.split_once('=') {
            Some(("wait", ms)) => {
                let ms = ms
                    .parse()
                    .map_err(|e| format!("ADMISSION wait={ms:?}: {e}"))?;
                a.max_predicted_wait_ms = Some(ms);
            }
            Some(("retries", n)) => {
                retries = n
                    .parse()
                    .map_err(|e| format!("ADMISSION retries={n:?}: {e}"))?;
            }
            None if part == "spare" => a.spare_running = true,
            _ => return Err(format!("ADMISSION: unknown part {part:?}")),
        }
    }
    Ok((a, retries))
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
