//! `loadlink route` flags for cache-aware routing and admission control, flattened into
//! `RouteArgs` (kept apart so each group reads as one block in `--help` and in code).

use anyhow::Result;
use clap::Args;
use loadlink_router::RouterConfig;
use loadlink_router::admission::{AdmissionConfig, Overload};
use loadlink_router::cache::PrefixSource;
use loadlink_router::candidate::RankField;
use loadlink_router::config::{DEFAULT_ADMISSION_QUEUE_SIZE, DEFAULT_ADMISSION_QUEUE_TIMEOUT_MS};
use loadlink_router::policy::{
    AdapterPricing, CacheAware, FleetPricing, MinTtft, Policy, TierPricing,
};
use serde::{Deserialize, Serialize};

fn prefix_source_name(s: &str) -> Result<String, String> {
    PrefixSource::parse(s).map(|_| s.to_string())
}

fn tier_pricing_name(s: &str) -> Result<String, String> {
    TierPricing::parse(s).map(|_| s.to_string())
}

fn adapter_pricing_name(s: &str) -> Result<String, String> {
    AdapterPricing::parse(s).map(|_| s.to_string())
}

fn fleet_pricing_name(s: &str) -> Result<String, String> {
    FleetPricing::parse(s).map(|_| s.to_string())
}

fn rank_field_name(s: &str) -> Result<String, String> {
    RankField::parse(s).map(|_| s.to_string())
}

#[derive(Args, Serialize, Deserialize)]
pub struct CacheArgs {
    /// A Hugging Face tokenizer.json (or the directory holding it, with tokenizer_config.json for
    /// the chat template), so the router's block hashes match a real engine's. Default: the
    /// simulated engine's deterministic tokenizer (exact for `loadlink engine`).
    #[arg(long)]
    tokenizer: Option<std::path::PathBuf>,
    /// Tokens per KV page: the engines' page size (SGLang --page-size; shown per worker in
    /// /workers as kv_events.block_size).
    #[arg(long, default_value_t = RouterConfig::default().page_size)]
    page_size: usize,
    /// Where cached prefixes come from: auto (the engine's KV events where a worker publishes
    /// them, else an approximate tree of what this router sent), kv-events, or approx.
    #[arg(
        long,
        default_value_t = RouterConfig::default().prefix_source.as_str().to_string(),
        value_parser = prefix_source_name
    )]
    prefix_source: String,
    /// How the DP rank the router picks reaches the engine: header (X-Data-Parallel-Rank, the
    /// OpenAI routes), body (routed_dp_rank: /generate, /v1/completions, /v1/chat/completions),
    /// both (each where the route takes it), or none (route workers whole and let the engine's
    /// dispatcher pick the rank). A worker is split into its ranks only when each rank publishes
    /// its own load stream; /workers shows which are (rank_routing). See docs/router.md.
    #[arg(
        long,
        default_value_t = RouterConfig::default().dp_rank_field.as_str().to_string(),
        value_parser = rank_field_name
    )]
    dp_rank_field: String,
    /// cache_aware: the match ratio (cached / prompt tokens) above which the best-matching
    /// worker wins (sglang-router's default 0.3).
    #[arg(long, default_value_t = CacheAware::default().cache_threshold)]
    cache_threshold: f64,
    /// cache_aware: the fleet is imbalanced when max − min load exceeds this … (default 64)
    #[arg(long, default_value_t = CacheAware::default().balance_abs_threshold)]
    balance_abs_threshold: i64,
    /// … and max exceeds this × min (default 1.5); then the least-loaded worker is picked.
    #[arg(long, default_value_t = CacheAware::default().balance_rel_threshold)]
    balance_rel_threshold: f64,
    /// min_ttft: how a hit held on an engine's host tier only (HiCache CPU_PINNED, DISK) is
    /// priced: aware (at its load-back time), blind (free, as a device hit) or miss (recomputed,
    /// as a router indexing the device tier only).
    #[arg(
        long,
        default_value_t = MinTtft::default().tier_pricing.as_str().to_string(),
        value_parser = tier_pricing_name
    )]
    tier_pricing: String,
    /// min_ttft: host-to-device KV load bandwidth (tokens/s) assumed for a worker that does not
    /// advertise its own.
    #[arg(long, default_value_t = MinTtft::default().host_load_tokens_per_s)]
    host_load_tokens_per_s: f64,
    /// min_ttft: whether a LoRA adapter's residency is priced: aware (a worker without the
    /// adapter loaded pays its load, the reload of what it evicts and the wait for a free slot)
    /// or blind (adapters are free everywhere). See docs/router.md, "Adapters and the price".
    #[arg(
        long,
        default_value_t = MinTtft::default().adapter_pricing.as_str().to_string(),
        value_parser = adapter_pricing_name
    )]
    adapter_pricing: String,
    /// min_ttft: whether a placement's cost to the rest of the fleet is priced: aware (moving a
    /// request away from the worker caching its prefix costs the recompute it causes, at the
    /// queueing externality ρ/(1−ρ)² of the worker's utilisation, so near saturation sessions
    /// stay where their cache is) or blind (this request's predicted TTFT only). See
    /// docs/router.md, "Pricing the fleet's work".
    #[arg(
        long,
        default_value_t = MinTtft::default().fleet_pricing.as_str().to_string(),
        value_parser = fleet_pricing_name
    )]
    fleet_pricing: String,
    /// Seconds an engine takes to load a LoRA adapter, for workers that do not advertise
    /// lora_load_time_s in /server_info.
    #[arg(long, default_value_t = loadlink_router::adapters::DEFAULT_ADAPTER_LOAD_S)]
    adapter_load_s: f64,
}

#[derive(Args, Serialize, Deserialize)]
pub struct AdmissionArgs {
    /// Admission cap: a worker whose engine holds more requests than this (its reported running +
    /// waiting, plus what this router sent since the snapshot) takes no new request; set it above
    /// the engine's batch size to cap its queue. Unknown loads do not count (fail open).
    #[arg(long)]
    max_engine_requests: Option<i64>,
    /// Admission cap: a worker whose KV usage (0–1) is above this takes no new request.
    #[arg(long)]
    max_kv_usage: Option<f64>,
    /// Admission cap: a worker where this request's predicted time to first token exceeds this
    /// takes it not.
    #[arg(long)]
    max_predicted_wait_ms: Option<u64>,
    /// With a cap set: a request continuing a context that one worker alone holds (a running
    /// session's next turn, as the KV index or the approximate tree sees it) goes to that worker
    /// even over the caps, so the caps refuse new sessions rather than the turns of sessions
    /// already begun. See docs/router.md, "Admission control".
    #[arg(long)]
    admission_spare_running: bool,
    /// When every worker is over a cap: reject (429 with Retry-After at once) or queue (hold in a
    /// bounded FIFO until a worker is within the caps or the deadline passes, then 429).
    #[arg(long, default_value = "reject")]
    admission: String,
    /// Requests the admission queue holds (more get 429 at once).
    #[arg(long, default_value_t = DEFAULT_ADMISSION_QUEUE_SIZE)]
    admission_queue_size: usize,
    /// How long a request may wait in the admission queue (ms).
    #[arg(long, default_value_t = DEFAULT_ADMISSION_QUEUE_TIMEOUT_MS)]
    admission_queue_timeout_ms: u64,
}

impl CacheArgs {
    /// Sets the cache flags on `cfg`; `cache_aware`'s thresholds go into its policy value.
    pub fn apply(&self, cfg: &mut RouterConfig) -> Result<()> {
        cfg.tokenizer = self.tokenizer.clone();
        anyhow::ensure!(self.page_size > 0, "--page-size must be at least 1");
        cfg.page_size = self.page_size;
        cfg.prefix_source = PrefixSource::parse(&self.prefix_source).map_err(anyhow::Error::msg)?;
        cfg.dp_rank_field = RankField::parse(&self.dp_rank_field).map_err(anyhow::Error::msg)?;
        if let Policy::CacheAware(_) = cfg.policy {
            cfg.policy = Policy::CacheAware(
                CacheAware::new(
                    self.cache_threshold,
                    self.balance_abs_threshold,
                    self.balance_rel_threshold,
                )
                .map_err(|e| anyhow::anyhow!("--cache-threshold/--balance-*: {e}"))?,
            );
        }
        let tier_pricing = TierPricing::parse(&self.tier_pricing).map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            self.host_load_tokens_per_s.is_finite() && self.host_load_tokens_per_s > 0.0,
            "--host-load-tokens-per-s must be a positive number of tokens per second, got {}",
            self.host_load_tokens_per_s
        );
        anyhow::ensure!(
            self.adapter_load_s.is_finite() && self.adapter_load_s >= 0.0,
            "--adapter-load-s must be seconds ≥ 0, got {}",
            self.adapter_load_s
        );
        cfg.adapter_load_s = self.adapter_load_s;
        let adapter_pricing =
            AdapterPricing::parse(&self.adapter_pricing).map_err(anyhow::Error::msg)?;
        if let Policy::MinTtft(p) = &mut cfg.policy {
            p.tier_pricing = tier_pricing;
            p.host_load_tokens_per_s = self.host_load_tokens_per_s;
            p.adapter_pricing = adapter_pricing;
            p.fleet_pricing =
                FleetPricing::parse(&self.fleet_pricing).map_err(anyhow::Error::msg)?;
        }
        Ok(())
    }
}

impl AdmissionArgs {
    pub fn apply(&self, cfg: &mut RouterConfig) -> Result<()> {
        if let Some(u) = self.max_kv_usage {
            anyhow::ensure!(
                (0.0..=1.0).contains(&u),
                "--max-kv-usage must be between 0 and 1, got {u}"
            );
        }
        cfg.admission = AdmissionConfig {
            max_engine_requests: self.max_engine_requests,
            max_kv_usage: self.max_kv_usage,
            max_predicted_wait_ms: self.max_predicted_wait_ms,
            spare_running: self.admission_spare_running,
            overload: Overload::parse(
                &self.admission,
                self.admission_queue_size.max(1),
                self.admission_queue_timeout_ms,
            )
            .map_err(anyhow::Error::msg)?,
        };
        Ok(())
    }
}
