//! Logs for people and for log shippers.
//!
//! Logs go to stderr (stdout carries command output such as `watch --json`). Colour codes are
//! written only when stderr is a terminal, so a file, a pipe or a container log never receives
//! ANSI escapes. `--log-format json` writes one JSON object per line (timestamp, level, target,
//! message and the event's fields) for shippers that parse structure. The level filter is
//! `RUST_LOG` (tracing-subscriber's `EnvFilter` syntax, e.g. `RUST_LOG=loadlink_router=debug,info`),
//! default `info`.

use clap::ValueEnum;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}
