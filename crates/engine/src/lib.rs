//! `loadlink-engine`: a simulated SGLang-compatible engine. The pure [`model::Scheduler`] runs on
//! an injected clock; [`rank`] drives it in real time and publishes through `loadlink-publish`;
//! [`http`] serves SGLang's HTTP surface; [`api`] parses request bodies.

pub mod api;
pub mod http;
pub mod model;
pub mod radix;
pub mod rank;
pub mod tokenize;

pub use http::{Engine, EngineConfig, EngineError};
pub use model::{ModelConfig, Timing};
pub use rank::PublishPoint;
