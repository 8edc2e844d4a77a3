//! How engine load reaches a router replica in the simulator: pushed (every published snapshot,
//! `net_delay_s` later, as over the load socket) or polled (each replica fetches each engine's
//! latest snapshot every `interval_s`, as `loadlink route` polls `GET /v1/loads` on an engine
//! without a load socket; the answer lands `net_delay_s` after the poll left).
//!
//! A poll reads what `/v1/loads` serves: the last snapshot the engine published (its SHM slot).
//! Either way the router stores it through the production book, so the freshness bound and the
//! dispatched-since-snapshot correction apply alike; what polling loses is the updates between
//! two polls, and the dispatches between a snapshot and the poll that fetched it.

use super::{Ev, Sim};
use loadlink_publish::Sent;
use loadlink_wire::LoadSnapshot;

/// How snapshots reach the routers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum LoadDelivery {
    /// Every published snapshot, `net_delay_s` later (the load socket).
    #[default]
    Push,
    /// Each replica polls each engine every `interval_s` seconds.
    Poll { interval_s: f64 },
}

impl LoadDelivery {
    /// `push`, or `poll:MS` (the poll interval in milliseconds).
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "push" {
            return Ok(LoadDelivery::Push);
        }
        s.strip_prefix("poll:")
            .and_then(|ms| ms.parse::<f64>().ok())
            .filter(|ms| ms.is_finite() && *ms > 0.0)
            .map(|ms| LoadDelivery::Poll {
                interval_s: ms / 1000.0,
            })
            .ok_or_else(|| format!("load delivery {s:?}: expected push or poll:MS (MS > 0)"))
    }

    /// `push` or `poll-100ms`, for labels and file names.
    pub fn label(self) -> String {
        match self {
            LoadDelivery::Push => "push".into(),
            LoadDelivery::Poll { interval_s } => format!("poll-{}ms", interval_s * 1000.0),
        }
    }
}

/// Each engine's latest published snapshot, what a poll reads.
#[derive(Debug, Default)]
pub(super) struct Latest {
    snaps: Vec<Option<(i64, LoadSnapshot)>>,
}

impl Latest {
    pub(super) fn new(engines: usize) -> Self {
        Latest {
            snaps: vec![None; engines],
        }
    }

    /// Engine `e` published `snap` with `seq`.
    pub(super) fn published(&mut self, e: usize, seq: i64, snap: &LoadSnapshot) {
        self.snaps[e] = Some((seq, snap.clone()));
    }

    /// What a poll of engine `e` answers now.
    pub(super) fn read(&self, e: usize) -> Option<(i64, LoadSnapshot)> {
        self.snaps[e].clone()
    }
}

/// The first poll of (replica `router`, engine `e`): phases spread over one interval, so a
/// replica's polls of the fleet, and the replicas, do not all land at once.
pub(super) fn first_poll(
    interval_s: f64,
    router: usize,
    e: usize,
    engines: usize,
    routers: usize,
) -> f64 {
    let slots = (engines * routers).max(1) as f64;
    interval_s * ((router * engines + e) as f64 + 0.5) / slots
}

impl Sim<'_> {
    /// What engine `e` published, to push to the routers; under polling, kept for the polls
    /// instead (nothing is pushed).
    pub(super) fn held_for_polls(&mut self, e: usize, sent: Vec<Sent>) -> Vec<Sent> {
        if self.cfg.delivery == LoadDelivery::Push {
            return sent;
        }
        for s in &sent {
            self.latest.published(e, s.seq, &s.snapshot);
        }
        Vec::new()
    }

    /// Schedules every replica's first poll of every engine (polled delivery only).
    pub(super) fn start_polls(&mut self) {
        if let LoadDelivery::Poll { interval_s } = self.cfg.delivery {
            let (engines, routers) = (self.engines.len(), self.cfg.routers);
            for r in 0..routers {
                for e in 0..engines {
                    let t = first_poll(interval_s, r, e, engines, routers);
                    self.push(
                        t,
                        Ev::Poll {
                            router: r,
                            engine: e,
                        },
                    );
                }
            }
        }
    }

    /// Replica `router` polls `engine` at `t`: the answer (its latest snapshot) lands
    /// `net_delay_s` later; the next poll leaves one interval after this one.
    pub(super) fn poll(&mut self, router: usize, engine: usize, t: f64) {
        let LoadDelivery::Poll { interval_s } = self.cfg.delivery else {
            return;
        };
        if let Some((seq, snap)) = self.latest.read(engine) {
            let at = t + self.cfg.net_delay_s;
            let snap = Box::new(snap);
            self.push(
                at,
                Ev::Deliver {
                    router,
                    engine,
                    seq,
                    snap,
                },
            );
        }
        self.push(t + interval_s, Ev::Poll { router, engine });
    }
}

#[cfg(test)]
mod tests {
    use super::LoadDelivery;
    use crate::scenario::{Scenario, by_name, run};
    use loadlink_router::{LoadSignal, Policy};

    fn fallback_share(delivery: LoadDelivery) -> f64 {
        let s = Scenario {
            duration_s: 30.0,
            delivery,
            ..by_name("s1").unwrap()
        };
        let o = run(&s, 1, 0.85, Policy::PowerOfTwo, LoadSignal::Backlog);
        assert!(o.decisions > 100, "{delivery:?}: the routers route");
        o.fallback_decisions as f64 / o.decisions as f64
    }

    #[test]
    fn polls_within_the_freshness_bound_keep_routers_on_engine_load_and_slower_ones_do_not() {
        assert_eq!(
            LoadDelivery::parse("poll:100"),
            Ok(LoadDelivery::Poll { interval_s: 0.1 })
        );
        assert!(LoadDelivery::parse("poll:0").is_err() && LoadDelivery::parse("pull").is_err());
        let push = fallback_share(LoadDelivery::Push);
        let poll = fallback_share(LoadDelivery::Poll { interval_s: 0.1 });
        // Slower than the 3 s freshness bound: stale for 2 s of every 5.
        let slow = fallback_share(LoadDelivery::Poll { interval_s: 5.0 });
        assert!(push < 0.01 && poll < 0.01, "push {push}, poll {poll}");
        assert!(slow > 0.2, "5 s polls: {slow}");
    }
}
