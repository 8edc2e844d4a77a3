//! `loadlink-bench`: seeded workloads ([`workload`]), the discrete-event experiment ([`sim`]), the
//! live experiment on real processes ([`live`]), the in-process demo ([`demo`]) and the named
//! scenarios and reports ([`scenario`], [`report`]).
//!
//! The simulator drives the production scheduler model, the production publish cycle and
//! `Publisher`, the LoadBook entries and the policies in virtual time; it forks none of them. It
//! owns only what moves time and messages between them (arrivals, step ends, heartbeats, delivery
//! delays).

pub mod demo;
pub mod demo_traffic;
pub mod fleet;
pub mod live;
pub mod overload;
pub mod plot;
pub mod report;
pub mod scenario;
pub mod sim;
pub mod soak;
pub mod sweep;
pub mod workload;
