//! `loadlink route`: flags in the style of sglang-router (or a JSON config file) → `RouterConfig`.

use anyhow::{Context, Result};
use clap::Args;
use loadlink_router::membership::{DnsTarget, MembershipConfig};
use loadlink_router::{LoadSignal, Policy, RouterConfig};
use serde_json::Value;

#[derive(Args)]
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
    #[arg(long, default_value_t = 5000)]
    worker_dns_interval_ms: u64,
    /// The DNS server to ask (IP:PORT); default: the system's resolver configuration.
    #[arg(long)]
    dns_server: Option<std::net::SocketAddr>,
    /// min_ttft (the least predicted time to first token: engine backlog, this request's
    /// uncached tokens there, that engine's measured prefill speed) | cache_aware (SGLang's
    /// algorithm) | power_of_two | least_load | round_robin | random. See docs/router.md.
    #[arg(long, default_value = "min_ttft", value_parser = Policy::parse)]
    policy: Policy,
    #[command(flatten)]
    cache: crate::route_policy_args::CacheArgs,
    #[command(flatten)]
    admission: crate::route_policy_args::AdmissionArgs,
    /// engine: price workers on engine-reported queue depth (running + waiting); backlog: on the
    /// engine-reported prefill backlog in tokens (a proxy for time to first token); both fall back
    /// to in-flight when stale or absent. inflight: only this router's own in-flight count.
    #[arg(long, default_value = "backlog", value_parser = parse_signal)]
    load_signal: LoadSignal,
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to serve on (0: pick a free one and print it).
    #[arg(long, default_value_t = 30080)]
    port: u16,
    /// Metrics are served on the main port at /metrics; accepted for sglang-router compatibility.
    #[arg(long)]
    prometheus_port: Option<u16>,
    /// A worker's engine load is used only while every rank's last message is younger than this.
    #[arg(long, default_value_t = 3000)]
    freshness_ms: u64,
    /// Largest accepted request body (bytes); larger ones get 413.
    #[arg(long, default_value_t = 16 << 20)]
    max_body_bytes: usize,
    /// A request body must arrive within this many ms (bounds slow-body clients); else 408.
    #[arg(long, default_value_t = 30_000)]
    body_timeout_ms: u64,
    /// Retries on another worker after a connect error or 502/503/504 (before any byte is sent).
    #[arg(long, default_value_t = 2)]
    max_retries: u32,
    /// Consecutive failures that open a worker's circuit breaker.
    #[arg(long, default_value_t = 3)]
    breaker_threshold: u64,
    /// How long an open breaker keeps a worker out of rotation (ms).
    #[arg(long, default_value_t = 5000)]
    breaker_cooldown_ms: u64,
    /// Interval of the /health checks (ms).
    #[arg(long, default_value_t = 5000)]
    health_interval_ms: u64,
    /// Threads that receive all load subscriptions (epoll over libzmq's ZMQ_FD; one serves
    /// hundreds of thousands of messages a second).
    #[arg(long, default_value_t = 1)]
    ingest_threads: usize,
    /// Bound on distinct KV blocks in the router's cache index (fed by workers' KV-event
    /// streams). Past it new blocks are dropped and counted (loadlink_kv_index_dropped_blocks_total)
    /// and their ranks marked for resync; about 100 bytes per block.
    #[arg(long, default_value_t = loadlink_router::cache::DEFAULT_MAX_BLOCKS)]
    kv_index_max_blocks: usize,
    /// Workers without a load socket are polled for their load (`GET /v1/loads`, else scheduler
    /// gauges on `GET /metrics`) every this many ms (0: never; they are priced on in-flight).
    /// Push is preferred when a worker has it.
    #[arg(long, default_value_t = loadlink_router::poll::DEFAULT_POLL_INTERVAL_MS)]
    load_poll_interval_ms: u64,
    /// A load poll (connect, answer and body) not done within this many ms fails and is counted
    /// (loadlink_worker_load_poll_timeouts_total).
    #[arg(long, default_value_t = loadlink_router::poll::DEFAULT_POLL_TIMEOUT_MS)]
    load_poll_timeout_ms: u64,
    /// `GET /server_info` discoveries in flight at once at start.
    #[arg(long, default_value_t = 32)]
    discovery_concurrency: usize,
    /// Bearer token that enables POST/DELETE /workers (the admin API is off without it).
    #[arg(long, env = "LOADLINK_ADMIN_TOKEN")]
    admin_token: Option<String>,
    /// JSON config file with flag names as snake_case keys (worker_urls, policy, load_signal, host,
    /// port, freshness_ms, max_retries, admin_token); its values override the flags.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// Stop after this many seconds (0: until SIGINT or SIGTERM).
    #[arg(long, default_value_t = 0.0)]
    duration: f64,
    /// On SIGTERM or SIGINT, stop accepting connections and let open requests (streams included)
    /// finish for at most this many seconds, then exit. Set the orchestrator's grace period
    /// (Kubernetes `terminationGracePeriodSeconds`) above it.
    #[arg(long, default_value_t = 30.0, env = "LOADLINK_DRAIN_TIMEOUT")]
    drain_timeout: f64,
}

fn parse_signal(s: &str) -> Result<LoadSignal, String> {
    LoadSignal::parse(s)
}

fn apply_file(cfg: &mut RouterConfig, path: &std::path::Path) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--config {}", path.display()))?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("--config {}: not valid JSON", path.display()))?;
    let obj = v
        .as_object()
        .with_context(|| format!("--config {}: expected a JSON object", path.display()))?;
    for (k, val) in obj {
        let bad = || anyhow::anyhow!("--config {}: {k}: unexpected value {val}", path.display());
        match k.as_str() {
            "worker_urls" => {
                cfg.worker_urls = val
                    .as_array()
                    .ok_or_else(bad)?
                    .iter()
                    .map(|u| u.as_str().map(String::from).ok_or_else(bad))
                    .collect::<Result<_>>()?
            }
            "policy" => {
                cfg.policy =
                    Policy::parse(val.as_str().ok_or_else(bad)?).map_err(anyhow::Error::msg)?
            }
            "load_signal" => {
                cfg.load_signal =
                    parse_signal(val.as_str().ok_or_else(bad)?).map_err(anyhow::Error::msg)?
            }
            "host" => cfg.host = val.as_str().ok_or_else(bad)?.into(),
            "port" => {
                cfg.port = val
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .ok_or_else(bad)?
            }
            "freshness_ms" => cfg.freshness_ms = val.as_u64().ok_or_else(bad)?,
            "max_retries" => {
                cfg.max_retries = val
                    .as_u64()
                    .and_then(|p| u32::try_from(p).ok())
                    .ok_or_else(bad)?
            }
            "admin_token" => cfg.admin_token = Some(val.as_str().ok_or_else(bad)?.into()),
            other => anyhow::bail!("--config {}: unknown key {other:?}", path.display()),
        }
    }
    Ok(())
}

pub fn run(a: RouteArgs) -> Result<()> {
    let mut cfg = RouterConfig {
        host: a.host,
        port: a.port,
        worker_urls: a.worker_urls,
        policy: a.policy,
        load_signal: a.load_signal,
        freshness_ms: a.freshness_ms,
        max_body_bytes: a.max_body_bytes,
        body_timeout_ms: a.body_timeout_ms,
        max_retries: a.max_retries,
        breaker_threshold: a.breaker_threshold.max(1),
        breaker_cooldown_ms: a.breaker_cooldown_ms,
        health_interval_ms: a.health_interval_ms,
        ingest_threads: a.ingest_threads.max(1),
        kv_index_max_blocks: a.kv_index_max_blocks.max(1),
        discovery_concurrency: a.discovery_concurrency.max(1),
        admin_token: a.admin_token,
        load_poll_interval_ms: a.load_poll_interval_ms,
        load_poll_timeout_ms: a.load_poll_timeout_ms.max(1),
        membership: MembershipConfig {
            urls_file: a.worker_urls_file,
            dns: a
                .worker_dns
                .iter()
                .map(|d| DnsTarget::parse(d))
                .collect::<Result<_, _>>()
                .map_err(anyhow::Error::msg)?,
            dns_server: a.dns_server,
            dns_interval_ms: a.worker_dns_interval_ms.max(100),
        },
        ..RouterConfig::default()
    };
    if let Some(p) = &a.config {
        apply_file(&mut cfg, p)?;
    }
    a.cache.apply(&mut cfg)?;
    a.admission.apply(&mut cfg)?;
    if a.prometheus_port.is_some() {
        eprintln!(
            "note: --prometheus-port is accepted for compatibility; metrics are at /metrics on --port"
        );
    }
    let rt = crate::runtime()?;
    rt.block_on(async move {
        let r = loadlink_router::start(cfg).await?;
        println!("loadlink router serving on {}", r.url());
        crate::until_stopped(a.duration).await;
        crate::drain_within(a.drain_timeout, "router", r.stop()).await;
        Ok(())
    })
}
