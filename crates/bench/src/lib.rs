//! `loadlink-bench`: seeded workloads ([`workload`]), the discrete-event experiment ([`sim`]) and
//! the named scenarios and reports ([`scenario`], [`report`]). The simulator drives the production
//! scheduler model, LoadBook and policies — it forks none of them.

pub mod live;
pub mod plot;
pub mod report;
pub mod scenario;
pub mod sim;
pub mod workload;
