//! `RouterConfig`: everything `loadlink route` is configured with, its defaults, and the checks
//! made before anything binds. One place, so the CLI, the demo and the tests agree on defaults:
//! every `loadlink route` flag takes its default from [`RouterConfig::default`] (and
//! [`crate::budget::Budgets::default`]), and `--config FILE` is read through the same flag
//! definitions, so a default is written once.

use crate::admission::AdmissionConfig;
use crate::book::LoadSignal;
use crate::cache::PrefixSource;
use crate::fleet::validate_url;
use crate::membership::MembershipConfig;
use crate::policy::Policy;
use std::time::Duration;

/// Everything `loadlink route` is configured with.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub host: String,
    pub port: u16,
    pub worker_urls: Vec<String>,
    pub policy: Policy,
    pub load_signal: LoadSignal,
    /// Snapshots older than this are stale (every rank must be fresh).
    pub freshness_ms: u64,
    pub max_body_bytes: usize,
    /// A request body must arrive within this (slow-body / slowloris bound).
    pub body_timeout_ms: u64,
    pub max_retries: u32,
    pub retry_initial_backoff_ms: u64,
    pub retry_max_backoff_ms: u64,
    pub upstream_timeout_ms: u64,
    pub breaker_threshold: u64,
    pub breaker_cooldown_ms: u64,
    pub health_interval_ms: u64,
    pub discovery_attempts: u32,
    /// Discoveries (`GET /server_info`) in flight at once at start.
    pub discovery_concurrency: usize,
    /// Threads that receive every load subscription (`--ingest-threads`).
    pub ingest_threads: usize,
    /// Bound on distinct blocks in the KV index (`--kv-index-max-blocks`).
    pub kv_index_max_blocks: usize,
    /// `--tokenizer`: a Hugging Face `tokenizer.json` (or its directory); `None`: the simulated
    /// engine's tokenizer.
    pub tokenizer: Option<std::path::PathBuf>,
    /// Tokens per page of a request's block chain (the engines' page size).
    pub page_size: usize,
    /// Which cache view prices workers (`--prefix-source`).
    pub prefix_source: PrefixSource,
    /// How a chosen DP rank travels to the engine (`--dp-rank-field`); `none` routes workers
    /// whole ([`crate::candidate`]).
    pub dp_rank_field: crate::candidate::RankField,
    /// Admission caps and the overload answer.
    pub admission: AdmissionConfig,
    pub admin_token: Option<String>,
    /// Polling of workers without a load socket (`--load-poll-interval-ms`, 0: off;
    /// `--load-poll-timeout-ms`).
    pub load_poll_interval_ms: u64,
    pub load_poll_timeout_ms: u64,
    /// Workers from a watched file and DNS, besides `worker_urls`.
    pub membership: MembershipConfig,
    /// What a peer may send ([`crate::budget`]).
    pub budgets: crate::budget::Budgets,
    /// After SIGTERM, how long `/readiness` answers 503 while requests are still served, before
    /// the listener closes (`--drain-delay`, seconds): the time a load balancer needs to notice.
    pub drain_delay: Duration,
    /// Then how long open requests (streams included) may take to finish (`--drain-timeout`).
    pub drain_timeout: Duration,
    /// The model a request without `model` (or with `"default"`) goes to (`--default-model`);
    /// `None`: the only model the fleet serves, else such a request is refused.
    pub default_model: Option<String>,
    /// How often every worker's models are re-read (`--model-refresh-interval`); 0: only at
    /// discovery.
    pub model_refresh_ms: u64,
    /// Seconds to load a LoRA adapter on a worker that does not advertise it (`--adapter-load-s`).
    pub adapter_load_s: f64,
    /// `--pd`: prefill–decode disaggregation ([`crate::pd`]); `None`: a regular fleet.
    pub pd: Option<crate::pd::PdConfig>,
}

/// `--admission-queue-size` when not given.
pub const DEFAULT_ADMISSION_QUEUE_SIZE: usize = 256;
/// `--admission-queue-timeout-ms` when not given.
pub const DEFAULT_ADMISSION_QUEUE_TIMEOUT_MS: u64 = 5000;

/// The largest drain delay or timeout accepted: a day. Past it a value is a mistake (`inf`, a
/// unit slip), and the process would outlive any orchestrator's grace period anyway.
pub const MAX_DRAIN_SECONDS: f64 = 86_400.0;

/// A drain duration in seconds (`--drain-delay`, `--drain-timeout`) as a [`Duration`], checked
/// when the value is read, so an impossible one fails at start with the flag named instead of
/// at shutdown.
pub fn drain_seconds(flag: &str, secs: f64) -> Result<Duration, String> {
    if !(0.0..=MAX_DRAIN_SECONDS).contains(&secs) {
        return Err(format!(
            "{flag}: expected seconds between 0 and {MAX_DRAIN_SECONDS}, got {secs:?}"
        ));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{flag}: {secs} seconds: {e}"))
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            host: "127.0.0.1".into(),
            port: 30080,
            worker_urls: Vec::new(),
            policy: Policy::MinTtft(crate::policy::MinTtft::default()),
            load_signal: LoadSignal::Backlog,
            freshness_ms: 3000,
            max_body_bytes: 16 << 20,
            body_timeout_ms: 30_000,
            max_retries: 2,
            retry_initial_backoff_ms: 50,
            retry_max_backoff_ms: 1000,
            upstream_timeout_ms: 600_000,
            breaker_threshold: 3,
            breaker_cooldown_ms: 5000,
            health_interval_ms: 5000,
            discovery_attempts: 5,
            discovery_concurrency: 32,
            ingest_threads: 1,
            kv_index_max_blocks: crate::cache::DEFAULT_MAX_BLOCKS,
            tokenizer: None,
            page_size: 16,
            prefix_source: PrefixSource::Auto,
            dp_rank_field: crate::candidate::RankField::Both,
            admission: AdmissionConfig::default(),
            admin_token: None,
            load_poll_interval_ms: crate::poll::DEFAULT_POLL_INTERVAL_MS,
            load_poll_timeout_ms: crate::poll::DEFAULT_POLL_TIMEOUT_MS,
            membership: MembershipConfig {
                dns_interval_ms: 5000,
                ..Default::default()
            },
            budgets: Default::default(),
            drain_delay: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(30),
            default_model: None,
            model_refresh_ms: 30_000,
            adapter_load_s: crate::adapters::DEFAULT_ADAPTER_LOAD_S,
            pd: None,
        }
    }
}

impl RouterConfig {
    /// The configured worker URLs (`--pd`'s prefill and decode ones included, once each), each
    /// checked and normalised (no trailing `/`).
    pub fn validated_worker_urls(&self) -> Result<Vec<String>, String> {
        let pd = self.pd.iter().flat_map(|p| p.urls());
        let mut urls: Vec<String> = Vec::new();
        for u in self.worker_urls.iter().map(String::as_str).chain(pd) {
            let u = validate_url(u)?;
            if !urls.contains(&u) {
                urls.push(u);
            }
        }
        Ok(urls)
    }

    /// How the fleet polls workers without a load socket (interval 0: not at all).
    pub fn poll_config(&self) -> crate::poll::PollConfig {
        crate::poll::PollConfig {
            interval: std::time::Duration::from_millis(self.load_poll_interval_ms),
            timeout: std::time::Duration::from_millis(self.load_poll_timeout_ms.max(1)),
            max_body_bytes: self.budgets.poll_body_bytes,
            max_ranks: self.budgets.max_ranks,
        }
    }

    /// The address to bind, `HOST:PORT`.
    pub fn bind_addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_seconds_accepts_the_range_and_names_the_flag_otherwise() {
        assert_eq!(drain_seconds("--drain-timeout", 0.0), Ok(Duration::ZERO));
        assert_eq!(
            drain_seconds("--drain-delay", 2.5),
            Ok(Duration::from_millis(2500))
        );
        for bad in [
            f64::INFINITY,
            f64::NAN,
            -1.0,
            1e300,
            MAX_DRAIN_SECONDS + 1.0,
        ] {
            let e = drain_seconds("--drain-timeout", bad).unwrap_err();
            assert!(
                e.starts_with("--drain-timeout: expected seconds between 0 and"),
                "{e}"
            );
        }
    }
}
