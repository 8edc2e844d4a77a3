//! Builds a rank's sinks and its KV-event publisher from engine settings, and the matching
//! `/server_info` advertisement.
//!
//! Both go through `loadlink_wire::resolve_load_range` with the same [`EngineSettings`], so the
//! advertised `load_endpoint_port_base` exists exactly when this factory bound the range. Each
//! sink is built under its own guard: a bad router-facing endpoint costs only the PUB sink (a
//! warning with the reason), while losing the internal sink is an error.

use crate::kv_publisher::{KvEventPublisher, KvPublisherConfig};
use crate::shm_sink::ShmSink;
use crate::sink::Sink;
use crate::zmq_sinks::{PubSink, PushSink};
use loadlink_wire::descriptor::{KvEventsDescriptor, describe};
use loadlink_wire::endpoint::{TcpEndpoint, tcp_endpoint};
use loadlink_wire::{Generation, KvEventsConfig, LoadRange, RangeRequest, resolve_load_range};
use std::path::PathBuf;

/// Where the internal (in-engine) snapshot goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InternalSink {
    /// The SLNS slot file at this path (single node).
    Shm(PathBuf),
    /// PUSH to the PULL owner at this endpoint (multi-node DP).
    Push(String),
    None,
}

/// The engine flags that decide a rank's sinks.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// `--kv-events-config` JSON, as given.
    pub kv_events_config: Option<String>,
    /// `--load-publish-endpoint`: unset, `off`, `auto` or `tcp://*:PORT`.
    pub load_publish_endpoint: Option<String>,
    /// `--load-snapshot-publish-interval`: publish every N scheduler cycles.
    pub publish_interval: u32,
    pub dp_size: u32,
    pub generation: Generation,
    pub internal: InternalSink,
}

impl EngineSettings {
    /// Every sink's call interval: the decode cadence (`--load-snapshot-publish-interval`, at
    /// least 1). The simulator gives its in-memory sink the same.
    pub fn sink_interval(&self) -> u32 {
        sink_interval(self.publish_interval)
    }

    /// The parsed KV-events config; a malformed one is reported as the reason and treated as absent
    /// (by the binder and the advertisement alike).
    pub fn kv_config(&self) -> Result<Option<KvEventsConfig>, String> {
        self.kv_events_config
            .as_deref()
            .map(KvEventsConfig::from_json)
            .transpose()
    }

    /// The load range, decided by the one resolver. `Err(None)` is a quiet decline.
    pub fn load_range(&self) -> Result<LoadRange, Option<String>> {
        let kv = self.kv_config().map_err(Some)?;
        resolve_load_range(RangeRequest {
            kv: kv.as_ref(),
            dp_size: self.dp_size,
            load_publish_endpoint: self.load_publish_endpoint.as_deref(),
            generation: self.generation,
        })
        .map_err(|d| d.reason)
    }

    /// The `kv_events` value for `/server_info` (`None` → JSON null).
    pub fn advertise(&self, block_size: i64) -> Option<KvEventsDescriptor> {
        let kv = self.kv_config().ok().flatten();
        let range = self.load_range().ok();
        describe(kv.as_ref(), block_size, self.dp_size, range.as_ref())
    }
}

/// The sink call interval for a `publish_interval` setting (0 means every call, as 1 does).
pub fn sink_interval(publish_interval: u32) -> u32 {
    publish_interval.max(1)
}

/// What the factory built for one rank.
pub struct BuiltSinks {
    /// Internal sink first, then the router-facing one.
    pub sinks: Vec<Box<dyn Sink>>,
    /// The range the PUB bound, if any.
    pub range: Option<LoadRange>,
    /// Why there is no PUB sink (`None` when it exists or the decline is unremarkable).
    pub pub_declined: Option<String>,
    /// Why there is no internal sink, when one was asked for.
    pub internal_error: Option<String>,
}

/// Builds `rank`'s sinks. Never fails as a whole: each part's failure is reported and isolated.
pub fn build_sinks(ctx: &zmq::Context, settings: &EngineSettings, rank: u32) -> BuiltSinks {
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    let interval = settings.sink_interval();
    let internal: Result<Option<Box<dyn Sink>>, String> = match &settings.internal {
        InternalSink::Shm(path) => u16::try_from(settings.dp_size)
            .map_err(|_| {
                format!(
                    "dp_size {} exceeds the slot file's u16 limit",
                    settings.dp_size
                )
            })
            .and_then(|dp| {
                ShmSink::open(path, dp, rank, interval)
                    .map_err(|e| format!("{}: {e}", path.display()))
            })
            .map(|s| Some(Box::new(s) as Box<dyn Sink>)),
        InternalSink::Push(ep) => PushSink::connect(ctx, ep, rank, interval)
            .map_err(|e| format!("{ep}: {e}"))
            .map(|s| Some(Box::new(s) as Box<dyn Sink>)),
        InternalSink::None => Ok(None),
    };
    let internal_error = match internal {
        Ok(s) => {
            sinks.extend(s);
            None
        }
        Err(e) => {
            tracing::error!(
                rank,
                "internal load sink unavailable: {e}; in-engine consumers get no load for this rank"
            );
            Some(e)
        }
    };
    let (range, pub_declined) = match settings.load_range() {
        Err(reason) => {
            if let Some(r) = &reason {
                tracing::warn!(rank, "router-facing load publisher disabled: {r}");
            }
            (None, reason)
        }
        Ok(range) => {
            let ep = range.bind_endpoint(rank as u16);
            match PubSink::bind(ctx, &ep, range.generation, rank, interval) {
                Ok(p) => {
                    sinks.push(Box::new(p));
                    (Some(range), None)
                }
                Err(e) => {
                    let why = format!(
                        "failed to bind the load socket at {ep}: {e}; /server_info still advertises this range, so routers will see silence and fall back"
                    );
                    tracing::warn!(rank, "{why}");
                    (Some(range), Some(why))
                }
            }
        }
    };
    BuiltSinks {
        sinks,
        range,
        pub_declined,
        internal_error,
    }
}

/// The per-rank bind endpoint of a KV-events endpoint (`port + rank`), when it can be bound.
fn rank_endpoint(what: &str, endpoint: &str, rank: u32) -> Result<String, String> {
    let ep = TcpEndpoint::parse(endpoint).map_err(|e| format!("{what} {endpoint:?}: {e}"))?;
    if !ep.is_wildcard() {
        return Err(format!(
            "{what} {endpoint:?} has a concrete host: the engine binds KV-event sockets only on a \
             wildcard host (tcp://*:PORT)"
        ));
    }
    let port = u16::try_from(u32::from(ep.port) + rank)
        .map_err(|_| format!("{what} {endpoint:?}: port + rank {rank} passes 65535"))?;
    Ok(tcp_endpoint(&ep.host, port))
}

/// Builds `rank`'s KV-event publisher from `--kv-events-config`: `Ok(None)` when KV events are
/// off (no config, or publisher "null"), `Err` with the reason when they are on but the sockets
/// cannot be bound (the engine serves on; routers then see no KV events from this rank).
pub fn build_kv_publisher(
    ctx: &zmq::Context,
    settings: &EngineSettings,
    rank: u32,
) -> Result<Option<KvEventPublisher>, String> {
    let Some(kv) = settings.kv_config()?.filter(KvEventsConfig::is_active) else {
        return Ok(None);
    };
    let mut cfg = KvPublisherConfig::new(rank_endpoint("endpoint", &kv.endpoint, rank)?);
    cfg.replay_endpoint = kv
        .replay_endpoint
        .as_deref()
        .map(|r| rank_endpoint("replay_endpoint", r, rank))
        .transpose()?;
    cfg.topic = kv.topic.clone();
    cfg.buffer_steps = kv.buffer_steps as usize;
    cfg.hwm = i32::try_from(kv.hwm).unwrap_or(i32::MAX);
    cfg.max_queue_size = kv.max_queue_size as usize;
    KvEventPublisher::bind(ctx, cfg)
        .map(Some)
        .map_err(|e| format!("binding the KV-event sockets of rank {rank}: {e}"))
}
