//! The router's belief about engines' prefix caches, and the one place policies get it from.
//!
//! * [`index`]: the precise view, a block index fed by each worker's KV-event stream;
//! * [`request`]: a request's block-hash chain, through the router's [`tokenizer`] (the engine's
//!   deterministic one, or a real model's `tokenizer.json` and chat template).
//!
//! Policies never touch an index: the request path asks for this request's cached prefix on every
//! worker and hands those numbers to the policy through its [`crate::policy::View`].

pub mod index;
pub mod request;
pub mod tokenizer;

pub use index::{KvIndex, Slot, SlotStats};
pub use request::PromptChain;
pub use tokenizer::RouterTokenizer;
