//! The state every handler shares (`AppState`) and the one JSON error shape the router answers
//! with. Its own module so the proxy, the admin API and the server depend on it, not on each other.

use crate::cache::{CacheBook, PrefixSettings, RouterTokenizer};
use crate::config::RouterConfig;
use crate::discovery::DiscoveryLimits;
use crate::fleet::Fleet;
use crate::metrics::Metrics;
use crate::peer_http::HttpClient;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

/// What the router's handlers share.
pub struct AppState {
    pub cfg: RouterConfig,
    pub fleet: Fleet,
    /// Every worker's cached blocks, fed by their KV-event streams (the same `Arc` the fleet
    /// registers workers in). The request path asks it for a prompt's cached tokens per worker.
    pub cache: Arc<CacheBook>,
    /// How requests become cache lookups (tokenizer, page size, which view).
    pub prefix: PrefixSettings,
    /// The admission queue and its counters.
    pub admission: crate::admission::AdmissionState,
    pub client: HttpClient,
    /// Request sequence: seeds random policies and retry jitter.
    pub seq: AtomicU64,
    pub metrics: Metrics,
    /// How late the executor runs a periodic task ([`crate::executor_probe`]).
    pub executor: Arc<crate::executor_probe::ExecutorProbe>,
    /// Set at shutdown so endless streams (the dashboard feed) end and the drain can finish.
    pub stopping: AtomicBool,
    /// Set when a drain begins (SIGTERM): `/readiness` answers 503 while everything else is
    /// still served, the dashboard feed included, until the listener closes (`stopping`).
    pub draining: AtomicBool,
    /// Counters of the watched file and DNS sources.
    pub membership: crate::membership::MembershipStats,
    /// PD requests' counters ([`crate::pd`]).
    pub pd: crate::pd::metrics::PdMetrics,
}

impl AppState {
    /// The state for `cfg`; fails only when `--tokenizer` cannot be loaded.
    pub fn new(cfg: RouterConfig) -> Result<Self, String> {
        let cache = Arc::new(
            CacheBook::new(cfg.kv_index_max_blocks)
                .with_rank_quota(cfg.budgets.index_blocks_per_rank),
        );
        let prefix = PrefixSettings {
            tokenizer: RouterTokenizer::load(cfg.tokenizer.as_deref())?,
            page_size: cfg.page_size.max(1),
            source: cfg.prefix_source,
            sizes_from_sent: [Some(cfg.policy), cfg.pd.as_ref().map(|p| p.prefill_policy)]
                .iter()
                .any(|p| matches!(p, Some(crate::policy::Policy::CacheAware(_)))),
        };
        Ok(AppState {
            prefix,
            admission: crate::admission::AdmissionState::new(&cfg.budgets),
            fleet: Fleet::with_cache(cfg.ingest_threads, cache.clone())
                .with_budgets(cfg.budgets.clone())
                .with_polling(cfg.poll_config())
                .with_rank_field(cfg.dp_rank_field)
                .with_pd(cfg.pd.clone())
                .with_adapters(crate::adapters::AdapterBookConfig {
                    default_load_s: cfg.adapter_load_s,
                    ..Default::default()
                }),
            cache,
            cfg,
            client: crate::fleet::http_client(),
            seq: AtomicU64::new(0),
            metrics: Metrics::default(),
            executor: Arc::default(),
            stopping: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            membership: Default::default(),
            pd: Default::default(),
        })
    }

    /// How this router discovers: its configured attempts and budgets, refusals counted
    /// fleet-wide.
    pub fn discovery_limits(&self) -> DiscoveryLimits {
        DiscoveryLimits {
            refusals: Some(self.fleet.refusals.clone()),
            ..DiscoveryLimits::new(self.cfg.discovery_attempts, &self.cfg.budgets)
        }
    }
}

/// `{"error": {"message", "code"}}` with `status`: the OpenAI-style error body.
pub fn error_response(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(json!({ "error": { "message": message, "code": status.as_u16() } })),
    )
        .into_response()
}
