//! `RouterConfig`: everything `loadlink route` is configured with, its defaults, and the checks
//! made before anything binds. One place, so the CLI, the demo and the tests agree on defaults.

use crate::admission::AdmissionConfig;
use crate::book::LoadSignal;
use crate::cache::PrefixSource;
use crate::fleet::validate_url;
use crate::membership::MembershipConfig;
use crate::policy::Policy;

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
            admission: AdmissionConfig::default(),
            admin_token: None,
            load_poll_interval_ms: crate::poll::DEFAULT_POLL_INTERVAL_MS,
            load_poll_timeout_ms: crate::poll::DEFAULT_POLL_TIMEOUT_MS,
            membership: MembershipConfig {
                dns_interval_ms: 5000,
                ..Default::default()
            },
            budgets: Default::default(),
        }
    }
}

impl RouterConfig {
    /// The configured worker URLs, each checked and normalised (no trailing `/`).
    pub fn validated_worker_urls(&self) -> Result<Vec<String>, String> {
        self.worker_urls.iter().map(|u| validate_url(u)).collect()
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
