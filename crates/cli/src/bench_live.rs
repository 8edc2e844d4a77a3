//! `loadlink bench live`: a scenario's trace on real `loadlink engine` processes, through
//! loadlink's router variants and external routers (SMG, sglang-router) started from command
//! templates, with `--ranks` for engines of several DP ranks; its flags, table, JSON and plots.

use crate::bench_cmd::Common;
use anyhow::Result;
use clap::Args;
use loadlink_bench::live::AdapterField;
use loadlink_bench::live::{ExternalRouter, LiveVariant};
use loadlink_bench::plot;
use loadlink_bench::report::{json_text, row_json_with_samples, table};
use std::io::Write;

#[derive(Args)]
pub struct LiveArgs {
    #[command(flatten)]
    common: Common,
    /// Engine --time-scale: arrivals are sent K times faster and times are scaled back by K.
    #[arg(long, default_value_t = 4.0)]
    time_scale: f64,
    /// Virtual seconds of arrivals per variant (bounded so a run takes minutes, not hours).
    #[arg(long, default_value_t = 120.0)]
    duration: f64,
    /// A loadlink variant, POLICY/SIGNAL (`loadlink route --policy POLICY --load-signal SIGNAL`),
    /// e.g. power_of_two/backlog; repeatable, run in the order given. Without --variant or
    /// --external-router: the simulation's seven variants. On the PD fleet of `--scenario s6`
    /// (2 prefill + 2 decode engines, `--prefill-engines`): `loadlink route --pd --prefill-policy POLICY --load-signal
    /// SIGNAL`, and POLICY/SIGNAL+DECODE adds `--decode-policy DECODE`.
    #[arg(long = "variant", value_name = "POLICY/SIGNAL", value_parser = LiveVariant::parse_loadlink)]
    variants: Vec<LiveVariant>,
    /// An external router as a variant, NAME=COMMAND, run after the --variant ones; repeatable.
    /// One process per router replica, on the same engines and trace. COMMAND is whitespace-split
    /// (no shell) with placeholders {workers} (engine URLs), {port} (its HTTP port), {metrics_port}
    /// (a second free port) and {replica} (0-based); on the PD fleet of `--scenario s6`,
    /// {pd_workers} instead of {workers} (`--prefill URL BOOTSTRAP_PORT … --decode URL …`, e.g.
    /// 'smg=smg-1.13 launch --pd-disaggregation {pd_workers} --host 127.0.0.1 --port {port}
    /// --prometheus-port {metrics_port}'). Requests then also carry `model` and a text
    /// `prompt` (docs/benchmarks.md). E.g. 'sglang-cache_aware=python -m
    /// sglang_router.launch_router --worker-urls {workers} --host 127.0.0.1 --port {port}
    /// --prometheus-port {metrics_port} --policy cache_aware'
    #[arg(long = "external-router", value_name = "NAME=COMMAND", value_parser = ExternalRouter::parse)]
    external_routers: Vec<ExternalRouter>,
    /// DP ranks per engine: the scenario's schedulers regrouped into engines of R ranks each
    /// (`loadlink engine --dp-size R`; the scenario's engine count must be a multiple of R). The
    /// trace is the same (calibration counts schedulers), so 1 and R compare the same load.
    #[arg(long, default_value_t = 1)]
    ranks: usize,
    /// How a request of a many-model trace (`--scenario models`) names its LoRA adapter: colon
    /// (`model: "base:adapter"`, SGLang), name (`model: "adapter"`, vLLM) or lora-path
    /// (`model: "base"` and `lora_path: "adapter"`).
    #[arg(long, default_value = "colon", value_parser = AdapterField::parse)]
    adapter_field: AdapterField,
    /// On the PD fleet of `--scenario s6`: how many of its 4 engines are prefill engines (the rest
    /// decode), 1 to 3. The simulator's S6 shows 2 + 2 is decode-bound on S3's mix and 1 + 3 is not.
    #[arg(long, default_value_t = loadlink_bench::scenario::pd::PREFILL_ENGINES)]
    prefill_engines: usize,
    /// Add issue 24's burst to the trace: --load is the base, and for 30 s the arrivals come 1.5×
    /// as fast (sessions kept whole: time is warped, no second workload is drawn; `--load 0.8`
    /// is the simulated burst's 80% → 120%). The burst starts halfway through the rest of
    /// --duration on a 10 s boundary (150 s: 60 s before, 60 s after), at most 300 s in, and
    /// each variant reports its p50 TTFT per 10 s window of arrivals and its recovery time.
    #[arg(long)]
    burst: bool,
    /// How many times the client sends a request again after a 429, waiting the response's
    /// `Retry-After` (the OpenAI SDK's rule: its default is 2). 0: the first refusal is final and
    /// ends a closed-loop session. Refusals, retries and abandoned turns are reported per variant.
    #[arg(long, default_value_t = 0)]
    client_retries: u32,
    /// Also report each variant's figures over the requests arriving after this many virtual
    /// seconds (hit rate over the prompt tokens computed after it), beside the whole run's: every
    /// run starts with empty caches, and a prefix workload's cold start is the same for every
    /// router. 0: the whole run only.
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
}

pub fn run(a: LiveArgs) -> Result<()> {
    if !(a.time_scale > 0.0 && a.duration > 0.0) {
        anyhow::bail!("--time-scale and --duration must be > 0");
    }
    if !(0.0..a.duration).contains(&a.warmup) {
        anyhow::bail!(
            "--warmup {}: expected 0 or more and less than --duration {}",
            a.warmup,
            a.duration
        );
    }
    let (mut s, load) = a.common.scenario()?;
    if a.ranks == 0 || s.engines % a.ranks != 0 {
        anyhow::bail!(
            "--ranks {}: expected a divisor of the scenario's {} engines",
            a.ranks,
            s.engines
        );
    }
    // S6 runs live on its PD fleet (its aggregated baseline is S3 on the same trace).
    let pd_prefill = (s.name == "s6").then_some(a.prefill_engines);
    if pd_prefill.is_some() && !(1..s.engines).contains(&a.prefill_engines) {
        anyhow::bail!(
            "--prefill-engines {}: expected 1 to {} (the rest of the {} engines decode)",
            a.prefill_engines,
            s.engines - 1,
            s.engines
        );
    }
    if pd_prefill.is_some() && a.ranks != 1 {
        anyhow::bail!(
            "--ranks {}: the PD fleet of s6 runs one-rank engines",
            a.ranks
        );
    }
    (s.engines, s.ranks) = (s.engines / a.ranks, a.ranks);
    let burst = match a.burst {
        true => Some(
            loadlink_bench::live::burst::live_burst(a.duration, load)
                .map_err(anyhow::Error::msg)?,
        ),
        false => None,
    };
    let (seed, out) = (a.common.seed, &a.common.out);
    let cfg = loadlink_bench::live::LiveConfig {
        exe: std::env::current_exe()?,
        load,
        scenario: s.clone(),
        seed,
        time_scale: a.time_scale,
        duration_s: a.duration,
        variants: live_variants(&a),
        adapter_field: a.adapter_field,
        pd_prefill,
        burst: burst.map(|f| f.burst),
        client_retries: a.client_retries,
    };
    println!(
        "live {} on {} engines × {} ranks: {} (seed {seed}, load {:.2}, {} virtual s per variant at time-scale {}, publish point {})",
        s.name,
        s.engines,
        s.ranks,
        s.about,
        cfg.load,
        a.duration,
        a.time_scale,
        s.publish_point.as_str()
    );
    crate::bench_cmd::calibration(&s, seed, load);
    if let Some(f) = &burst {
        let b = f.burst;
        println!(
            "burst: {:.2} of capacity, {:.2} from {} s for {} s, then {:.2} again{}",
            b.base,
            b.peak,
            b.start_s,
            b.len_s,
            b.base,
            if f.short {
                " (a short run: under 60 s before or after the burst, figures are a dry run's)"
            } else {
                ""
            }
        );
    }
    let load_average_start = load_average();
    let started = std::time::Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let rows = rt
        .block_on(loadlink_bench::live::run_live(&cfg, |m| {
            eprint!("\r[{:>5.0}s] {m:<60}", started.elapsed().as_secs_f64());
            let _ = std::io::stderr().flush();
        }))
        .map_err(anyhow::Error::msg)?;
    eprintln!();
    print!("{}", table(&rows));
    for (label, o) in rows.iter().map(|r| (&r.label, &r.outcome)) {
        if o.rejected + o.retried + o.abandoned > 0 {
            println!(
                "{label}: {} refused for good (429, {} retries spent), {} refusals retried, {} \
                 closed-loop turns abandoned",
                o.rejected, a.client_retries, o.retried, o.abandoned
            );
        }
    }
    if pd_prefill.is_some() {
        print!("{}", loadlink_bench::scenario::pd::live_table(&rows));
    }
    let recoveries = burst.map(|f| {
        let named = rows.iter().map(|r| (r.label.as_str(), &r.outcome));
        loadlink_bench::live::burst::recoveries(named, &f.burst, a.duration)
    });
    if let Some(rs) = &recoveries {
        print!("{}", loadlink_bench::live::burst::recovery_table(rs));
    }
    use loadlink_bench::live::cache_series::{AfterWarmup, warmup_table};
    let warm: Vec<AfterWarmup> = match a.warmup > 0.0 {
        true => rows
            .iter()
            .map(|r| AfterWarmup::of(&r.label, &r.outcome, a.warmup))
            .collect(),
        false => Vec::new(),
    };
    if !warm.is_empty() {
        print!("{}", warmup_table(&warm));
    }
    // The raw samples go in too, so `bench plot` can redraw without a rerun.
    let mut doc = serde_json::json!({ "scenario": s.name, "mode": "live", "seed": seed, "publish_point": s.publish_point.as_str(), "time_scale": a.time_scale, "duration_s": a.duration, "wall_s": started.elapsed().as_secs_f64(), "rows": rows.iter().map(row_json_with_samples).collect::<Vec<_>>() });
    // How busy the machine was (live figures move with it), and what any external router ran.
    doc["load_average"] = serde_json::json!({ "start": load_average_start, "end": load_average() });
    if let (Some(f), Some(rs)) = (&burst, &recoveries) {
        let b = f.burst;
        doc["burst"] = serde_json::json!({ "start_s": b.start_s, "len_s": b.len_s, "base": b.base, "peak": b.peak, "short": f.short });
        doc["recovery"] = rs.iter().map(|r| r.json()).collect();
    }
    if !warm.is_empty() {
        doc["after_warmup"] = warm.iter().map(AfterWarmup::json).collect();
    }
    if !a.external_routers.is_empty() {
        doc["external_routers"] = a
            .external_routers
            .iter()
            .map(|e| serde_json::json!({ "variant": e.name, "command": e.template() }))
            .collect();
    }
    // A burst run is written beside the steady run of the same scenario, not over it.
    let kind = if burst.is_some() { "-burst" } else { "" };
    let path = out.join(format!(
        "{}-live{kind}{}.json",
        s.name,
        crate::bench_cmd::point_suffix(&s)
    ));
    std::fs::write(&path, json_text(&doc))?;
    let plots = plot::ttft_cdf(
        &out.join(format!(
            "{}-live{kind}{}-ttft-cdf",
            s.name,
            crate::bench_cmd::point_suffix(&s)
        )),
        &plot::ttft_title(s.name, true, s.publish_point.as_str(), load),
        &rows,
    )?;
    println!(
        "wrote {} ({:.0} s wall)",
        crate::bench_cmd::names(&path, &plots),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The variants `bench live` runs: the named ones, or the simulation's list.
fn live_variants(a: &LiveArgs) -> Vec<LiveVariant> {
    let named = a.variants.iter().cloned();
    let external = a
        .external_routers
        .iter()
        .cloned()
        .map(LiveVariant::External);
    let all: Vec<LiveVariant> = named.chain(external).collect();
    if all.is_empty() {
        LiveVariant::defaults()
    } else {
        all
    }
}

/// The 1, 5 and 15 minute load averages (`/proc/loadavg`), when the system says.
fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}
