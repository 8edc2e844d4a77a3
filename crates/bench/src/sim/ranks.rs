//! Engines with data-parallel ranks. With DP attention each rank of an engine is a scheduler of its
//! own: its own queue, KV pool and radix cache, its own load snapshots and KV-event stream. So the
//! simulator runs one [`super::engine::SimEngine`] per rank ("unit"), numbered engine-major
//! ([`Layout`]), and the router's book holds one `Worker` per engine with one rank slot per unit.
//!
//! A request reaches a rank in one of two ways, as on a live engine:
//!
//! * **Routed to a rank** (the router's candidate was a rank, and the rank travelled with the
//!   request): that rank's scheduler takes it.
//! * **Without a rank** (rank-blind routing, a worker routed whole, or a direct client): the
//!   engine's own dispatcher picks one ([`Dispatcher`], the rule of `loadlink engine`'s
//!   `dispatch.rs`), from what each rank last published, without the network delay the routers
//!   see (the live dispatcher reads the ranks' shared-memory slots).
//!
//! Whether the routers route ranks is the variant's [`RankRouting`]; a one-rank engine is one
//! candidate either way, and its dispatcher always answers rank 0, so fleets of one-rank engines
//! behave exactly as before ranks existed.

use super::Sim;
use loadlink_publish::Sent;
use loadlink_router::Worker;
use loadlink_router::candidate::{Candidate, CandidateList};
use loadlink_wire::LoadSnapshot;
use std::sync::Arc;

/// Whether the routers send requests to ranks or to whole engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RankRouting {
    /// Every rank of a multi-rank engine is a candidate, and the chosen rank travels with the
    /// request (`loadlink route`'s default, `--dp-rank-field both`).
    #[default]
    PerRank,
    /// Every engine is one candidate; its dispatcher picks the rank (`--dp-rank-field none`, or a
    /// router that does not know ranks).
    Whole,
}

impl RankRouting {
    pub fn as_str(self) -> &'static str {
        match self {
            RankRouting::PerRank => "rank-aware",
            RankRouting::Whole => "rank-blind",
        }
    }

    /// The routers' candidate list over a replica's `workers`: empty (one candidate per worker)
    /// when ranks are not routed.
    pub(crate) fn candidates(self, workers: &[Arc<Worker>]) -> Vec<Candidate> {
        match self {
            RankRouting::PerRank => {
                CandidateList::of(workers, loadlink_router::candidate::RankField::Both).ranked
            }
            RankRouting::Whole => Vec::new(),
        }
    }
}

/// Where each rank of each engine sits among the simulator's schedulers: unit `e × ranks + r` is
/// rank `r` of engine `e`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) engines: usize,
    pub(crate) ranks: usize,
}

impl Layout {
    /// `engines` engines of `ranks` ranks each (at least 1).
    pub(crate) fn new(engines: usize, ranks: usize) -> Self {
        Layout {
            engines,
            ranks: ranks.max(1),
        }
    }

    /// Schedulers over the fleet.
    /// Each router replica's book: one worker per engine, with its ranks.
    pub(crate) fn books(self, routers: usize, epoch: std::time::Instant) -> Vec<Vec<Arc<Worker>>> {
        let engine = |e| {
            Arc::new(Worker::new(
                format!("sim://engine{e}"),
                self.ranks,
                None,
                epoch,
            ))
        };
        (0..routers)
            .map(|_| (0..self.engines).map(engine).collect())
            .collect()
    }

    /// Every rank of every engine as a scheduler of its engine's model, publishing as `cfg` says.
    pub(crate) fn schedulers(self, cfg: &super::SimConfig) -> Vec<super::engine::SimEngine> {
        (0..self.units())
            .map(|u| {
                let (m, rank) = (cfg.engines[self.engine_of(u)], self.rank_of(u));
                super::engine::SimEngine::new(rank as u32, m, cfg.publish_point, cfg.publish_every)
            })
            .collect()
    }

    pub(crate) fn units(self) -> usize {
        self.engines * self.ranks
    }

    pub(crate) fn unit(self, engine: usize, rank: usize) -> usize {
        engine * self.ranks + rank
    }

    pub(crate) fn engine_of(self, unit: usize) -> usize {
        unit / self.ranks
    }

    pub(crate) fn rank_of(self, unit: usize) -> usize {
        unit % self.ranks
    }

    /// The units a candidate stands for: its rank's, or every rank of its engine.
    pub(crate) fn units_of(self, c: Candidate) -> std::ops::Range<usize> {
        let e = c.worker as usize;
        match c.rank {
            Some(r) => {
                let u = self.unit(e, (r as usize).min(self.ranks - 1));
                u..u + 1
            }
            None => self.unit(e, 0)..self.unit(e + 1, 0),
        }
    }
}

/// One engine's internal DP dispatcher, as `loadlink engine` runs it: the rank with the fewest
/// running + waiting requests in its latest published snapshot, plus the requests dispatched there
/// since that snapshot (counted from the snapshot's timestamp, reset when a newer one appears);
/// ties go to the first rank from a round-robin start that advances every pick. A rank that never
/// published counts as empty.
#[derive(Debug, Clone)]
pub(crate) struct Dispatcher {
    /// Per rank: running + waiting, and the timestamp of its latest snapshot (its SHM slot).
    latest: Vec<Option<(i64, f64)>>,
    /// Per rank: (timestamp of the snapshot last seen, dispatched since then).
    dispatch: Vec<(f64, i64)>,
    rr: usize,
}

impl Dispatcher {
    pub(crate) fn new(ranks: usize) -> Self {
        Dispatcher {
            latest: vec![None; ranks],
            dispatch: vec![(0.0, 0); ranks],
            rr: 0,
        }
    }

    /// Rank `rank` published `snap` (it is now what its slot holds).
    pub(crate) fn published(&mut self, rank: usize, snap: &LoadSnapshot) {
        if let Some(slot) = self.latest.get_mut(rank) {
            *slot = Some((
                snap.num_running_reqs + snap.num_waiting_reqs,
                snap.timestamp(),
            ));
        }
    }

    /// The rank for a request that names none.
    pub(crate) fn pick_rank(&mut self) -> usize {
        let n = self.latest.len();
        if n <= 1 {
            return 0;
        }
        let start = self.rr;
        self.rr = self.rr.wrapping_add(1);
        let mut best = (i64::MAX, 0);
        for k in 0..n {
            let r = (start + k) % n;
            let (load, ts) = self.latest[r].unwrap_or((0, 0.0));
            if ts != self.dispatch[r].0 {
                self.dispatch[r] = (ts, 0);
            }
            let score = load + self.dispatch[r].1;
            if score < best.0 {
                best = (score, r);
            }
        }
        self.dispatch[best.1].1 += 1;
        best.1
    }

    /// A request routed to `rank` by name: counted there until the rank's next snapshot, as if the
    /// dispatcher had picked it (the engine's `Dispatcher::count_routed`).
    pub(crate) fn count_routed(&mut self, rank: usize) {
        let Some(&latest) = self.latest.get(rank).filter(|_| self.latest.len() > 1) else {
            return;
        };
        let ts = latest.map_or(0.0, |(_, ts)| ts);
        if ts != self.dispatch[rank].0 {
            self.dispatch[rank] = (ts, 0);
        }
        self.dispatch[rank].1 += 1;
    }
}

impl Sim<'_> {
    /// The scheduler a request for candidate `c` lands on: its rank when it names one, else the
    /// one its engine's dispatcher picks.
    pub(super) fn unit_for(&mut self, c: Candidate) -> usize {
        let e = c.worker as usize;
        let rank = match c.rank {
            Some(r) => {
                let r = (r as usize).min(self.layout.ranks - 1);
                self.dispatchers[e].count_routed(r);
                r
            }
            None => self.dispatchers[e].pick_rank(),
        };
        self.layout.unit(e, rank)
    }

    /// Unit `u` published `sent`: its engine's dispatcher reads it at once.
    pub(super) fn dispatcher_reads(&mut self, u: usize, sent: &[Sent]) {
        let (e, r) = (self.layout.engine_of(u), self.layout.rank_of(u));
        for s in sent {
            self.dispatchers[e].published(r, &s.snapshot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(running: i64, waiting: i64, ts: f64) -> LoadSnapshot {
        LoadSnapshot {
            num_running_reqs: running,
            num_waiting_reqs: waiting,
            timestamp: Some(ts),
            ..LoadSnapshot::default()
        }
    }

    #[test]
    fn the_dispatcher_picks_the_least_loaded_rank_counting_what_it_sent_since_the_snapshot() {
        let mut d = Dispatcher::new(3);
        d.published(0, &snap(4, 2, 1.0));
        d.published(1, &snap(1, 0, 1.0));
        d.published(2, &snap(2, 1, 1.0));
        // Loads 6, 1, 3: rank 1 until what was sent there since its snapshot makes it 3; the tie
        // with rank 2 goes to the first from the round-robin start (2), then rank 2 counts 4.
        let picks: Vec<usize> = (0..4).map(|_| d.pick_rank()).collect();
        assert_eq!(picks, [1, 1, 2, 1]);
        // A new snapshot of rank 1 resets what was counted there.
        d.published(1, &snap(0, 0, 2.0));
        assert_eq!(d.pick_rank(), 1);
        // Requests routed to rank 1 by name count there too: the next pick avoids it.
        for _ in 0..4 {
            d.count_routed(1);
        }
        assert_ne!(d.pick_rank(), 1);
    }

    #[test]
    fn the_dispatcher_spreads_ties_round_robin_and_counts_silent_ranks_as_empty() {
        let mut d = Dispatcher::new(4);
        let picks: Vec<usize> = (0..8).map(|_| d.pick_rank()).collect();
        let mut counts = [0; 4];
        for p in &picks {
            counts[*p] += 1;
        }
        assert_eq!(counts, [2, 2, 2, 2], "{picks:?}");
        assert_eq!(Dispatcher::new(1).pick_rank(), 0);
    }

    #[test]
    fn the_layout_is_engine_major() {
        let l = Layout::new(2, 4);
        assert_eq!(l.units(), 8);
        assert_eq!((l.engine_of(6), l.rank_of(6)), (1, 2));
        let whole = Candidate {
            worker: 1,
            rank: None,
        };
        let rank = Candidate {
            worker: 1,
            rank: Some(3),
        };
        assert_eq!((l.units_of(whole), l.units_of(rank)), (4..8, 7..8));
    }
}
