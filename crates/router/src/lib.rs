//! `loadlink-router`: the load-aware router. It discovers each worker's load sockets from
//! `/server_info` ([`fleet`]), subscribes per DP rank ([`subscribe`]), merges engine snapshots,
//! dispatches and in-flight guards into one load per worker ([`book`]), picks with a pure
//! [`policy`], and proxies OpenAI-compatible traffic with streaming pass-through ([`proxy`]).
//!
//! The HTTP front is split by concern: [`config`] (what it is started with), [`state`] (what the
//! handlers share), [`metrics`] (`/metrics`), [`admin`] (`/workers`), [`dashboard`], and
//! [`server`], which only wires routes and runs the process. See `docs/router.md`.

pub mod admin;
pub mod admission;
pub mod book;
pub mod budget;
pub mod cache;
pub mod config;
pub mod dashboard;
pub mod discovery;
pub mod executor_probe;
pub mod fdlimit;
pub mod fleet;
pub mod ingest;
pub mod membership;
pub mod metrics;
pub mod models;
pub mod peer_http;
pub mod policy;
pub mod poll;
pub mod proxy;
pub mod request_work;
pub mod server;
pub mod state;
pub mod subscribe;
pub mod watch;
pub mod zctx;

pub use book::{InflightGuard, Load, LoadSignal, Pricing, Source, Worker};
pub use config::RouterConfig;
pub use metrics::Metrics;
pub use policy::{Policy, View};
pub use server::{RouterError, RouterHandle, start};
pub use state::AppState;
