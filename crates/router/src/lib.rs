//! `loadlink-router`: the load-aware router. It discovers each worker's load sockets from
//! `/server_info` ([`fleet`]), subscribes per DP rank ([`subscribe`]), merges engine snapshots,
//! dispatches and in-flight guards into one load per worker ([`book`]), picks with a pure
//! [`policy`], and proxies OpenAI-compatible traffic with streaming pass-through ([`proxy`]).
//! See `docs/router.md`.

pub mod book;
pub mod fleet;
pub mod policy;
pub mod proxy;
pub mod server;
pub mod subscribe;

pub use book::{InflightGuard, Load, LoadSignal, Source, Worker};
pub use policy::{Policy, View};
pub use server::{RouterConfig, RouterError, RouterHandle, start};
