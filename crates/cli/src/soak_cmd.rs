//! `loadlink bench soak`: issue 19's acceptance run (`loadlink_bench::soak`), flags only.

use anyhow::{Context, Result};
use clap::Args;
use std::time::Duration;

#[derive(Args)]
pub struct SoakArgs {
    /// Seconds of hostile workers under load.
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Healthy engines.
    #[arg(long, default_value_t = 4)]
    engines: usize,
    /// Client requests a second through the router.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Messages a second from the garbage publishers (all their sockets together).
    #[arg(long, default_value_t = 5000)]
    flood: u64,
    /// Seconds between removing and registering the hostile workers again (0: never).
    #[arg(long, default_value_t = 20.0)]
    churn: f64,
    /// Hostile workers to run, comma-separated: stall, dribble, huge, ranks-json, ranks-metrics,
    /// garbage-pub (default: all).
    #[arg(long, value_delimiter = ',')]
    hostile: Vec<String>,
}

pub fn run(a: SoakArgs) -> Result<()> {
    let secs = |name: &str, v: f64| {
        Duration::try_from_secs_f64(v)
            .map_err(|_| anyhow::anyhow!("--{name}: expected seconds ≥ 0, got {v}"))
    };
    let s = loadlink_bench::soak::Soak {
        exe: std::env::current_exe().context("locating the loadlink binary")?,
        duration: secs("duration", a.duration)?,
        engines: a.engines.max(1),
        rate: a.rate,
        flood_per_s: a.flood,
        churn: secs("churn", a.churn)?,
        hostile: if a.hostile.is_empty() {
            loadlink_bench::soak::hostile::KINDS
                .map(String::from)
                .to_vec()
        } else {
            a.hostile
        },
    };
    let r = crate::runtime()?
        .block_on(loadlink_bench::soak::run(&s))
        .map_err(anyhow::Error::msg)?;
    print!("{}", r.text(&s));
    if !r.passed() {
        std::process::exit(1);
    }
    Ok(())
}
