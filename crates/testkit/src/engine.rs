//! In-process engines for tests: a real `loadlink engine` (HTTP, scheduler model, publisher) on a
//! free port, configured by a closure so each test states only what it changes.

use crate::kv::KvEvents;
use loadlink_engine::{Engine, EngineConfig, ModelConfig};
use loadlink_publish::free_port_block;

/// Starts an engine on a free HTTP port with 16 running slots and no KV events (so no load
/// range); `tweak` adjusts the config first.
pub async fn engine(tweak: impl FnOnce(&mut EngineConfig)) -> Engine {
    let mut cfg = EngineConfig {
        port: 0,
        model: ModelConfig {
            max_running_requests: 16,
            ..Default::default()
        },
        ..Default::default()
    };
    tweak(&mut cfg);
    Engine::start(cfg).await.expect("engine starts")
}

/// Like [`engine`], but publishing its load: the KV port starts a free block of `2 × dp_size`
/// ports (the load range follows the KV ports). Returns the engine and its KV port.
pub async fn publishing_engine(tweak: impl FnOnce(&mut EngineConfig)) -> (Engine, u16) {
    let mut kv_port = 0;
    let e = engine(|cfg| {
        tweak(cfg);
        let block = u16::try_from(2 * cfg.dp_size).expect("dp_size fits a port block");
        kv_port = free_port_block(block).expect("a free port block");
        cfg.kv_events_config = Some(KvEvents::zmq(kv_port).json());
    })
    .await;
    (e, kv_port)
}
