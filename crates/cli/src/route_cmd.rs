//! `loadlink route`: flags in the style of sglang-router (or a JSON config file) → `RouterConfig`.
//!
//! Every default comes from [`RouterConfig::default`] (never a literal repeated here), and
//! `--config FILE` is read through these same definitions ([`crate::config_file`]): its keys are
//! the flag names in snake_case, so every flag can be set from the file.

use anyhow::Result;
use clap::Args;
use loadlink_router::config::drain_seconds;
use loadlink_router::membership::{DnsTarget, MembershipConfig};
use loadlink_router::{LoadSignal, Policy, RouterConfig};
use serde::{Deserialize, Serialize};

/// The defaults every flag shows and starts from.
fn d() -> RouterConfig {
    RouterConfig::default()
}

#[derive(Args, Serialize, Deserialize)]
pub struct RouteArgs {
    /// Worker base URLs (http://HOST:PORT), space- or comma-separated.
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    worker_urls: Vec<String>,
    /// A file of worker URLs, one per line (`#` comments), re-read when it changes (checked every
    /// second): workers it adds are discovered and subscribed, workers it drops finish their open
    /// requests and leave. Combines with --worker-urls and --worker-dns.
    #[arg(long)]
    worker_urls_file: Option<std::path::PathBuf>,
    /// Workers from DNS, re-resolved every --worker-dns-interval-ms: NAME:PORT takes every A/AAAA
    /// record of NAME (a Kubernetes headless Service: engines.NAMESPACE.svc.cluster.local:30000);
    /// srv:NAME takes SRV records (host and port from each). Repeatable. A failed lookup keeps the
    /// current workers.
    #[arg(long)]
    worker_dns: Vec<String>,
    /// How often --worker-dns names are re-resolved (ms).
    #[arg(long, default_value_t = d().membership.dns_interval_ms)]
    worker_dns_interval_ms: u64,
    /// The DNS server to ask (IP:PORT); default: the system's resolver configuration.
    #[arg(long)]
    dns_server: Option<std::net::SocketAddr>,
    /// The model a request goes to when it names none (`/generate`, or OpenAI's `model` absent or
    /// SGLang's placeholder "default"). Without it: the only model the fleet serves; with several,
    /// such a request is answered 400. A request naming a model no worker serves is answered 404
    /// model_not_found. See docs/router.md, "Models and adapters".
    #[arg(long)]
    default_model: Option<String>,
    /// How often every worker's served models and adapters are re-read (seconds; 0: only when the
    /// worker is discovered). A worker restarted with another model is re-registered within this.
    #[arg(long, default_value_t = d().model_refresh_ms as f64 / 1000.0, value_parser = model_refresh)]
    model_refresh_interval: f64,
    /// min_ttft (the least predicted time to first token: engine backlog, this request's
    /// uncached tokens there, that engine's measured prefill speed) | cache_aware (SGLang's
    /// algorithm) | power_of_two | least_load | round_robin | random. See docs/router.md.
    #[arg(long, default_value_t = d().policy.as_str().to_string(), value_parser = policy_name)]
    policy: String,
    #[command(flatten)]
    #[serde(flatten)]
    cache: crate::route_policy_args::CacheArgs,
    #[command(flatten)]
    #[serde(flatten)]
    admission: crate::route_policy_args::AdmissionArgs,
    #[command(flatten)]
    #[serde(flatten)]
    budgets: crate::route_budget_args::BudgetArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pd: crate::route_pd_args::PdArgs,
    /// engine: price workers on engine-reported queue depth (running + waiting); backlog: on the
    /// engine-reported prefill backlog in tokens (a proxy for time to first token); both fall back
    /// to in-flight when stale or absent. inflight: only this router's own in-flight count.
    #[arg(long, default_value_t = d().load_signal.as_str().to_string(), value_parser = signal_name)]
    load_signal: String,
    /// Address to serve on.
    #[arg(long, default_value_t = d().host)]
    host: String,
    /// Port to serve on (0: pick a free one and print it).
    #[arg(long, default_value_t = d().port)]
    port: u16,
    /// Metrics are served on the main port at /metrics; accepted for sglang-router compatibility.
    #[arg(long)]
    prometheus_port: Option<u16>,
    /// A worker's engine load is used only while every rank's last message is younger than this.
    #[arg(long, default_value_t = d().freshness_ms)]
    freshness_ms: u64,
    /// Largest accepted request body (bytes); larger ones get 413.
    #[arg(long, default_value_t = d().max_body_bytes)]
    max_body_bytes: usize,
    /// A request body must arrive within this many ms (bounds slow-body clients); else 408.
    #[arg(long, default_value_t = d().body_timeout_ms)]
    body_timeout_ms: u64,
    /// Retries on another worker after a connect error or 502/503/504 (before any byte is sent).
    #[arg(long, default_value_t = d().max_retries)]
    max_retries: u32,
    /// Consecutive failures that open a worker's circuit breaker.
    #[arg(long, default_value_t = d().breaker_threshold)]
    breaker_threshold: u64,
    /// How long an open breaker keeps a worker out of rotation (ms).
    #[arg(long, default_value_t = d().breaker_cooldown_ms)]
    breaker_cooldown_ms: u64,
    /// Interval of the /health checks (ms).
    #[arg(long, default_value_t = d().health_interval_ms)]
    health_interval_ms: u64,
    /// Threads that receive all load subscriptions (epoll over libzmq's ZMQ_FD; one serves
    /// hundreds of thousands of messages a second).
    #[arg(long, default_value_t = d().ingest_threads)]
    ingest_threads: usize,
    /// Bound on distinct KV blocks in the router's cache index (fed by workers' KV-event
    /// streams). Past it new blocks are dropped and counted (loadlink_kv_index_dropped_blocks_total)
    /// and their ranks marked for resync; about 100 bytes per block.
    #[arg(long, default_value_t = d().kv_index_max_blocks)]
    kv_index_max_blocks: usize,
    /// Workers without a load socket are polled for their load (`GET /v1/loads`, else scheduler
    /// gauges on `GET /metrics`) every this many ms (0: never; they are priced on in-flight).
    /// Push is preferred when a worker has it.
    #[arg(long, default_value_t = d().load_poll_interval_ms)]
    load_poll_interval_ms: u64,
    /// A load poll (connect, answer and body) not done within this many ms fails and is counted
    /// (loadlink_worker_load_poll_timeouts_total).
    #[arg(long, default_value_t = d().load_poll_timeout_ms)]
    load_poll_timeout_ms: u64,
    /// `GET /server_info` discoveries in flight at once at start.
    #[arg(long, default_value_t = d().discovery_concurrency)]
    discovery_concurrency: usize,
    /// Bearer token that enables POST/DELETE /workers (the admin API is off without it).
    #[arg(long, env = "LOADLINK_ADMIN_TOKEN")]
    admin_token: Option<String>,
    /// JSON config file: an object whose keys are this command's flag names in snake_case
    /// (worker_urls, policy, port, max_ranks, drain_timeout, …) with the flag's value (a list for
    /// repeatable flags, true/false for switches); its values override the flags.
    #[arg(long)]
    #[serde(skip)]
    config: Option<std::path::PathBuf>,
    /// Stop after this many seconds (0: until SIGINT or SIGTERM).
    #[arg(long, default_value_t = 0.0, value_parser = crate::seconds::run_duration)]
    duration: f64,
    /// On SIGTERM, how many seconds /readiness answers 503 while requests are still served,
    /// before the listener closes: the time a load balancer needs to take the router out of
    /// rotation. SIGINT (Ctrl-C) and the end of --duration skip it. 0 to 86400.
    #[arg(
        long,
        default_value_t = d().drain_delay.as_secs_f64(),
        env = "LOADLINK_DRAIN_DELAY",
        value_parser = crate::seconds::drain_delay
    )]
    drain_delay: f64,
    /// Then stop accepting connections and let open requests (streams included) finish for at
    /// most this many seconds, and exit. Set the orchestrator's grace period (Kubernetes
    /// `terminationGracePeriodSeconds`) above --drain-delay plus this. 0 to 86400.
    #[arg(
        long,
        default_value_t = d().drain_timeout.as_secs_f64(),
        env = "LOADLINK_DRAIN_TIMEOUT",
        value_parser = crate::seconds::drain_timeout
    )]
    drain_timeout: f64,
}

/// `--model-refresh-interval`: seconds, 0 (off) to a day.
fn model_refresh(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("expected seconds (a number), got {s:?}"))?;
    if !(0.0..=86_400.0).contains(&v) {
        return Err(format!("expected 0 to 86400 seconds, got {v}"));
    }
    Ok(v)
}

fn policy_name(s: &str) -> Result<String, String> {
    Policy::parse(s).map(|_| s.to_string())
}

fn signal_name(s: &str) -> Result<String, String> {
    LoadSignal::parse(s).map(|_| s.to_string())
}

impl RouteArgs {
    /// The router's configuration. Values from a `--config` file went through serde, not clap's
    /// parsers, so every value is checked here again, naming its flag.
    fn router_config(&self) -> Result<RouterConfig> {
        let mut cfg = RouterConfig {
            host: self.host.clone(),
            port: self.port,
            worker_urls: self.worker_urls.clone(),
            policy: Policy::parse(&self.policy)
                .map_err(|e| anyhow::anyhow!("--policy {:?}: {e}", self.policy))?,
            load_signal: LoadSignal::parse(&self.load_signal).map_err(anyhow::Error::msg)?,
            freshness_ms: self.freshness_ms,
            max_body_bytes: self.max_body_bytes,
            body_timeout_ms: self.body_timeout_ms,
            max_retries: self.max_retries,
            breaker_threshold: self.breaker_threshold.max(1),
            breaker_cooldown_ms: self.breaker_cooldown_ms,
            health_interval_ms: self.health_interval_ms,
            ingest_threads: self.ingest_threads.max(1),
            kv_index_max_blocks: self.kv_index_max_blocks.max(1),
            discovery_concurrency: self.discovery_concurrency.max(1),
            admin_token: self.admin_token.clone(),
            load_poll_interval_ms: self.load_poll_interval_ms,
            load_poll_timeout_ms: self.load_poll_timeout_ms.max(1),
            membership: MembershipConfig {
                urls_file: self.worker_urls_file.clone(),
                dns: self
                    .worker_dns
                    .iter()
                    .map(|d| DnsTarget::parse(d))
                    .collect::<Result<_, _>>()
                    .map_err(anyhow::Error::msg)?,
                dns_server: self.dns_server,
                dns_interval_ms: self.worker_dns_interval_ms.max(100),
            },
            drain_delay: drain_seconds("--drain-delay", self.drain_delay)
                .map_err(anyhow::Error::msg)?,
            drain_timeout: drain_seconds("--drain-timeout", self.drain_timeout)
                .map_err(anyhow::Error::msg)?,
            default_model: self.default_model.clone().filter(|m| !m.is_empty()),
            model_refresh_ms: (model_refresh(&self.model_refresh_interval.to_string())
                .map_err(|e| anyhow::anyhow!("--model-refresh-interval: {e}"))?
                * 1000.0) as u64,
            ..RouterConfig::default()
        };
        crate::seconds::check_run_duration(self.duration).map_err(anyhow::Error::msg)?;
        self.cache.apply(&mut cfg)?;
        self.admission.apply(&mut cfg)?;
        self.budgets.apply(&mut cfg)?;
        let discovered = !self.worker_urls.is_empty()
            || self.worker_urls_file.is_some()
            || !self.worker_dns.is_empty()
            || self.admin_token.is_some();
        self.pd.apply(&mut cfg, discovered)?;
        Ok(cfg)
    }
}

pub fn run(a: RouteArgs) -> Result<()> {
    loadlink_router::malloc::bound_arenas(loadlink_router::malloc::ROUTER_ARENAS);
    let a = match a.config.clone() {
        Some(path) => {
            let mut merged: RouteArgs = crate::config_file::overlay(&a, &path)?;
            merged.config = Some(path);
            merged
        }
        None => a,
    };
    let cfg = a.router_config()?;
    if a.prometheus_port.is_some() {
        eprintln!(
            "note: --prometheus-port is accepted for compatibility; metrics are at /metrics on --port"
        );
    }
    let rt = crate::runtime()?;
    rt.block_on(async move {
        let (delay, timeout) = (cfg.drain_delay, cfg.drain_timeout);
        let r = loadlink_router::start(cfg).await?;
        println!("loadlink router serving on {}", r.url());
        let stop = crate::until_stopped(a.duration).await;
        let delay = if stop == crate::Stop::Terminate {
            delay
        } else {
            std::time::Duration::ZERO
        };
        if !r.drain(delay, timeout).await {
            tracing::warn!(
                "router: open requests still running after --drain-timeout {} s; exiting anyway",
                timeout.as_secs_f64()
            );
        }
        Ok(())
    })
}
