//! The router's belief about engines' prefix caches, and the one place policies get it from.
//!
//! * [`index`]: the precise view, a block index fed by each worker's KV-event stream;
//! * [`book`]: [`CacheBook`], the index shared between the ingest threads (writers) and the
//!   request path (readers), with the (worker, rank) → slot map, the per-rank quota, and the
//!   approximate trees;
//! * [`stream`]: what the KV-event streams did (per-stream counters, resync reasons, the
//!   book-wide counters);
//! * [`request`]: a request's block-hash chains (one per block size it is matched at), through the router's [`tokenizer`] (the engine's
//!   deterministic one, or a real model's `tokenizer.json` and chat template).
//! * [`approx`]: for workers without KV events, what this router sent them (bounded by size and
//!   age), answering in the same shape as the index; `approx_slots` keeps one per worker;
//! * [`lookup`]: the request path's question, one request against every worker, answered from
//!   the index (at the worker's advertised block size, [`block_size`]) or the tree per worker.
//!
//! Dependencies run one way: `lookup` and `report` → `book` → `index`, `approx_slots` → `approx`,
//! all → `id_hash` (the one hasher for already-unique ids).
//!
//! Policies never touch an index: the request path asks for this request's cached prefix on every
//! worker and hands those numbers to the policy through its [`crate::policy::View`].

pub mod approx;
mod approx_slots;
pub mod block_size;
pub mod book;
mod chain_hash;
mod chat_context;
mod chat_env;
mod id_hash;
pub mod index;
pub mod lookup;
mod prefix_match;
mod py_json;
pub mod regret;
mod report;
pub mod request;
pub mod reuse;
pub mod stream;
pub mod tier;
mod tier_lookup;
pub mod tokenizer;

pub use approx::{ApproxStats, ApproxTree};
pub use approx_slots::{APPROX_MAX_BLOCKS, APPROX_TTL_MS};
pub use book::{CacheBook, DEFAULT_MAX_BLOCKS, UNLINK_STEP};
pub use index::{KvIndex, Slot, SlotStats};
pub use lookup::{Lookup, PrefixSettings, PrefixSource};
pub use request::{ChainNamespace, PromptChain, prompt_ids};
pub use reuse::TailReuse;
pub use stream::{CacheCounters, EVENT_TYPES, ResyncReason, StreamStats, View};
pub use tier::{Tier, TierMatch};
pub use tokenizer::RouterTokenizer;
