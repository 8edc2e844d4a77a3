//! The router's belief about engines' prefix caches, and the one place policies get it from.
//!
//! * [`index`]: the precise view, a block index fed by each worker's KV-event stream.
//! * [`approx`]: for workers without KV events, what this router sent them (bounded by size and
//!   age), answering in the same shape as the index.
//!
//! Policies never touch an index: the request path asks for this request's cached prefix on every
//! worker and hands those numbers to the policy through its [`crate::policy::View`].

pub mod approx;
pub mod index;

pub use approx::{ApproxStats, ApproxTree};
pub use index::{KvIndex, Slot, SlotStats};
