//! Dev-only test kit for loadlink's integration tests, in the manner of `tower-test`.
//!
//! Every crate's `tests/` used to carry its own copy of the same helpers (bounded waits, engine
//! starters, the KV-events JSON, SUB sockets that beat the slow-joiner problem, `/metrics`
//! prefix matchers). They drifted apart; this crate is the one copy. Crates list it under
//! `[dev-dependencies]`; cargo allows the cycle (`loadlink-engine` dev-depends on the kit, the kit
//! depends on `loadlink-engine`) for integration tests, which link the crate as a normal library.
//! Unit tests inside `src/` cannot use it: they would see a second, distinct copy of their crate.
//!
//! * [`background`]: a second runtime for workers and clients, so a test can watch the router's
//!   own runtime alone.
//! * [`counting_worker`]: a worker that publishes, and remembers the peak of, what it holds.
//! * [`wait`]: bounded polling of a condition, async and blocking.
//! * [`kv`]: the SGLang `--kv-events-config` JSON and the `/server_info` descriptor a worker shows.
//! * [`engine`] / [`router`]: in-process starters on free ports, and router-side readers.
//! * [`http`]: the requests every suite sends (a completion, a page as JSON or text), checking
//!   the status and naming the URL on failure.
//! * [`pub_sink`]: the PUB load socket a test binds when it plays the engine.
//! * [`hostile_pub`]: a publisher that sends anything (oversized, random, floods) until dropped.
//! * [`kv_sync`]: a KV-publishing engine with replay, its `/cache_blocks`, a wait until a
//!   router's KV index equals it, and a cuttable TCP relay with a `/server_info` front (to make a
//!   router miss batches on purpose).
//! * [`replay`]: asks a KV-event publisher's replay socket for its buffered batches.
//! * [`kv_snapshot`]: asks a replay socket for a `snapshot-v1` cut and checks the answer's shape.
//! * [`sub`]: libzmq sockets that wait for their first message before a test relies on them.
//! * [`rank_worker`]: a worker of several DP ranks, each publishing its own load, that records
//!   the rank header and body of every request it receives.
//! * [`pd_router`]: capture engines of a PD fleet (a role and bootstrap port in `/server_info`,
//!   every body recorded, answers as told: normal, an error status, slow, or cut mid-stream).
//! * [`polled_worker`]: a fake polled worker whose `/v1/loads` or `/metrics` answers what the
//!   test says, request by request (absurd ranks, huge bodies, stalls).
//! * [`served`]: engines serving named models and LoRA adapters, their per-model request
//!   counters, and a restart on the same port under other names.
//! * [`fleet_models`]: a router's side of a fleet of models: requests for a model on any route
//!   (read to their end), the admin API, and the router's `/v1/models` by model and worker.
//! * [`pd_engines`]: prefill–decode fleets of real engines (N prefill, M decode), the
//!   bootstrap fields a router adds, and the engines' room counters.
//! * [`metrics`]: fetches a `/metrics` page and parses it with the strict
//!   [`loadlink_wire::prom::parse`], so every metrics read also checks the format.

pub mod background;
pub mod counting_worker;
pub mod drain;
pub mod engine;
pub mod fleet_models;
pub mod hostile_http;
pub mod hostile_pub;
pub mod http;
pub mod kv;
pub mod kv_snapshot;
pub mod kv_sync;
pub mod metrics;
pub mod pd_engines;
pub mod pd_router;
pub mod polled_worker;
pub mod pub_sink;
pub mod rank_worker;
pub mod replay;
pub mod router;
pub mod served;
pub mod sub;
pub mod wait;

pub use engine::{engine, publishing_engine};
pub use http::{complete, complete_ok, get_json, get_text, post, post_json};
pub use kv::KvEvents;
pub use kv_sync::{
    KvEngine, TcpRelay, bare_kv_fleet, engine_blocks, engine_cut, kv_engine, kv_engine_config,
    kv_engine_then, publishes_kv, router_blocks, server_info_front, wait_index_matches,
};
pub use metrics::scrape;
pub use pub_sink::snapshot_pub;
pub use replay::{Replayed, replay};
pub use router::{http_worker, router, wait_worker, worker_json, worker_of, workers};
pub use sub::{drain_snapshots, first_message, joined_sub, publish_until_received, sub};
pub use wait::{wait_for, wait_for_sync, wait_until, wait_until_sync};
