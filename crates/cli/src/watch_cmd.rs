//! `loadlink watch`: flags for the router crate's live view of engines' load sockets
//! (`loadlink_router::watch`).
//!
//! Targets are worker URLs (discovered through `/server_info`, exactly as the router does) or
//! `tcp://HOST:PORT` load endpoints. Both wire generations are decoded. `--json` prints one line
//! per message for scripts instead of the table.

use anyhow::Result;
use clap::Args;
use loadlink_router::watch::{LoadWatch, WatchOptions, resolve};
use std::time::Duration;

#[derive(Args)]
pub struct WatchArgs {
    /// Worker URLs (http://HOST:PORT, discovered via /server_info) or load endpoints (tcp://HOST:PORT).
    #[arg(required = true)]
    targets: Vec<String>,
    /// Print one JSON line per message instead of the live table.
    #[arg(long)]
    json: bool,
    /// Table refresh period (ms).
    #[arg(long, default_value_t = 500)]
    refresh_ms: u64,
    /// Stop after this many seconds (0: until Ctrl-C).
    #[arg(long, default_value_t = 0.0)]
    duration: f64,
}

pub fn run(a: WatchArgs) -> Result<()> {
    let opts = WatchOptions {
        json: a.json,
        refresh: Duration::from_millis(a.refresh_ms),
        duration: Duration::try_from_secs_f64(a.duration)
            .ok()
            .filter(|d| !d.is_zero()),
    };
    let sockets = crate::runtime()?.block_on(resolve(&a.targets))?;
    LoadWatch::open(sockets)?.run(&opts, &mut std::io::stdout().lock())?;
    Ok(())
}
