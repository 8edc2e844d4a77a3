//! The router's belief about engines' prefix caches, and the one place policies get it from.
//!
//! * [`index`]: the precise view, a block index fed by each worker's KV-event stream;
//! * [`stream`]: [`CacheBook`], the index shared between the ingest threads (writers) and the
//!   request path (readers), with the (worker, rank) → slot map and the per-stream counters;
//! * [`request`]: a request's block-hash chain, through the router's [`tokenizer`] (the engine's
//!   deterministic one, or a real model's `tokenizer.json` and chat template).
//! * [`approx`]: for workers without KV events, what this router sent them (bounded by size and
//!   age), answering in the same shape as the index;
//! * [`lookup`]: the request path's question, one request against every worker, answered from
//!   the index or the tree per worker.
//!
//! Policies never touch an index: the request path asks for this request's cached prefix on every
//! worker and hands those numbers to the policy through its [`crate::policy::View`].

pub mod approx;
pub mod index;
pub mod lookup;
mod report;
pub mod request;
pub mod stream;
pub mod tokenizer;

pub use approx::{ApproxStats, ApproxTree};
pub use index::{KvIndex, Slot, SlotStats};
pub use lookup::{Lookup, PrefixSettings, PrefixSource};
pub use request::PromptChain;
pub use stream::{CacheBook, DEFAULT_MAX_BLOCKS, ResyncReason, StreamStats};
pub use tokenizer::RouterTokenizer;
