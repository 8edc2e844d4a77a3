//! `loadlink-engine`: a simulated SGLang-compatible engine. The pure [`model::Scheduler`] runs on
//! an injected clock; [`cycle`] decides when a rank publishes (shared with the simulator in
//! `loadlink-bench`); [`rank`] drives it in real time and publishes through `loadlink-publish`;
//! [`http`] serves SGLang's HTTP surface; [`api`] parses request bodies.

pub mod api;
pub mod cycle;
mod discovery;
mod dispatch;
pub mod flavor;
pub mod host_tier;
pub mod http;
mod metrics;
pub mod model;
mod page_chain;
pub mod pd;
pub mod radix;
pub mod rank;
mod reply;
mod routed;
mod routes;
pub mod served;
mod state;
pub use loadlink_wire::tokenize;

pub use cycle::{CycleEvent, IDLE_PUBLISH_FLOOR, Publish, PublishCycle, PublishPoint};
pub use flavor::Flavor;
pub use http::{Engine, EngineError};
pub use model::{LoraConfig, ModelConfig, PdMode, Timing};
pub use pd::PdConfig;
pub use served::AdapterSpec;
pub use state::EngineConfig;
