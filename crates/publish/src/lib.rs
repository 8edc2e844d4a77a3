//! `loadlink-publish`: the engine side. Every scheduler rank collects one `LoadSnapshot` per cycle
//! and the [`Publisher`] hands it to several [`Sink`]s — the SHM slot file or PUSH socket for
//! in-engine consumers, and a ZeroMQ PUB socket any number of routers subscribe to.
//!
//! See `docs/publisher.md` for embedding, the port footprint and the failure semantics.

pub mod factory;
pub mod free_ports;
pub mod kv_cut;
pub mod kv_publisher;
mod kv_replay;
pub mod memory_sink;
pub mod publisher;
pub mod shm_sink;
pub mod sink;
pub mod stale_slots;
pub mod zmq_sinks;

pub use factory::{
    BuiltSinks, EngineSettings, InternalSink, build_kv_publisher, build_sinks, sink_interval,
};
pub use free_ports::free_port_block;
pub use kv_cut::{CacheCut, CutPage, SnapshotSource, order_records, snapshot_replies};
pub use kv_publisher::{KvEventPublisher, KvPublisherConfig, KvPublisherStats, KvSeq};
pub use memory_sink::{MemorySink, Sent};
pub use publisher::{
    CycleReport, FailureReport, FailureThrottle, LoadSource, Publisher, SinkStats,
};
pub use shm_sink::{ShmReader, ShmSink, read_slots};
pub use sink::{Encoded, Sink, SinkError, WriteOutcome};
pub use stale_slots::remove_stale_slot_files;
pub use zmq_sinks::{PubSink, PushSink};
