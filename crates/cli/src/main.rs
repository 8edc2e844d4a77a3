//! The `loadlink` binary: flag parsing only; the work lives in the library crates.

mod bench_cmd;
mod bench_live;
mod bench_models;
mod bench_overload;
mod bench_pd;
mod bench_ranks;
mod bench_sweep;
mod bench_tiers;
mod config_file;
mod demo_cmd;
mod engine_cmd;
mod logging;
mod publish_cmd;
mod route_budget_args;
mod route_cmd;
mod route_pd_args;
mod route_policy_args;
mod seconds;
mod soak_cmd;
mod watch_cmd;
mod wire_cmd;

use clap::{Parser, Subcommand};

/// loadlink: LLM engines publish their real queue depth; routers route on it.
#[derive(Parser)]
#[command(
    name = "loadlink",
    version,
    about,
    long_about = None,
    after_help = "Logs go to stderr. RUST_LOG sets the level filter (default info; e.g. \
                  RUST_LOG=loadlink_router=debug,info). Colour only when stderr is a terminal."
)]
struct Cli {
    /// Log line format on stderr: text (human-readable) or json (one object per line, for log
    /// shippers).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        env = "LOADLINK_LOG_FORMAT"
    )]
    log_format: logging::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Experiments: engine-reported load vs in-flight routing.
    #[command(subcommand)]
    Bench(bench_cmd::BenchCommand),
    /// The whole system in one command: engines publishing load, an engine-load router and an
    /// in-flight router, routed and direct traffic, a live table and a TTFT comparison.
    Demo(demo_cmd::DemoArgs),
    /// Run a simulated SGLang-compatible engine that publishes its real load.
    Engine(engine_cmd::EngineArgs),
    /// Run the load-aware router in front of one or more engines.
    Route(Box<route_cmd::RouteArgs>),
    /// Run a load publisher for one or more ranks with a synthetic, changing load (for trying a
    /// router or `wire listen` against real sockets without an engine).
    Publish(publish_cmd::PublishArgs),
    /// Watch engines' load sockets live (worker URLs are discovered via /server_info).
    Watch(watch_cmd::WatchArgs),
    /// Protocol tools: encode/decode payloads, resolve port ranges, read/write SHM slot files,
    /// listen to a load socket. JSON in and out, one item per line.
    #[command(subcommand)]
    Wire(wire_cmd::WireCommand),
}

/// A multi-threaded tokio runtime for the serving commands.
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// What ended [`until_stopped`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// `--duration` passed.
    Elapsed,
    /// SIGINT (Ctrl-C): someone at a terminal; no drain delay.
    Interrupt,
    /// SIGTERM (Kubernetes, systemd, `docker stop`): a load balancer may still send traffic, so
    /// the drain delay applies.
    Terminate,
}

/// Returns after `duration` seconds (0: never; checked by [`seconds::run_duration`]), or on
/// SIGINT (Ctrl-C) or SIGTERM, whichever comes first, saying which. Either signal means: drain
/// and exit.
pub(crate) async fn until_stopped(duration: f64) -> Stop {
    let timer = async {
        match std::time::Duration::try_from_secs_f64(duration) {
            Ok(d) if !d.is_zero() => tokio::time::sleep(d).await,
            _ => std::future::pending::<()>().await,
        }
    };
    let sigterm = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM ({e}); only Ctrl-C stops gracefully");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = timer => Stop::Elapsed,
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("SIGINT: draining");
            Stop::Interrupt
        }
        _ = sigterm => {
            tracing::info!("SIGTERM: draining");
            Stop::Terminate
        }
    }
}

fn main() {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    let result = match cli.command {
        Command::Bench(c) => bench_cmd::run(c),
        Command::Demo(a) => demo_cmd::run(a),
        Command::Engine(a) => engine_cmd::run(a),
        Command::Publish(a) => publish_cmd::run(a),
        Command::Route(a) => route_cmd::run(*a),
        Command::Watch(a) => watch_cmd::run(a),
        Command::Wire(c) => wire_cmd::run(c),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
