//! `loadlink bench sim --variants overload`: the admission-control comparison under overload
//! (`loadlink_bench::overload`), its flags (the router's admission flags of the same names, plus
//! the TTFT budget goodput is counted against), table and JSON.

use anyhow::Result;
use clap::Args;
use loadlink_bench::overload::{self, OverloadParams};
use loadlink_bench::scenario::{self, Scenario};
use std::io::Write;
use std::path::Path;

/// Flags of `--variants overload`.
#[derive(Args)]
pub struct OverloadArgs {
    /// Goodput counts completed requests whose TTFT is at most this (virtual ms).
    #[arg(long, default_value_t = 1000)]
    ttft_budget_ms: u64,
    /// The admission variants' `--max-predicted-wait-ms`.
    #[arg(long, default_value_t = 500)]
    max_predicted_wait_ms: u64,
    /// Also a reject variant with this `--max-engine-requests`.
    #[arg(long)]
    max_engine_requests: Option<i64>,
    /// Also the predicted-wait variants with `--admission-spare-running` (the caps refuse new
    /// sessions, not the turns of running ones).
    #[arg(long)]
    admission_spare_running: bool,
    /// The queue variant's `--admission-queue-size` (per router replica).
    #[arg(long, default_value_t = 32)]
    admission_queue_size: usize,
    /// The queue variant's `--admission-queue-timeout-ms`.
    #[arg(long, default_value_t = 500)]
    admission_queue_timeout_ms: u64,
    /// How many times a client sends a refused request again, after the 429's `Retry-After` (the
    /// OpenAI and Anthropic SDKs default to 2). 0: it gives up at the first refusal, and a
    /// closed-loop session ends there.
    #[arg(long, default_value_t = 0)]
    client_retries: u32,
}

impl OverloadArgs {
    fn params(&self) -> OverloadParams {
        OverloadParams {
            ttft_budget_ms: self.ttft_budget_ms,
            max_predicted_wait_ms: self.max_predicted_wait_ms,
            max_engine_requests: self.max_engine_requests,
            spare_running: self.admission_spare_running,
            queue_size: self.admission_queue_size,
            queue_timeout_ms: self.admission_queue_timeout_ms,
            client_retries: self.client_retries,
        }
    }
}

/// Runs the comparison; writes `{scenario}-overload-load{L}-seed{seed}.json` in `out`.
pub fn run(a: &OverloadArgs, s: &Scenario, seed: u64, load: f64, out: &Path) -> Result<()> {
    let p = a.params();
    let arrivals = scenario::arrivals(s, seed, load);
    let rows = overload::compare(s, &arrivals, &p, |label| {
        eprint!("\r{label:<60}");
        let _ = std::io::stderr().flush();
    });
    eprintln!();
    print!("{}", overload::table(&rows, &p));
    let doc = serde_json::json!({
        "scenario": s.name, "about": s.about, "seed": seed, "load": load,
        "duration_s": s.duration_s, "offered": arrivals.len(),
        "ttft_budget_ms": p.ttft_budget_ms, "max_predicted_wait_ms": p.max_predicted_wait_ms,
        "max_engine_requests": p.max_engine_requests,
        "admission_spare_running": p.spare_running, "admission_queue_size": p.queue_size,
        "admission_queue_timeout_ms": p.queue_timeout_ms, "client_retries": p.client_retries,
        "rows": overload::rows_json(&rows),
    });
    let path = out.join(format!("{}-overload-load{load:.2}-seed{seed}.json", s.name));
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    println!("wrote {}", path.display());
    Ok(())
}
