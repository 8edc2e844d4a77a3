//! What the engine is configured with ([`EngineConfig`]) and what its handlers share
//! ([`AppState`]). Its own module so the route handlers ([`crate::routes`], [`crate::metrics`],
//! [`crate::flavor`]) and the server ([`crate::http`]) depend on it, not on each other.

use crate::cycle::PublishPoint;
use crate::dispatch::Dispatcher;
use crate::flavor::Flavor;
use crate::model::ModelConfig;
use crate::rank::RankHandle;
use crate::served::{AdapterSpec, Served};
use loadlink_publish::EngineSettings;
use loadlink_wire::Generation;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64};

/// Everything `loadlink engine` is configured with.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub host: String,
    /// 0: pick a free port.
    pub port: u16,
    pub dp_size: u32,
    pub model: ModelConfig,
    pub time_scale: f64,
    pub kv_events_config: Option<String>,
    pub load_publish_endpoint: Option<String>,
    pub publish_interval: u32,
    pub generation: Generation,
    pub max_body_bytes: usize,
    /// The primary served model name (`--served-model-name`, first).
    pub model_name: String,
    /// Further names the model is served under (vLLM's `--served-model-name a b ...`).
    pub extra_served_names: Vec<String>,
    /// The model's path in `/server_info` and `/v1/models` (`None`: the primary name).
    pub model_path: Option<String>,
    /// LoRA adapters served (`--lora-paths`, `--lora-modules`); how many are resident at once
    /// and what a load costs is `model.lora` (with adapters and `max_loaded` 0, the engine keeps
    /// [`crate::served::DEFAULT_MAX_LOADED_LORAS`]).
    pub adapters: Vec<AdapterSpec>,
    /// Where in the scheduler cycle each rank publishes.
    pub publish_point: PublishPoint,
    /// Whose HTTP surface to present (`--flavor`); the vLLM flavour publishes no load socket and
    /// no KV events whatever the settings say.
    pub flavor: Flavor,
    /// Append `\0sgl-kv-epoch={epoch}` to the KV-event topic frame (`--kv-epoch-in-topic`).
    pub kv_epoch_in_topic: bool,
    /// Prefill–decode disaggregation (`--disaggregation-mode` and its settings).
    pub pd: crate::pd::PdConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            host: "127.0.0.1".into(),
            port: 30000,
            dp_size: 1,
            model: ModelConfig::default(),
            time_scale: 1.0,
            kv_events_config: None,
            load_publish_endpoint: None,
            publish_interval: 1,
            generation: Generation::Snapshot,
            max_body_bytes: 4 << 20,
            model_name: "loadlink-sim".into(),
            extra_served_names: Vec::new(),
            model_path: None,
            adapters: Vec::new(),
            publish_point: PublishPoint::default(),
            flavor: Flavor::default(),
            kv_epoch_in_topic: true,
            pd: crate::pd::PdConfig::default(),
        }
    }
}

/// What the engine's handlers share.
pub(crate) struct AppState {
    pub(crate) cfg: EngineConfig,
    pub(crate) settings: EngineSettings,
    pub(crate) ranks: Vec<RankHandle>,
    pub(crate) dispatcher: Dispatcher,
    pub(crate) shm_path: PathBuf,
    pub(crate) next_id: AtomicU64,
    pub(crate) requests_total: AtomicU64,
    pub(crate) aborted_total: Arc<AtomicU64>,
    pub(crate) open_requests: Arc<AtomicI64>,
    /// Set when a drain begins: `/readiness` answers 503 from then on.
    pub(crate) draining: AtomicBool,
    /// Per rank: requests accepted there, by how the rank was chosen ([`RankFrom`] as index).
    pub(crate) rank_requests: Vec<[AtomicU64; 2]>,
    /// The served names and adapters.
    pub(crate) served: Served,
    /// Requests per `model` label ([`Served::labels`]).
    pub(crate) model_requests: Vec<AtomicU64>,
    /// Prefill–decode disaggregation: rooms, connections, outcomes.
    pub(crate) pd: crate::pd::PdState,
}

/// How a request's rank was chosen (the `rank_from` label of
/// `loadlink_engine_rank_requests_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RankFrom {
    /// The client named it (`routed_dp_rank`, `data_parallel_rank`, `X-Data-Parallel-Rank`).
    Routed = 0,
    /// The engine's internal dispatcher picked it.
    Dispatcher = 1,
}

impl RankFrom {
    pub(crate) const ALL: [RankFrom; 2] = [RankFrom::Routed, RankFrom::Dispatcher];

    pub(crate) fn label(self) -> &'static str {
        match self {
            RankFrom::Routed => "routed",
            RankFrom::Dispatcher => "dispatcher",
        }
    }
}
