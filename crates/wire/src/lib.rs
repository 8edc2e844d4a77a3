//! `loadlink-wire`: the load-publishing protocol as pure functions and types, shared by the engine
//! side (publisher) and the router side (subscriber). No I/O, no async runtime, no logging.
//!
//! * [`snapshot`] — `LoadSnapshot` (generation A) and `LoadStat` (generation B); its optional
//!   sections are declared once, in a table (`sections.rs`);
//! * [`codec`] — msgspec-exact encoding, tolerant decoding, the payload detector;
//! * [`frame`] — the three-frame message `[topic, i64 BE seq, payload]`;
//! * [`kv_events`] — the KV-event stream's `KVEventBatch` (SGLang/vLLM encoding) and page hashes;
//! * [`kv_snapshot`] — `snapshot-v1` replies on the replay socket and the epoch topic suffix;
//! * [`endpoint`], [`ports`] — tcp endpoint parsing and the one port-range resolver;
//! * [`descriptor`] — the `/server_info` `kv_events` block, built and parsed;
//! * [`discovery`] — worker URL + `/server_info` body → load endpoints, or why there are none;
//! * [`shm`] — the SLNS v2 slot-file layout;
//! * [`loads`] — `/v1/loads` JSON and Prometheus rendering;
//! * [`polled`] — `/v1/loads` JSON and `/metrics` pages read back into per-rank snapshots, for
//!   engines a router polls;
//! * [`prom`] — the one Prometheus text writer and its strict parser;
//! * [`tokenize`], [`prompt`] — the simulated engine's tokenizer and chat template, and the
//!   reading of a request's prompt, which a cache-aware router must share with the engine.

pub mod codec;
pub mod descriptor;
pub mod discovery;
pub mod endpoint;
pub mod error;
pub mod frame;
pub mod kv_events;
pub mod kv_namespace;
pub mod kv_snapshot;
pub mod loads;
mod msgpack;
pub mod polled;
pub mod ports;
pub mod prom;
pub mod prompt;
pub mod routed_rank;
mod sections;
pub mod shm;
pub mod snapshot;
pub mod tokenize;

pub use codec::{
    Payload, decode_payload, decode_snapshot, decode_stat, encode_snapshot, encode_stat,
};
pub use error::{DecodeError, FrameError};
pub use ports::{Generation, KvEventsConfig, LoadRange, RangeRequest, resolve_load_range};
pub use snapshot::{LoadSnapshot, LoadStat};
