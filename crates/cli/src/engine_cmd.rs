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
    /// Prefill–decode disaggregation role: null (serve whole requests), prefill (prefill only,
    /// then hold the KV until the request's decode engine has it; answer one token) or decode
    /// (wait for the KV from the prefill engine named by the request's bootstrap_host and
    /// bootstrap_port, then decode). PD engines refuse requests without bootstrap_room (400).
    #[arg(long, default_value = "null", value_parser = loadlink_engine::PdMode::parse)]
    disaggregation_mode: loadlink_engine::PdMode,
    /// Prefill engines: the TCP port of the bootstrap server decode engines dial, bound on
    /// --host and advertised in /server_info (0: pick a free port and advertise it). The engine
    /// refuses to start if it cannot bind it.
    #[arg(long, default_value_t = loadlink_engine::pd::DEFAULT_BOOTSTRAP_PORT)]
    disaggregation_bootstrap_port: u16,
    /// Simulated KV link bandwidth between prefill and decode engines, GB/s: a transfer takes
    /// prompt tokens × --kv-bytes-per-token ÷ (this × 1e9) seconds (÷ --time-scale).
    #[arg(long, default_value_t = 25.0)]
    kv_transfer_gb_s: f64,
    /// KV cache bytes per token, for transfer times.
    #[arg(long, default_value_t = loadlink_engine::pd::DEFAULT_KV_BYTES_PER_TOKEN)]
    kv_bytes_per_token: u64,
    /// Seconds a decode engine waits for a request's KV, and a prefill engine for the request's
    /// decode engine to register, before failing it (a 500 in SGLang's error shape; streamed:
    /// an error event, then [DONE]).
    #[arg(long, default_value_t = 30.0)]
    disaggregation_timeout: f64,
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
    let served = Served::of(&a)?;
    let pd = pd_config(&a)?;
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
            lora: served.lora,
        },
        time_scale: a.time_scale,
        kv_events_config: a.kv_events_config,
        load_publish_endpoint: a.load_publish_endpoint,
        publish_interval: a.load_snapshot_publish_interval,
        generation: a.load_wire,
        max_body_bytes: a.max_body_bytes,
        model_name: served.primary,
        extra_served_names: served.more_names,
        model_path: a.model_path,
        adapters: served.adapters,
        publish_point: a.publish_point,
        flavor: a.flavor,
        kv_epoch_in_topic: a.kv_epoch_in_topic,
        pd,
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

/// The disaggregation flags, checked.
fn pd_config(a: &EngineArgs) -> Result<loadlink_engine::PdConfig> {
    if !a.kv_transfer_gb_s.is_finite() || a.kv_transfer_gb_s <= 0.0 {
        anyhow::bail!(
            "--kv-transfer-gb-s must be a positive number of GB/s, got {}",
            a.kv_transfer_gb_s
        );
    }
    if a.kv_bytes_per_token == 0 {
        anyhow::bail!("--kv-bytes-per-token must be at least 1");
    }
    if !a.disaggregation_timeout.is_finite()
        || a.disaggregation_timeout <= 0.0
        || a.disaggregation_timeout > 86_400.0
    {
        anyhow::bail!(
            "--disaggregation-timeout must be seconds in (0, 86400], got {}",
            a.disaggregation_timeout
        );
    }
    Ok(loadlink_engine::PdConfig {
        mode: a.disaggregation_mode,
        bootstrap_port: a.disaggregation_bootstrap_port,
        kv_transfer_gb_s: a.kv_transfer_gb_s,
        kv_bytes_per_token: a.kv_bytes_per_token,
        timeout: std::time::Duration::from_secs_f64(a.disaggregation_timeout),
    })
}

/// The served names and adapters the flags give, checked.
#[derive(Debug, PartialEq)]
struct Served {
    primary: String,
    more_names: Vec<String>,
    adapters: Vec<AdapterSpec>,
    lora: LoraConfig,
}

impl Served {
    fn of(a: &EngineArgs) -> Result<Served> {
        if !a.lora_load_time.is_finite() || a.lora_load_time < 0.0 {
            anyhow::bail!(
                "--lora-load-time must be a non-negative number of seconds, got {}",
                a.lora_load_time
            );
        }
        let adapters: Vec<AdapterSpec> = a
            .lora_paths
            .iter()
            .chain(&a.lora_modules)
            .cloned()
            .collect();
        let max_loaded = match (a.max_loaded_loras, adapters.is_empty()) {
            (Some(0), false) => {
                anyhow::bail!("--max-loaded-loras must be at least 1 with adapters")
            }
            (Some(n), false) => n,
            (None, false) => loadlink_engine::served::DEFAULT_MAX_LOADED_LORAS,
            (_, true) => 0,
        };
        let (primary, more) = a
            .served_model_name
            .split_first()
            .map_or(("loadlink-sim".to_string(), Vec::new()), |(p, m)| {
                (p.clone(), m.to_vec())
            });
        Ok(Served {
            primary,
            more_names: more,
            adapters,
            lora: LoraConfig {
                max_loaded,
                load_time_s: a.lora_load_time,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        engine: EngineArgs,
    }

    fn served(args: &[&str]) -> Result<Served> {
        let cli = Cli::try_parse_from(std::iter::once("engine").chain(args.iter().copied()))?;
        Served::of(&cli.engine)
    }

    #[test]
    fn names_and_adapters_in_sglangs_and_vllms_spellings() {
        let s = served(&[]).unwrap();
        assert_eq!((s.primary.as_str(), s.lora.max_loaded), ("loadlink-sim", 0));
        let s = served(&["--model-name", "m"]).unwrap();
        assert_eq!(s.primary, "m", "--model-name is an alias");
        let s = served(&["--served-model-name", "a", "b", "--served-model-name", "c"]).unwrap();
        assert_eq!(
            (s.primary.as_str(), s.more_names.clone()),
            ("a", vec!["b".into(), "c".into()])
        );
        let s = served(&["--lora-paths", "x=/p/x", "/p/y", "--lora-modules", "z=/p/z"]).unwrap();
        let names: Vec<&str> = s.adapters.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["x", "/p/y", "z"]);
        assert_eq!(s.lora.max_loaded, 4, "the default with adapters");
        assert_eq!(
            s.lora.load_time_s,
            loadlink_engine::served::DEFAULT_LORA_LOAD_TIME_S
        );
        let s = served(&[
            "--lora-paths",
            "x=/p",
            "--max-loaded-loras",
            "2",
            "--lora-load-time",
            "0",
        ])
        .unwrap();
        assert_eq!((s.lora.max_loaded, s.lora.load_time_s), (2, 0.0));
    }

    #[test]
    fn disaggregation_flags() {
        let pd = |args: &[&str]| {
            let cli = Cli::try_parse_from(std::iter::once("engine").chain(args.iter().copied()))
                .map_err(anyhow::Error::from)?;
            pd_config(&cli.engine)
        };
        let d = pd(&[]).unwrap();
        assert_eq!(d, loadlink_engine::PdConfig::default());
        let p = pd(&[
            "--disaggregation-mode",
            "prefill",
            "--disaggregation-bootstrap-port",
            "0",
            "--kv-transfer-gb-s",
            "1.5",
            "--disaggregation-timeout",
            "2",
        ])
        .unwrap();
        assert_eq!(
            (
                p.mode,
                p.bootstrap_port,
                p.kv_transfer_gb_s,
                p.timeout.as_secs()
            ),
            (loadlink_engine::PdMode::Prefill, 0, 1.5, 2)
        );
        let err = |args: &[&str]| pd(args).unwrap_err().to_string();
        assert!(err(&["--disaggregation-mode", "both"]).contains("prefill or decode"));
        assert!(err(&["--kv-transfer-gb-s", "0"]).contains("--kv-transfer-gb-s"));
        assert!(err(&["--disaggregation-timeout", "0"]).contains("--disaggregation-timeout"));
        assert!(err(&["--kv-bytes-per-token", "0"]).contains("--kv-bytes-per-token"));
    }

    #[test]
    fn bad_adapter_flags_are_refused_naming_the_flag() {
        let err = |args: &[&str]| served(args).unwrap_err().to_string();
        assert!(
            err(&["--lora-paths", "x=/p", "--max-loaded-loras", "0"])
                .contains("--max-loaded-loras")
        );
        assert!(err(&["--lora-load-time=-1"]).contains("--lora-load-time"));
        assert!(err(&["--lora-paths", "=/p"]).contains("NAME=PATH"));
    }
}
