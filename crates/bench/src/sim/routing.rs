//! Who routes a run's requests: router replicas running a production policy, or an oracle with
//! perfect knowledge; and where the traffic that bypasses the routers goes.

use super::Oracle;
use loadlink_router::Policy;

/// Who routes the routed requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SimRouter {
    /// Router replicas running a production policy.
    Policy(Policy),
    /// Exact knowledge of every engine, soonest first token ([`clairvoyant`]); the same router as
    /// `Oracle(Oracle::Greedy)`.
    Clairvoyant,
    /// One oracle of the bound's family ([`oracle`]).
    Oracle(Oracle),
}

/// Where direct (router-bypassing) traffic goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectTarget {
    /// Spread uniformly over engines.
    Uniform,
    /// All of it on engine 0 (a hot tenant, a pinned batch job).
    Pinned,
}
