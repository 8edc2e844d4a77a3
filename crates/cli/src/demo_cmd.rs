//! `loadlink demo`: flags for [`loadlink_bench::demo`], which runs the whole system in one process
//! (simulated engines, an engine-load router and an in-flight router, routed and direct clients)
//! and compares time to first token through each router.

use anyhow::Result;
use clap::Args;
use loadlink_bench::demo::{DemoConfig, run_demo};
use loadlink_bench::demo_traffic::DemoWorkload;

#[derive(Args)]
pub struct DemoArgs {
    /// Number of simulated engines.
    #[arg(long, default_value_t = 3)]
    engines: usize,
    /// Seconds to run (Ctrl-C stops earlier).
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// Concurrent clients sending through the routers (half through each).
    #[arg(long, default_value_t = 24)]
    clients: usize,
    /// Concurrent clients talking directly to the first engine (load no router sees).
    #[arg(long, default_value_t = 20)]
    direct_clients: usize,
    /// Engine speed-up over real time.
    #[arg(long, default_value_t = 4.0)]
    time_scale: f64,
    /// Output tokens per request.
    #[arg(long, default_value_t = 120)]
    max_tokens: u64,
    /// Running-batch limit per engine (small, so queues form and load differences show).
    #[arg(long, default_value_t = 8)]
    max_running_requests: usize,
    /// Port of the engine-load router (its /workers and /metrics are live during the demo).
    #[arg(long, default_value_t = 30080)]
    router_port: u16,
    /// What clients send: single (one short prompt, load alone decides) or chat (multi-turn
    /// sessions of 4 tenants with long system prompts: prefix reuse for the cache-aware router).
    #[arg(long, default_value = "single", value_parser = DemoWorkload::parse)]
    workload: DemoWorkload,
}

pub fn run(a: DemoArgs) -> Result<()> {
    let cfg = DemoConfig {
        engines: a.engines,
        duration_s: a.duration,
        clients: a.clients,
        direct_clients: a.direct_clients,
        time_scale: a.time_scale,
        max_tokens: a.max_tokens,
        max_running_requests: a.max_running_requests,
        router_port: a.router_port,
        workload: a.workload,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_demo(&cfg, |line| println!("{line}")))
        .map_err(anyhow::Error::msg)
}
