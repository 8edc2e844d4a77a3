//! `loadlink engine`: flags (SGLang's names where they exist) → `EngineConfig`, then serve until
//! SIGINT/SIGTERM (a bounded drain) or `--duration`.

use anyhow::Result;
use clap::Args;
use loadlink_engine::{
    AdapterSpec, Engine, EngineConfig, Flavor, LoraConfig, ModelConfig, PublishPoint, Timing,
};
use loadlink_wire::Generation;

#[derive(Args)]
pub struct EngineArgs {
    /// Address to serve HTTP on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// HTTP port (0: pick a free one and print it).
    #[arg(long, default_value_t = 30000)]
    port: u16,
    /// Data-parallel ranks behind this one port (one scheduler thread and one load socket each).
    #[arg(long, default_value_t = 1)]
    dp_size: u32,
    /// Running-batch limit per rank.
    #[arg(long, default_value_t = 128)]
    max_running_requests: usize,
    /// KV pool size per rank, in tokens.
    #[arg(long, default_value_t = 200_000)]
    max_total_tokens: u64,
    /// Prompt tokens prefilled per step at most (longer prompts are chunked).
    #[arg(long, default_value_t = 8192)]
    chunked_prefill_size: u64,
    /// SGLang-style KV-events config JSON, e.g. '{"publisher":"zmq","endpoint":"tcp://*:5557"}'.
    /// The load range derives from its endpoint; without it the engine publishes no load to routers.
    #[arg(long)]
    kv_events_config: Option<String>,
    /// Router-facing load socket: off | auto | tcp://*:PORT. Unset: on (auto) for the snapshot
    /// wire, off for loadstat (SGLang 0.5.23's opt-in).
    #[arg(long)]
    load_publish_endpoint: Option<String>,
    /// Publish to each sink every N decode batches (prefill batches and idle heartbeats always publish).
    #[arg(long, default_value_t = 1)]
    load_snapshot_publish_interval: u32,
    /// Where in each scheduler cycle the load is collected: ingest (after new requests are taken
    /// in, before the next batch is scheduled; loadlink's choice), scheduled (after scheduling:
    /// SGLang 0.5.23's overlap loop) or batch-end (after the batch ran, before new requests are
    /// read: SGLang's normal loop). See docs/engine.md for what each costs a router.
    #[arg(long, default_value = "ingest", value_parser = PublishPoint::parse)]
    publish_point: PublishPoint,
    /// Wire generation of the load socket: snapshot (full map, empty topic) or loadstat (SGLang 0.5.23).
    #[arg(long, default_value = "snapshot", value_parser = Generation::parse)]
    load_wire: Generation,
    /// Append the publisher's epoch to the KV-event topic frame, `{topic}\0sgl-kv-epoch=N`, on
    /// live and replayed batches (SGLang's snapshot v2 draft), so a subscriber sees a rank restart
    /// (a new epoch) even when seqs look continuous. SUBs subscribed to the topic still match it
    /// (prefix). `false` sends the bare topic, as SGLang 0.5.23 does, for consumers that compare
    /// the topic frame exactly.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    kv_epoch_in_topic: bool,
    /// Run the timing model this many times faster than real time.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Tokens per KV page: the prefix cache caches whole pages, and KV events announce one block
    /// per page (the descriptor's block_size; routers hash prompts at this size).
    #[arg(long, default_value_t = loadlink_engine::model::DEFAULT_PAGE_SIZE)]
    page_size: usize,
    /// Fraction of a running request's remaining output reserved at admission.
    #[arg(long, default_value_t = 0.5)]
    new_token_ratio: f64,
    /// Step time: fixed cost per step (µs).
    #[arg(long, default_value_t = Timing::default().base_us)]
    step_base_us: f64,
    /// Step time: cost per prefilled token (µs).
    #[arg(long, default_value_t = Timing::default().per_prefill_token_us)]
    step_per_prefill_token_us: f64,
    /// Step time: cost per request in the batch (µs).
    #[arg(long, default_value_t = Timing::default().per_batch_req_us)]
    step_per_batch_req_us: f64,
    /// Step time: cost per KV token in the batch (µs).
    #[arg(long, default_value_t = Timing::default().per_kv_token_us)]
    step_per_kv_token_us: f64,
    /// Host KV tier (SGLang HiCache's host pool), in tokens: evicted pages are demoted there and
    /// loaded back instead of recomputed. 0: off.
    #[arg(long, default_value_t = 0)]
    hicache_size: u64,
    /// Host-to-device load bandwidth of the host tier, tokens/s (advertised in /server_info).
    #[arg(long, default_value_t = loadlink_engine::host_tier::DEFAULT_LOAD_TOKENS_PER_S)]
    hicache_load_rate: f64,
    /// Largest accepted request body (bytes); larger bodies get 413.
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Whose HTTP surface to present: sglang (its routes, gauge names and load socket) or vllm
    /// (vLLM's `/metrics` gauge names and `/v1/models`; no load socket, no KV events, 404 on
    /// `/server_info`, `/get_server_info` and `/v1/loads`), to test a router's load sources.
    #[arg(long, default_value = "sglang", value_parser = Flavor::parse)]
    flavor: Flavor,
    /// Name the model is served under (/v1/models, /server_info, responses). Repeatable, or
    /// several after one flag (vLLM's spelling); the first is the primary name. `--model-name` is
    /// an alias.
    #[arg(
        long = "served-model-name",
        alias = "model-name",
        num_args = 1..,
        action = clap::ArgAction::Append,
        default_value = "loadlink-sim"
    )]
    served_model_name: Vec<String>,
    /// The model's path, as /server_info and /v1/models report it (default: the primary name).
    #[arg(long)]
    model_path: Option<String>,
    /// LoRA adapters to serve, SGLang's spelling: NAME=PATH, a bare PATH (named by itself), or
    /// {"lora_name":..,"lora_path":..}. Repeatable, or several after one flag.
    #[arg(long, num_args = 1.., action = clap::ArgAction::Append, value_parser = AdapterSpec::parse)]
    lora_paths: Vec<AdapterSpec>,
    /// LoRA adapters to serve, vLLM's spelling (NAME=PATH or {"name":..,"path":..}); same effect
    /// as --lora-paths.
    #[arg(long, num_args = 1.., action = clap::ArgAction::Append, value_parser = AdapterSpec::parse)]
    lora_modules: Vec<AdapterSpec>,
    /// Adapters resident at once per rank; loading another evicts the least recently used idle
    /// one. Default 4 when adapters are given.
    #[arg(long)]
    max_loaded_loras: Option<usize>,
    /// Seconds one adapter load takes; the rank's batch pauses for it (SGLang loads
    /// synchronously).
    #[arg(long, default_value_t = loadlink_engine::served::DEFAULT_LORA_LOAD_TIME_S)]
    lora_load_time: f64,
    /// Stop after this many seconds (0: until SIGINT or SIGTERM).
    #[arg(long, default_value_t = 0.0, value_parser = crate::seconds::run_duration)]
    duration: f64,
    /// On SIGTERM, how many seconds /readiness answers 503 while requests are still served,
    /// before the listener closes (for a load balancer in front of the engine; a loadlink router
    /// needs none). SIGINT and the end of --duration skip it. 0 to 86400.
    #[arg(
        long,
        default_value_t = 0.0,
        env = "LOADLINK_DRAIN_DELAY",
        value_parser = crate::seconds::drain_delay
    )]
    drain_delay: f64,
    /// Then stop accepting connections and let open requests (streams included) finish for at
    /// most this many seconds, and exit. Set the orchestrator's grace period (Kubernetes
    /// `terminationGracePeriodSeconds`) above --drain-delay plus this. 0 to 86400.
    #[arg(
        long,
        default_value_t = 30.0,
        env = "LOADLINK_DRAIN_TIMEOUT",
        value_parser = crate::seconds::drain_timeout
    )]
    drain_timeout: f64,
}

pub fn run(a: EngineArgs) -> Result<()> {
    if !a.time_scale.is_finite() || a.time_scale <= 0.0 {
        anyhow::bail!("--time-scale must be > 0, got {}", a.time_scale);
    }
    if !(0.0..=1.0).contains(&a.new_token_ratio) {
        anyhow::bail!(
            "--new-token-ratio must be within 0..=1, got {}",
            a.new_token_ratio
        );
    }
    if !a.hicache_load_rate.is_finite() || a.hicache_load_rate <= 0.0 {
        anyhow::bail!(
            "--hicache-load-rate must be a positive number of tokens per second, got {}",
            a.hicache_load_rate
        );
    }
    if !a.lora_load_time.is_finite() || a.lora_load_time < 0.0 {
        anyhow::bail!(
            "--lora-load-time must be a non-negative number of seconds, got {}",
            a.lora_load_time
        );
    }
    let mut adapters = a.lora_paths;
    adapters.extend(a.lora_modules);
    let max_loaded = match (a.max_loaded_loras, adapters.is_empty()) {
        (Some(0), false) => anyhow::bail!("--max-loaded-loras must be at least 1 with adapters"),
        (Some(n), false) => n,
        (None, false) => loadlink_engine::served::DEFAULT_MAX_LOADED_LORAS,
        (_, true) => 0,
    };
    let mut names = a.served_model_name.into_iter();
    let model_name = names.next().unwrap_or_else(|| "loadlink-sim".into());
    let cfg = EngineConfig {
        host: a.host,
        port: a.port,
        dp_size: a.dp_size,
        model: ModelConfig {
            max_running_requests: a.max_running_requests.max(1),
            max_total_tokens: a.max_total_tokens.max(1),
            chunked_prefill_size: a.chunked_prefill_size.max(1),
            new_token_ratio: a.new_token_ratio,
            page_size: a.page_size.max(1),
            timing: Timing {
                base_us: a.step_base_us,
                per_prefill_token_us: a.step_per_prefill_token_us,
                per_batch_req_us: a.step_per_batch_req_us,
                per_kv_token_us: a.step_per_kv_token_us,
            },
            host_tier: loadlink_engine::host_tier::HostTierConfig {
                tokens: a.hicache_size,
                load_tokens_per_s: a.hicache_load_rate,
            },
            lora: LoraConfig {
                max_loaded,
                load_time_s: a.lora_load_time,
            },
        },
        time_scale: a.time_scale,
        kv_events_config: a.kv_events_config,
        load_publish_endpoint: a.load_publish_endpoint,
        publish_interval: a.load_snapshot_publish_interval,
        generation: a.load_wire,
        max_body_bytes: a.max_body_bytes,
        model_name,
        extra_served_names: names.collect(),
        model_path: a.model_path,
        adapters,
        publish_point: a.publish_point,
        flavor: a.flavor,
        kv_epoch_in_topic: a.kv_epoch_in_topic,
    };
    let rt = crate::runtime()?;
    rt.block_on(async move {
        let engine = Engine::start(cfg).await?;
        println!("loadlink engine serving on {}", engine.url());
        let stop = crate::until_stopped(a.duration).await;
        let delay = match stop {
            crate::Stop::Terminate => std::time::Duration::from_secs_f64(a.drain_delay),
            _ => std::time::Duration::ZERO,
        };
        // Both were checked by their parsers (0 to a day), so the conversions cannot panic.
        let timeout = std::time::Duration::from_secs_f64(a.drain_timeout);
        engine.drain(delay, timeout).await;
        Ok(())
    })
}
