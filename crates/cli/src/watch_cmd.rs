//! `loadlink watch`: flags for the router crate's live view of engines' load sockets
//! (`loadlink_router::watch`).
//!
//! Targets are worker URLs (discovered through `/server_info`, exactly as the router does) or
//! `tcp://HOST:PORT` load endpoints. Both wire generations are decoded. `--json` prints one line
//! per message for scripts instead of the table. `--router URL` shows a running router's view
//! instead: each worker and each DP rank as a candidate, with what the router routed there
//! (`loadlink_router::watch_router`).

use anyhow::Result;
use clap::Args;
use loadlink_router::watch::{LoadWatch, WatchOptions, resolve};
use std::time::Duration;

#[derive(Args)]
pub struct WatchArgs {
    /// Worker URLs (http://HOST:PORT, discovered via /server_info) or load endpoints (tcp://HOST:PORT).
    #[arg(required_unless_present = "router")]
    targets: Vec<String>,
    /// Watch a running loadlink router instead (its /workers): per worker and per DP rank, the
    /// load it prices, what it routed there by name, the share it believed cached, the blocks
    /// its KV index holds. With --json: one /workers document per refresh.
    #[arg(long, value_name = "URL", conflicts_with = "targets")]
    router: Option<String>,
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
    if let Some(url) = &a.router {
        return watch_router(url, &opts);
    }
    let sockets = crate::runtime()?.block_on(resolve(&a.targets))?;
    LoadWatch::open(sockets)?.run(&opts, &mut std::io::stdout().lock())?;
    Ok(())
}

/// `--router URL`: the router's `/workers`, redrawn every refresh until the duration ends.
fn watch_router(url: &str, opts: &WatchOptions) -> Result<()> {
    use loadlink_router::watch_router::{fetch_workers, screen};
    use std::io::Write;
    let rt = crate::runtime()?;
    let client = loadlink_router::fleet::http_client();
    let end = opts.duration.map(|d| std::time::Instant::now() + d);
    let mut out = std::io::stdout().lock();
    loop {
        let doc = rt
            .block_on(fetch_workers(&client, url))
            .map_err(anyhow::Error::msg)?;
        match opts.json {
            true => writeln!(out, "{doc}")?,
            false => out.write_all(screen(&doc).as_bytes())?,
        }
        out.flush()?;
        if end.is_some_and(|e| std::time::Instant::now() + opts.refresh > e) {
            return Ok(());
        }
        std::thread::sleep(opts.refresh);
    }
}
