//! `loadlink bench sim|live|plot`: the discrete-event experiment or the live run on a named
//! scenario, printed as a table and written as JSON and plots (SVG and PNG); `plot` redraws the
//! plots of a results JSON.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use loadlink_bench::plot;
use loadlink_bench::report::{CacheRow, Row, cache_rows_json, cache_table, row_json, table};
use loadlink_bench::scenario::{self, CACHE_VARIANTS, Scenario, VARIANTS, by_name};
use loadlink_engine::PublishPoint;
use loadlink_router::LoadSignal;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Simulate a scenario in virtual time (the production scheduler model, LoadBook and policies).
    Sim(SimArgs),
    /// Run a scenario live: real engine and router processes on loopback, time-compressed.
    Live(crate::bench_live::LiveArgs),
    /// Redraw the plots of a results JSON beside it: the TTFT figure if its rows carry the raw
    /// samples (live runs store them), the p99-vs-load figure if it has a sweep.
    Plot(PlotArgs),
    /// Write a workload as a JSONL trace on stdout (with `input_ids` when prompts share prefixes);
    /// the same seed writes the same trace.
    Trace(TraceArgs),
    /// The router's ingest at fleet scale: N fake engines × R ranks on loopback publishing at H Hz;
    /// reports router RSS, CPU per message, engine-priced share, load-to-book lag, proxy latency.
    Fleet(FleetArgs),
    /// Issue 19's acceptance soak: 4 healthy engines and a router process under steady traffic,
    /// with hostile workers (stalled, dribbled and oversized bodies, absurd ranks and numbers,
    /// garbage and oversized frames) registered beside them. Passes with zero failed client
    /// requests (3 retries allowed), router RSS within idle + 64 MiB, and the router's executor
    /// probe never more than 50 ms late; exits 1 otherwise. Run it on a release build.
    Soak(crate::soak_cmd::SoakArgs),
}

#[derive(Args)]
pub struct TraceArgs {
    /// A scenario (s0–s5) or a prefix shape (chat, shared-system, generated-shared-prefix,
    /// hot-prefix).
    #[arg(long)]
    workload: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A scenario's load (default: its own).
    #[arg(long)]
    load: Option<f64>,
    /// A shape's requests/s (default 10).
    #[arg(long)]
    rate: Option<f64>,
    /// Seconds of arrivals (default: the scenario's, or 600).
    #[arg(long)]
    duration: Option<f64>,
}

#[derive(Args)]
pub struct FleetArgs {
    #[arg(long, default_value_t = 100)]
    workers: usize,
    #[arg(long, default_value_t = 8)]
    ranks: u16,
    /// Snapshots per second per rank.
    #[arg(long, default_value_t = 50.0)]
    hz: f64,
    /// Measured window, seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Proxied requests per second during the window.
    #[arg(long, default_value_t = 100.0)]
    request_rate: f64,
    #[arg(long, default_value_t = 1)]
    ingest_threads: usize,
}

fn fleet(a: FleetArgs) -> Result<()> {
    let b = loadlink_bench::fleet::FleetBench {
        workers: a.workers,
        ranks: a.ranks,
        hz: a.hz,
        duration: a.duration,
        request_rate: a.request_rate,
        ingest_threads: a.ingest_threads,
        exe: std::env::current_exe().context("locating the loadlink binary")?,
    };
    let r = crate::runtime()?
        .block_on(loadlink_bench::fleet::run(&b))
        .map_err(anyhow::Error::msg)?;
    println!("{}", r.text(&b));
    Ok(())
}

#[derive(Args)]
pub struct PlotArgs {
    /// A JSON written by `bench sim` or `bench live`.
    file: PathBuf,
}

/// Flags both experiments share.
#[derive(Args)]
pub struct Common {
    /// s1 (standard: 4 engines, 2 routers, 25% direct, 85% load), s0 (fairness: 1 router, no
    /// direct traffic), s2 (S1 with the direct traffic pinned to one engine), s3 (S1 with prefix
    /// reuse: chat sessions and shared system prompts), s4 (S3 with one tenant sending half) or s5
    /// (S3's mix on 8 schedulers: 8 engines × 1 rank against 2 × 4 DP ranks, routed per rank and
    /// whole; `bench sim` runs its own comparison, whatever --variants says), s6 (S3 on 2 prefill +
    /// 2 decode engines against 4 aggregated ones; its own comparison too); tiers (a host KV
    /// tier, priced tier-aware or tier-blind) or models (3 models and 32 LoRA adapters of one of
    /// them on 8 engines: min_ttft adapter-aware against adapter-blind); both run their own
    /// comparison too; agentic (long agentic sessions, open loop: turns on their nominal clock),
    /// agentic-closed (the same sessions, each turn sent once the previous one is answered) or gsp
    /// (SGLang's generated-shared-prefix): the placement-near-saturation workloads.
    #[arg(long, default_value = "s1")]
    pub(crate) scenario: String,
    /// Workload seed (same seed, same workload).
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Offered load as a fraction of nominal fleet capacity (default: the scenario's).
    #[arg(long)]
    load: Option<f64>,
    /// Where in their cycle the engines publish: ingest (loadlink's choice), scheduled (SGLang
    /// 0.5.23's overlap loop) or batch-end (SGLang's normal loop); see docs/engine.md.
    #[arg(long, default_value = "ingest", value_parser = PublishPoint::parse)]
    publish_point: PublishPoint,
    /// Where to write the JSON and the plots (SVG and PNG).
    #[arg(long, default_value = "bench-results")]
    pub(crate) out: PathBuf,
}

impl Common {
    /// The named scenario with this run's publish point, and the load to offer.
    pub(crate) fn scenario(&self) -> Result<(Scenario, f64)> {
        let mut s = by_name(&self.scenario).map_err(anyhow::Error::msg)?;
        s.publish_point = self.publish_point;
        std::fs::create_dir_all(&self.out)
            .with_context(|| format!("--out {}", self.out.display()))?;
        let load = self.load.unwrap_or(s.load);
        Ok((s, load))
    }
}

#[derive(Args)]
pub struct SimArgs {
    #[command(flatten)]
    common: Common,
    /// Also sweep the load. With `--variants load`: 0.5 to 1.0, p99 TTFT plotted against it. With
    /// `--variants cache`: the placement comparison (`--loads`, default 0.5 to 1.05 in 5% steps),
    /// hit rate, p50, p99 and p99 wait per policy and load, the acceptance checked against the
    /// best production policy and the oracles' bound (docs/benchmarks.md).
    #[arg(long)]
    sweep: bool,
    /// The sweep's loads: FROM:TO:STEP (inclusive) or a comma-separated list.
    #[arg(long, value_parser = crate::bench_sweep::parse_loads)]
    loads: Option<crate::bench_sweep::Loads>,
    /// Also run the oracles (simulation only, perfect knowledge; slow) and report their bound:
    /// every one of the family, or those named (`--oracles marginal,greedy`; the names are the
    /// sweep's labels without `oracle `).
    #[arg(
        long,
        num_args = 0..=1,
        default_missing_value = "all",
        value_parser = crate::bench_sweep::parse_oracles
    )]
    oracles: Option<crate::bench_sweep::OracleSet>,
    /// In a sweep, run only the default policy of the production ones (with `--oracles`: the
    /// default against the bound, at a sixth of the production runs; the criteria against the
    /// other policies need a run without it).
    #[arg(long)]
    only_default: bool,
    /// With `--variants cache`: one run at 80% load with a 30 s burst to 120% from 300 s, and
    /// how fast each policy's p50 (10 s windows) comes back within 20% of its pre-burst value.
    #[arg(long)]
    burst: bool,
    /// Threads running variants side by side in a sweep or burst run (default: the cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Virtual seconds of arrivals (default: the scenario's, 600).
    #[arg(long)]
    duration: Option<f64>,
    /// Which comparison: `load` (load-only policies × signals) or `cache` (round robin, backlog
    /// P2C, cache_aware on in-flight and on engine load, min_ttft on the approximate tree and on
    /// the KV index, and the clairvoyant bound), `sources` (backlog P2C with the engine load
    /// pushed, polled every 100 ms and every 1 s, against in-flight P2C), or `overload` (admission
    /// control: backlog P2C and min_ttft without it, min_ttft with a predicted-wait cap in reject
    /// and queue mode; run it with --load above 1).
    #[arg(long, default_value = "load", value_parser = ["load", "cache", "sources", "overload"])]
    variants: String,
    #[command(flatten)]
    overload: crate::bench_overload::OverloadArgs,
}

/// Output files name the publish point when it is not the default, so runs do not overwrite each
/// other: `s1.json`, `s1-scheduled.json`.
pub(crate) fn point_suffix(s: &Scenario) -> String {
    if s.publish_point == PublishPoint::default() {
        String::new()
    } else {
        format!("-{}", s.publish_point.as_str())
    }
}

pub(crate) fn stem(s: &Scenario) -> String {
    format!("{}{}", s.name, point_suffix(s))
}

fn label(v: (loadlink_router::Policy, LoadSignal)) -> String {
    format!("{} / {}", v.0.as_str(), v.1.as_str())
}

pub fn run(c: BenchCommand) -> Result<()> {
    let a = match c {
        BenchCommand::Sim(a) => a,
        BenchCommand::Live(l) => return crate::bench_live::run(l),
        BenchCommand::Plot(p) => return replot(&p.file),
        BenchCommand::Trace(t) => return trace(&t),
        BenchCommand::Fleet(f) => return fleet(f),
        BenchCommand::Soak(s) => return crate::soak_cmd::run(s),
    };
    let (mut s, load) = a.common.scenario()?;
    if let Some(d) = a.duration {
        s.duration_s = d;
    }
    let (seed, out) = (a.common.seed, &a.common.out);
    println!(
        "scenario {}: {} (seed {seed}, load {load:.2}, {} s of arrivals, publish point {})",
        s.name,
        s.about,
        s.duration_s,
        s.publish_point.as_str()
    );
    calibration(&s, seed, load);
    if s.name == "s5" {
        return crate::bench_ranks::run(&s, seed, load, out);
    }
    if s.name == "s6" {
        return crate::bench_pd::run(&s, seed, load, out);
    }
    if s.name == "tiers" {
        return crate::bench_tiers::run(&s, seed, load, out);
    }
    if s.name == "models" {
        return crate::bench_models::run(&s, seed, load, out);
    }
    if a.variants == "cache" && (a.sweep || a.burst) {
        let plan = crate::bench_sweep::SweepPlan {
            loads: a
                .loads
                .clone()
                .map_or_else(crate::bench_sweep::default_loads, |l| l.0),
            oracles: a.oracles.clone(),
            only_default: a.only_default,
            threads: a
                .threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            out,
        };
        return match a.burst {
            true => crate::bench_sweep::burst(
                &s,
                seed,
                &loadlink_bench::workload::burst::Burst::DEFAULT,
                &plan,
            ),
            false => crate::bench_sweep::run(&s, seed, &plan),
        };
    }
    if a.variants == "cache" {
        return cache_comparison(&s, seed, load, out);
    }
    if a.variants == "sources" {
        return source_comparison(&s, seed, load, out);
    }
    if a.variants == "overload" {
        return crate::bench_overload::run(&a.overload, &s, seed, load, out);
    }
    let rows: Vec<Row> = VARIANTS
        .iter()
        .map(|&v| Row {
            label: label(v),
            load,
            outcome: scenario::run(&s, seed, load, v.0, v.1),
        })
        .collect();
    print!("{}", table(&rows));
    let mut doc = serde_json::json!({ "scenario": s.name, "about": s.about, "seed": seed, "publish_point": s.publish_point.as_str(), "duration_s": s.duration_s, "rows": rows.iter().map(row_json).collect::<Vec<_>>() });
    let point = s.publish_point.as_str();
    let mut plots = plot::ttft_cdf(
        &out.join(format!("{}-ttft-cdf", stem(&s))),
        &plot::ttft_title(s.name, false, point, load),
        &rows,
    )?
    .to_vec();
    if a.sweep {
        let mut sweep = Vec::new();
        for l in [0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0] {
            eprint!("\rsweep: load {l:.2}  ");
            let _ = std::io::stderr().flush();
            for &v in &VARIANTS {
                sweep.push(Row {
                    label: label(v),
                    load: l,
                    outcome: scenario::run(&s, seed, l, v.0, v.1),
                });
            }
        }
        eprintln!();
        doc["sweep"] = sweep.iter().map(row_json).collect();
        plots.extend(plot::p99_vs_load(
            &out.join(format!("{}-p99-vs-load", stem(&s))),
            &plot::sweep_title(s.name, point),
            &sweep,
        )?);
    }
    let path = out.join(format!("{}.json", stem(&s)));
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    println!("wrote {}", names(&path, &plots));
    Ok(())
}

/// What push is worth over polling, on one seed: backlog P2C with the load pushed, polled every
/// 100 ms and every 1 s, and in-flight P2C (no engine load at all); table and JSON
/// (`{stem}-sources-seed{seed}.json`).
fn source_comparison(s: &Scenario, seed: u64, load: f64, out: &Path) -> Result<()> {
    use loadlink_bench::sim::LoadDelivery;
    use loadlink_router::Policy;
    let variants = [
        (LoadSignal::Backlog, LoadDelivery::Push),
        (LoadSignal::Backlog, LoadDelivery::Poll { interval_s: 0.1 }),
        (LoadSignal::Backlog, LoadDelivery::Poll { interval_s: 1.0 }),
        (LoadSignal::Inflight, LoadDelivery::Push),
    ];
    let rows: Vec<Row> = variants
        .iter()
        .map(|&(signal, delivery)| {
            let source = match signal {
                LoadSignal::Inflight => "in-flight only".to_string(),
                _ => format!("backlog, {}", delivery.label()),
            };
            let s = Scenario {
                delivery,
                ..s.clone()
            };
            Row {
                label: source,
                load,
                outcome: scenario::run(&s, seed, load, Policy::PowerOfTwo, signal),
            }
        })
        .collect();
    print!("{}", table(&rows));
    let doc = serde_json::json!({ "scenario": s.name, "about": s.about, "seed": seed, "load": load, "publish_point": s.publish_point.as_str(), "duration_s": s.duration_s, "rows": rows.iter().map(row_json).collect::<Vec<_>>() });
    let path = out.join(format!("{}-sources-seed{seed}.json", stem(s)));
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The cache-aware comparison on one seed: table, JSON (`{stem}-cache-seed{seed}.json`) and the
/// TTFT plot.
fn cache_comparison(s: &Scenario, seed: u64, load: f64, out: &Path) -> Result<()> {
    let arrivals = scenario::arrivals(s, seed, load);
    let rows: Vec<CacheRow> = CACHE_VARIANTS
        .iter()
        .map(|v| {
            eprint!("\r{:<24}", v.label);
            let _ = std::io::stderr().flush();
            let (outcome, queues) = scenario::run_arrivals(s, &arrivals, v);
            CacheRow {
                row: Row {
                    label: v.label.to_string(),
                    load,
                    outcome,
                },
                queues,
            }
        })
        .collect();
    eprintln!();
    print!("{}", cache_table(&rows));
    let json = cache_rows_json(&rows);
    let plain: Vec<Row> = rows.into_iter().map(|r| r.row).collect();
    write_report(out, s, (seed, load), "-cache", json.into(), &plain)
}

/// Plain report rows of a comparison's `(label, outcome)` pairs at `load`.
pub(crate) fn plain_rows(
    rows: impl IntoIterator<Item = (String, loadlink_bench::sim::Outcome)>,
    load: f64,
) -> Vec<Row> {
    rows.into_iter()
        .map(|(label, outcome)| Row {
            label,
            load,
            outcome,
        })
        .collect()
}

/// Writes a comparison's report: `{stem}{tag}-seed{seed}.json` (the run's settings and `rows`) and
/// the TTFT CDF of `plotted`, and says where they went.
pub(crate) fn write_report(
    out: &Path,
    s: &Scenario,
    (seed, load): (u64, f64),
    tag: &str,
    rows: serde_json::Value,
    plotted: &[Row],
) -> Result<()> {
    let doc = serde_json::json!({ "scenario": s.name, "about": s.about, "seed": seed, "load": load, "publish_point": s.publish_point.as_str(), "duration_s": s.duration_s, "rows": rows });
    let stem = format!("{}{tag}-seed{seed}", stem(s));
    let plots = plot::ttft_cdf(
        &out.join(format!("{stem}-ttft-cdf")),
        &plot::ttft_title(s.name, false, s.publish_point.as_str(), load),
        plotted,
    )?;
    let path = out.join(format!("{stem}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    println!("wrote {}", names(&path, &plots));
    Ok(())
}

/// `a.json, a-ttft-cdf.svg, a-ttft-cdf.png`: the JSON's full path, then the other files' names.
pub(crate) fn names(json: &Path, others: &[PathBuf]) -> String {
    std::iter::once(json.display().to_string())
        .chain(others.iter().map(|p| {
            p.file_name()
                .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
        }))
        .collect::<Vec<_>>()
        .join(", ")
}

/// For prefix workloads: the offered rate and the cache-blind reuse it was calibrated on.
pub(crate) fn calibration(s: &Scenario, seed: u64, load: f64) {
    if let Some(r) = scenario::blind_estimate(s, seed) {
        println!(
            "offered {:.2} req/s: {load:.2} × capacity on the prompt tokens a cache-blind fleet computes \
             (estimated hit rate {:.1}%, mean prompt {:.0}, uncached {:.0}, output {:.0} tokens)",
            scenario::offered_rate(s, seed, load),
            r.hit_rate() * 100.0,
            r.mean_prompt,
            r.mean_uncached,
            r.mean_output
        );
    }
}

fn trace(t: &TraceArgs) -> Result<()> {
    let arrivals = scenario::named_arrivals(&t.workload, t.seed, (t.load, t.rate, t.duration))
        .map_err(anyhow::Error::msg)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    loadlink_bench::workload::write_trace(&arrivals, &mut out)?;
    out.flush()?;
    Ok(())
}

fn replot(file: &Path) -> Result<()> {
    let (wrote, skipped) =
        plot::from_json(file).with_context(|| format!("plotting {}", file.display()))?;
    for s in &skipped {
        eprintln!("not drawn: {s}");
    }
    if wrote.is_empty() {
        anyhow::bail!("nothing to plot in {}", file.display());
    }
    for p in &wrote {
        println!("wrote {}", p.display());
    }
    Ok(())
}
