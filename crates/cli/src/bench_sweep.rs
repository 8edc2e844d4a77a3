//! `bench sim --variants cache --sweep` (the placement comparison of issue 24) and `--burst`: the
//! production policies and the oracles at each offered load, reduced to hit rate, p50, p99 and
//! p99 wait, with the acceptance read off them; or one run with a burst and how each variant
//! recovers. The commit the binary was built from is recorded in the JSON, so a baseline measured
//! "today" can be named later.

use anyhow::{Context, Result};
use loadlink_bench::scenario::saturation::{
    DEFAULT_LABEL, SWEEP_LOADS, SWEEP_VARIANTS, burst_arrivals, sweep_oracles,
};
use loadlink_bench::scenario::{self, Scenario, Variant};
use loadlink_bench::sweep::{self, recovery};
use loadlink_bench::workload::burst::Burst;
use std::io::Write;
use std::path::Path;

/// What a sweep or burst run was asked for.
pub(crate) struct SweepPlan<'a> {
    pub loads: Vec<f64>,
    pub oracles: Option<OracleSet>,
    /// Of the production policies, the default only.
    pub only_default: bool,
    pub threads: usize,
    pub out: &'a Path,
}

/// `--oracles`, parsed: the oracles to run, as variants.
#[derive(Debug, Clone)]
pub(crate) struct OracleSet(pub Vec<Variant>);

/// Parses `--oracles`: `all`, or a comma-separated list of the family's names.
pub(crate) fn parse_oracles(s: &str) -> Result<OracleSet, String> {
    let family = sweep_oracles();
    if s == "all" {
        return Ok(OracleSet(family));
    }
    let name = |v: &Variant| v.label.trim_start_matches("oracle ").to_string();
    s.split(',')
        .map(|want| {
            (family.iter().find(|v| name(v) == want.trim()).copied()).ok_or_else(|| {
                let names: Vec<String> = family.iter().map(name).collect();
                format!(
                    "--oracles {want:?}: expected all or some of {}",
                    names.join(", ")
                )
            })
        })
        .collect::<Result<_, _>>()
        .map(OracleSet)
}

/// `--loads`, parsed.
#[derive(Debug, Clone)]
pub(crate) struct Loads(pub Vec<f64>);

/// Parses `--loads`: `FROM:TO:STEP` (inclusive) or a comma-separated list.
pub(crate) fn parse_loads(s: &str) -> Result<Loads, String> {
    let bad =
        || format!("--loads {s:?}: expected FROM:TO:STEP (e.g. 0.5:1.05:0.05) or a list (0.8,0.9)");
    let num = |x: &str| {
        x.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0)
    };
    let parts: Vec<&str> = s.split(':').collect();
    let loads: Vec<f64> = match parts.as_slice() {
        [a, b, step] => {
            let (a, b, step) = (
                num(a).ok_or_else(bad)?,
                num(b).ok_or_else(bad)?,
                num(step).ok_or_else(bad)?,
            );
            let n = ((b - a) / step + 1e-9).floor() as usize;
            if b < a || n > 200 {
                return Err(bad());
            }
            (0..=n)
                .map(|k| ((a + k as f64 * step) * 1e6).round() / 1e6)
                .collect()
        }
        [_] => s
            .split(',')
            .map(|x| num(x).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        _ => return Err(bad()),
    };
    if loads.is_empty() {
        Err(bad())
    } else {
        Ok(Loads(loads))
    }
}

/// The default loads of a sweep (50% to 105% in 5% steps).
pub(crate) fn default_loads() -> Vec<f64> {
    SWEEP_LOADS.to_vec()
}

fn variants(plan: &SweepPlan) -> Vec<Variant> {
    let mut v = SWEEP_VARIANTS.to_vec();
    v.retain(|p| !plan.only_default || p.label == DEFAULT_LABEL);
    if let Some(o) = &plan.oracles {
        v.extend(o.0.iter().copied());
    }
    v
}

/// The commit the binary was built from (HEAD at build time, `build.rs`: uncommitted changes are
/// not named; `unknown` when built outside a git checkout), whatever directory it runs in.
fn commit() -> &'static str {
    option_env!("LOADLINK_BUILD_COMMIT")
        .filter(|c| !c.is_empty())
        .unwrap_or("unknown")
}

/// The sweep: table, acceptance check, `{scenario}-sweep-seed{seed}.json`.
pub(crate) fn run(s: &Scenario, seed: u64, plan: &SweepPlan) -> Result<()> {
    let vs = variants(plan);
    let progress = |load: f64, label: &str| {
        eprint!("\rsweep: load {load:.2} {label:<32}");
        let _ = std::io::stderr().flush();
    };
    let rows = sweep::run(s, seed, &plan.loads, &vs, plan.threads, &progress);
    eprintln!();
    print!("{}", sweep::table(&rows));
    let violations = sweep::check(&rows, DEFAULT_LABEL);
    for v in &violations {
        println!("acceptance: load {:.2}: {}", v.load, v.what);
    }
    if violations.is_empty() {
        println!("acceptance: {DEFAULT_LABEL} meets every sweep criterion");
    }
    for v in &SWEEP_VARIANTS {
        if let Some((from, to, lost)) = sweep::worst_hit_loss(&rows, v.label) {
            println!(
                "worst hit loss of {}: {:.0}% between loads {from:.2} and {to:.2}",
                v.label,
                lost * 100.0
            );
        }
    }
    let doc = serde_json::json!({
        "scenario": s.name, "about": s.about, "seed": seed, "duration_s": s.duration_s,
        "commit": commit(), "default": DEFAULT_LABEL,
        "rows": rows.iter().map(sweep::SweepRow::json).collect::<Vec<_>>(),
        "violations": violations.iter().map(|v| serde_json::json!({"load": v.load, "what": v.what})).collect::<Vec<_>>(),
    });
    let path = plan.out.join(format!("{}-sweep-seed{seed}.json", s.name));
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The burst run: per variant its p50 before, its worst window, its recovery time;
/// `{scenario}-burst-seed{seed}.json`.
pub(crate) fn burst(s: &Scenario, seed: u64, b: &Burst, plan: &SweepPlan) -> Result<()> {
    let a = burst_arrivals(s, seed, b);
    println!(
        "burst: {:.0}% from {:.0} s for {:.0} s, {:.0}% otherwise; {} arrivals",
        b.peak * 100.0,
        b.start_s,
        b.len_s,
        b.base * 100.0,
        a.len()
    );
    let vs = variants(plan);
    let got = sweep::par_map(&vs, plan.threads, |v| {
        let (o, _) = scenario::run_arrivals(s, &a, v);
        recovery::recovery(v.label, &o, b, s.duration_s)
    });
    println!(
        "{:<34}{:>12}{:>12}{:>14}{:>8}",
        "variant", "p50 before", "worst p50", "recovery", "hit"
    );
    for r in &got {
        let rec = r
            .recovery_s
            .map_or("never".to_string(), |x| format!("{x:.0} s"));
        println!(
            "{:<34}{:>11.3}s{:>11.3}s{:>14}{:>7.1}%",
            r.label,
            r.before_p50,
            r.peak_p50,
            rec,
            r.hit * 100.0
        );
    }
    let doc = serde_json::json!({
        "scenario": s.name, "seed": seed, "duration_s": s.duration_s, "commit": commit(),
        "burst": {"start_s": b.start_s, "len_s": b.len_s, "base": b.base, "peak": b.peak},
        "rows": got.iter().map(recovery::Recovery::json).collect::<Vec<_>>(),
    });
    let path = plan.out.join(format!("{}-burst-seed{seed}.json", s.name));
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oracles_are_all_or_the_named_ones_and_a_wrong_name_lists_the_family() {
        let all = parse_oracles("all").unwrap().0;
        assert_eq!(all, sweep_oracles());
        let some = parse_oracles("marginal, greedy").unwrap().0;
        let labels: Vec<&str> = some.iter().map(|v| v.label).collect();
        assert_eq!(labels, ["oracle marginal", "oracle greedy"]);
        let e = parse_oracles("marginal,psychic").unwrap_err();
        assert!(
            e.contains("\"psychic\"") && e.contains("sticky k=inf"),
            "{e}"
        );
    }

    #[test]
    fn only_default_keeps_the_default_and_the_oracles() {
        let mut plan = SweepPlan {
            loads: vec![1.0],
            oracles: Some(parse_oracles("queue").unwrap()),
            only_default: false,
            threads: 1,
            out: Path::new("."),
        };
        assert_eq!(variants(&plan).len(), SWEEP_VARIANTS.len() + 1);
        plan.only_default = true;
        let labels: Vec<&str> = variants(&plan).iter().map(|v| v.label).collect();
        assert_eq!(labels, [DEFAULT_LABEL, "oracle queue"]);
    }

    #[test]
    fn loads_are_a_range_or_a_list() {
        assert_eq!(parse_loads("0.5:0.6:0.05").unwrap().0, [0.5, 0.55, 0.6]);
        assert_eq!(parse_loads("0.8,1").unwrap().0, [0.8, 1.0]);
        assert!(
            parse_loads("0.8:0.5:0.1")
                .unwrap_err()
                .contains("FROM:TO:STEP")
        );
        assert!(parse_loads("fast").is_err());
    }
}
