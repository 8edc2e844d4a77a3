//! What a request is routed to: a **candidate**, a worker or one DP rank of it.
//!
//! With DP attention every rank of an engine has its own queue and its own prefix cache, and the
//! engine takes a routed rank per request (SGLang 0.5.23: `X-Data-Parallel-Rank`,
//! `routed_dp_rank`). Sending a request to the worker and letting the engine's dispatcher pick a
//! rank by load alone throws away the reuse the router priced: it lands on another rank's cache
//! about (n−1)/n of the time. So a worker whose ranks are each visible (one load socket per rank,
//! pushed by the engine) is `dp_size` candidates, one per rank, each priced on its own load, its
//! own prefill speed and its own cache; the chosen rank travels with the request
//! ([`RankField`]). Polled ranks count too (a `/v1/loads` row or a `/metrics` series per rank),
//! routed by the header, which SGLang and vLLM both read. A worker whose ranks are not separately
//! visible or not addressable stays one candidate ([`Worker::rank_targets`] says why).
//!
//! This module is the one definition: [`Candidates`] is what the policies' view, admission, the
//! cache lookup and the in-flight guards all take. The ranked list is built once per change of
//! membership, or of a polled worker's ranks ([`CandidateList`], held with the worker list by the
//! fleet), so a request pays nothing to have it; the requests whose rank cannot travel (`--dp-rank-field none`, or a field
//! the route does not take) use the one-candidate-per-worker list instead.

use crate::book::{LoadSourceKind, Worker};
use std::sync::Arc;

/// One routing target: worker `worker` (an index into the worker list it was built from), and,
/// when the rank is routed by the router, its DP rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub worker: u32,
    pub rank: Option<u32>,
}

/// Whether a worker is routed per rank, or as a whole and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankTargets {
    /// One candidate per DP rank.
    PerRank,
    /// One candidate for the whole worker; the reason, for `/workers`.
    Whole(&'static str),
}

impl RankTargets {
    pub fn as_str(self) -> &'static str {
        match self {
            RankTargets::PerRank => "per-rank",
            RankTargets::Whole(_) => "worker",
        }
    }
}

impl Worker {
    /// Whether this worker's ranks are candidates of their own when ranks travel as `field`: it
    /// has more than one rank and each reports its own load, pushed on its own socket (SGLang:
    /// any field) or polled per rank (`/v1/loads` rows, `/metrics` series labelled per rank:
    /// only when the rank travels in the header, the one form both SGLang and vLLM read, vLLM as
    /// `X-data-parallel-rank` on its OpenAI routes). A polled page that aggregates the ranks
    /// names one rank, so such a worker stays whole.
    pub fn rank_targets(&self, field: RankField) -> RankTargets {
        let kind = self.load_source.kind;
        if field == RankField::None {
            RankTargets::Whole("--dp-rank-field none")
        } else if kind == LoadSourceKind::Inflight || self.no_load_reason.is_some() {
            RankTargets::Whole("no per-rank load: priced on this router's in-flight count")
        } else if self.ranks.len() < 2 {
            RankTargets::Whole("a single DP rank")
        } else if kind != LoadSourceKind::Push && field == RankField::Body {
            RankTargets::Whole(
                "polled ranks are routed by the header only, and --dp-rank-field is body",
            )
        } else {
            RankTargets::PerRank
        }
    }
}

/// The ranked candidate list of a worker list: every rank of a per-rank worker, the others whole.
/// Built when membership changes (or a polled worker reports a new rank), read by every request.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CandidateList {
    pub ranked: Vec<Candidate>,
    /// Whether any worker is split into ranks (else `ranked` is the whole list).
    pub any_ranked: bool,
}

impl CandidateList {
    pub fn of(workers: &[Arc<Worker>], field: RankField) -> Self {
        let mut ranked = Vec::with_capacity(workers.len());
        let mut any_ranked = false;
        for (i, w) in workers.iter().enumerate() {
            let worker = i as u32;
            match w.rank_targets(field) {
                RankTargets::PerRank => {
                    any_ranked = true;
                    ranked.extend(w.ranks.iter().map(|r| Candidate {
                        worker,
                        rank: Some(r.rank as u32),
                    }));
                }
                RankTargets::Whole(_) => ranked.push(Candidate { worker, rank: None }),
            }
        }
        CandidateList { ranked, any_ranked }
    }
}

/// The worker list and its candidate list, swapped in together so a request never sees one
/// without the other ([`crate::candidate`]).
#[derive(Debug, Default)]
pub struct Roster {
    pub workers: Arc<Vec<Arc<Worker>>>,
    pub candidates: CandidateList,
    /// Which candidates serve which model ([`crate::models::table`]).
    pub models: crate::models::ModelTable,
    /// The fleet's rank epoch it was built at ([`crate::fleet::Fleet::roster`] rebuilds it when a
    /// polled worker has reported a new rank since).
    epoch: u64,
    /// With prefill or decode workers: each side as a roster of its own ([`crate::pd::sides`]).
    pub pd: Option<Box<crate::pd::sides::PdSides>>,
}

impl Roster {
    /// A request's candidates: every rank of the per-rank workers when `ranked`, else one per
    /// worker.
    pub fn targets(&self, ranked: bool) -> Candidates<'_> {
        let list: &[Candidate] = if ranked { &self.candidates.ranked } else { &[] };
        Candidates::listed(&self.workers, list)
    }

    /// The candidates of a resolved model's worker set ([`crate::models::SetId`]).
    pub fn targets_for(&self, set: crate::models::SetId, ranked: bool) -> Candidates<'_> {
        self.models
            .targets(set, self.targets(false), &self.candidates.ranked, ranked)
    }

    pub(crate) fn of(
        workers: Vec<Arc<Worker>>,
        field: RankField,
        epoch: u64,
        models: &crate::models::registry::Registry,
    ) -> Self {
        let mut r = Roster::flat(workers, field, epoch, models, false);
        r.pd = crate::pd::sides::PdSides::of(&r.workers, field, epoch, models).map(Box::new);
        r
    }

    /// The roster of `workers` without PD sides; `side`: a PD side's own roster (its model table
    /// shares the fleet's counters, [`crate::models::registry::Registry::side_table`]).
    pub(crate) fn flat(
        workers: Vec<Arc<Worker>>,
        field: RankField,
        epoch: u64,
        models: &crate::models::registry::Registry,
        side: bool,
    ) -> Self {
        let candidates = CandidateList::of(&workers, field);
        let models = match side {
            true => models.side_table(&workers, &candidates),
            false => models.table(&workers, &candidates),
        };
        Roster {
            workers: Arc::new(workers),
            candidates,
            models,
            epoch,
            pd: None,
        }
    }

    /// The rank epoch it was built at.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }
}

/// A request's candidates over a worker list. With no list, one candidate per worker (how every
/// caller that does not route ranks builds it, at no cost).
#[derive(Debug, Clone, Copy)]
pub struct Candidates<'a> {
    workers: &'a [Arc<Worker>],
    list: &'a [Candidate],
}

impl<'a> Candidates<'a> {
    /// One candidate per worker.
    pub fn whole(workers: &'a [Arc<Worker>]) -> Self {
        Candidates { workers, list: &[] }
    }

    /// The candidates `list` over `workers` (an empty list: one per worker).
    pub fn listed(workers: &'a [Arc<Worker>], list: &'a [Candidate]) -> Self {
        Candidates { workers, list }
    }

    pub fn workers(&self) -> &'a [Arc<Worker>] {
        self.workers
    }

    pub fn len(&self) -> usize {
        if self.list.is_empty() {
            self.workers.len()
        } else {
            self.list.len()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Candidate `i`.
    #[inline]
    pub fn get(&self, i: usize) -> Candidate {
        match self.list.get(i) {
            Some(c) => *c,
            None => Candidate {
                worker: i as u32,
                rank: None,
            },
        }
    }

    /// Candidate `i`'s worker.
    #[inline]
    pub fn worker(&self, i: usize) -> &'a Arc<Worker> {
        &self.workers[self.get(i).worker as usize]
    }

    /// Candidate `i`'s rank (`None`: the whole worker).
    #[inline]
    pub fn rank(&self, i: usize) -> Option<u32> {
        self.get(i).rank
    }

    /// Every candidate in order.
    pub fn iter(&self) -> impl Iterator<Item = Candidate> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
}

/// How the chosen rank travels to the engine (`--dp-rank-field`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RankField {
    /// Header `X-Data-Parallel-Rank` on the OpenAI routes.
    Header,
    /// Body field `routed_dp_rank` on `/generate`, `/v1/completions`, `/v1/chat/completions`.
    Body,
    /// Both, each where the route takes it (SGLang 0.5.23 reads the header first).
    #[default]
    Both,
    /// Never: ranks are not routed; every worker is one candidate (rank-blind).
    None,
}

pub use loadlink_wire::routed_rank::{
    RANK_ALIAS as RANK_BODY_ALIAS, RANK_FIELD as RANK_BODY_FIELD, RANK_HEADER,
};

impl RankField {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "header" => Ok(RankField::Header),
            "body" => Ok(RankField::Body),
            "both" => Ok(RankField::Both),
            "none" => Ok(RankField::None),
            o => Err(format!(
                "--dp-rank-field {o:?}: expected header, body, both or none"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RankField::Header => "header",
            RankField::Body => "body",
            RankField::Both => "both",
            RankField::None => "none",
        }
    }

    /// Whether the header goes on a request to `path`.
    pub fn header_on(self, path: &str) -> bool {
        matches!(self, RankField::Header | RankField::Both) && header_route(path)
    }

    /// Whether the body field goes on a request to `path`.
    pub fn body_on(self, path: &str) -> bool {
        matches!(self, RankField::Body | RankField::Both) && body_route(path)
    }

    /// Whether a rank chosen for a request to `path` reaches the engine in this mode (else the
    /// request's candidates are whole workers).
    pub fn travels(self, path: &str) -> bool {
        self.header_on(path) || self.body_on(path)
    }
}

/// The OpenAI routes, where SGLang reads the header.
fn header_route(path: &str) -> bool {
    matches!(
        path,
        "/v1/completions" | "/v1/chat/completions" | "/v1/responses"
    )
}

/// The routes whose body SGLang reads `routed_dp_rank` from.
fn body_route(path: &str) -> bool {
    matches!(
        path,
        "/generate" | "/v1/completions" | "/v1/chat/completions"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn ranked_list_splits_only_pushed_multi_rank_workers() {
        let epoch = Instant::now();
        let ws = vec![
            Arc::new(Worker::new("http://a".into(), 4, None, epoch)),
            Arc::new(Worker::new("http://b".into(), 1, None, epoch)),
            Arc::new(Worker::new(
                "http://c".into(),
                2,
                Some("no load range".into()),
                epoch,
            )),
            Arc::new(Worker::sparse("http://d".into(), 8, epoch)),
        ];
        let l = CandidateList::of(&ws, RankField::Both);
        assert!(l.any_ranked);
        let ranks: Vec<_> = l.ranked.iter().map(|c| (c.worker, c.rank)).collect();
        assert_eq!(
            ranks,
            [
                (0, Some(0)),
                (0, Some(1)),
                (0, Some(2)),
                (0, Some(3)),
                (1, None),
                (2, None),
                (3, None)
            ]
        );
        assert_eq!(
            ws[1].rank_targets(RankField::Both),
            RankTargets::Whole("a single DP rank")
        );
        assert_eq!(
            CandidateList::of(&ws, RankField::None),
            CandidateList {
                ranked: (0..4)
                    .map(|w| Candidate {
                        worker: w,
                        rank: None
                    })
                    .collect(),
                any_ranked: false
            }
        );
        let c = Candidates::listed(&ws, &l.ranked);
        assert_eq!((c.len(), c.worker(5).url.as_str()), (7, "http://c"));
        let whole = Candidates::whole(&ws);
        assert_eq!(
            (whole.len(), whole.rank(0), whole.worker(3).url.as_str()),
            (4, None, "http://d")
        );
    }

    #[test]
    fn rank_field_modes_by_route() {
        use RankField::*;
        assert!(Header.header_on("/v1/responses") && !Header.body_on("/v1/completions"));
        assert!(!Header.travels("/generate"), "/generate takes no header");
        assert!(Body.travels("/generate") && !Body.travels("/v1/responses"));
        assert!(Both.header_on("/v1/chat/completions") && Both.body_on("/v1/chat/completions"));
        assert!(!None.travels("/v1/completions"));
        assert_eq!(RankField::parse("both"), Ok(Both));
        assert!(
            RankField::parse("all")
                .unwrap_err()
                .contains("header, body, both or none")
        );
    }
}
