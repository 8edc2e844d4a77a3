//! `loadlink-router`: the load-aware router. It discovers each worker's load sockets from
//! `/server_info` ([`discovery`], [`fleet`]), subscribes per DP rank ([`subscribe`], received by
//! the [`ingest`] threads) or polls workers without sockets ([`poll`]), merges engine snapshots,
//! dispatches and in-flight guards into one load per worker ([`book`]), learns what each worker
//! has cached from its KV events ([`cache`]), picks with a pure [`policy`] behind [`admission`]
//! caps, and proxies OpenAI-compatible traffic with streaming pass-through ([`proxy`], [`models`]).
//! Workers come from flags, a watched file or DNS ([`membership`]). Everything a peer sends is
//! bounded by a [`budget`], and every refusal is counted there by reason: HTTP answers within
//! [`peer_http`], large request bodies worked off the executor by [`request_work`], the executor
//! itself watched by [`executor_probe`], the allocator's arenas capped by [`malloc`].
//!
//! The HTTP front is split by concern: [`config`] (what it is started with, one set of defaults for
//! the CLI and embedders), [`state`] (what the handlers share), [`metrics`] (`/metrics`), [`admin`]
//! (`/workers`), [`dashboard`], and [`server`], which wires routes and runs the process, drain
//! included. [`fdlimit`] and [`zctx`] size descriptor and libzmq limits. See `docs/router.md`.

pub mod adapters;
pub mod admin;
pub mod admission;
pub mod book;
pub mod budget;
pub mod cache;
pub mod candidate;
pub mod config;
pub mod dashboard;
pub mod discovery;
pub mod executor_probe;
pub mod fdlimit;
pub mod fleet;
pub mod fleet_view;
pub mod ingest;
pub mod malloc;
pub mod membership;
pub mod metrics;
pub mod models;
pub mod pd;
pub mod peer_http;
pub mod policy;
pub mod poll;
pub mod proxy;
pub mod rank_route;
pub mod request_work;
mod retry;
pub mod server;
pub mod state;
pub mod subscribe;
pub mod watch;
pub mod watch_router;
pub mod zctx;

pub use book::{InflightGuard, Load, LoadSignal, Pricing, Source, Worker};
pub use config::RouterConfig;
pub use metrics::Metrics;
pub use policy::{Policy, View};
pub use server::{RouterError, RouterHandle, start};
pub use state::AppState;
