//! The discrete-event experiment: the production engine model (`loadlink_engine::model::Scheduler`),
//! the production `LoadBook` entries (`loadlink_router::Worker`) and the production policies, in
//! virtual time. Nothing here re-implements a policy or the scheduler; the simulator only moves
//! time and messages between them:
//!
//! * each engine steps its scheduler; a step's events happen at the step's end;
//! * an engine ([`engine`]) reports its cycle to the production `PublishCycle` and publishes through
//!   the real `Publisher` (an in-memory sink, due every `publish_every` cycles unless forced), so
//!   it publishes exactly when `loadlink engine` would; idle engines heartbeat every
//!   `IDLE_PUBLISH_FLOOR`; each router replica receives a snapshot `net_delay_s` later;
//! * routed requests are picked by the router replica they arrive at (round-robin over replicas),
//!   which holds an in-flight guard until the request finishes; direct requests skip routers;
//! * each engine's KV events reach every replica's KV index `net_delay_s` later, and each replica
//!   records what it dispatched in its own approximate tree ([`cache`]); the variant's
//!   [`CacheView`] says which of them the policy's view reads;
//! * the [`clairvoyant`] router instead forks every engine's scheduler and sends each request where
//!   its first token comes soonest; it is one of the [`oracle`] routers the bound is made of;
//! * an engine of several DP ranks is that many schedulers, each publishing on its own; a request
//!   without a rank goes through the engine's dispatcher ([`ranks`]). Everything per engine above
//!   (steps, heartbeats, publishes, KV events, polls, queue samples) is per rank;
//! * with several models, a request's candidates serve its model, its adapter priced ([`models`]).

pub mod admission;
mod cache;
mod clairvoyant;
mod delivery;
mod engine;
mod events;
mod finish;
mod lookahead;
mod marginal;
mod models;
pub mod oracle;
#[cfg(test)]
mod oracle_tests;
mod outcome;
mod pd;
mod queues;
mod ranks;
mod routing;
pub(crate) mod sessions;
#[cfg(test)]
mod utilisation_tests;

pub use cache::{APPROX_TTL_MS, CacheView};
pub use delivery::LoadDelivery;
pub use oracle::{ORACLES, Oracle};
pub use outcome::{HOT_QUEUE_MIN, Outcome, QueueStats, isolated_ttft, quantile};
pub use pd::{DecodePolicy, KvLink, PdFleet, PdTimeline, first_decode_step};
pub use ranks::RankRouting;
pub use routing::{DirectTarget, SimRouter};

use crate::workload::Arrival;
use admission::{AdmissionQueue, Refused};
use cache::RouterCache;
use engine::SimEngine;
use events::{Ev, Item};
use loadlink_engine::model::{Event, ModelConfig, Submit};
use loadlink_engine::{IDLE_PUBLISH_FLOOR, PublishPoint};
use loadlink_router::adapters::AdapterBookConfig;
use loadlink_router::admission::{AdmissionConfig, Gate};
use loadlink_router::candidate::{Candidate, Candidates};
use loadlink_router::fleet::FleetView;
use loadlink_router::policy::mix;
use loadlink_router::{InflightGuard, LoadSignal, Source, Worker};
use queues::QueueSamples;
use ranks::{Dispatcher, Layout};
use std::collections::BinaryHeap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct SimConfig {
    /// One model config per engine (heterogeneous fleets allowed).
    pub engines: Vec<ModelConfig>,
    /// DP ranks per engine, each its own scheduler of the engine's model config (1: none).
    pub ranks: usize,
    /// Whether the routers route to ranks or to whole engines.
    pub rank_routing: RankRouting,
    pub routers: usize,
    pub router: SimRouter,
    pub signal: LoadSignal,
    /// Where the policy's cached-prefix numbers come from.
    pub cache: CacheView,
    pub freshness_ms: u64,
    /// Publish → router delivery delay.
    pub net_delay_s: f64,
    /// The engines' `--load-snapshot-publish-interval`: publish every Nth cycle unless forced.
    pub publish_every: u32,
    /// Where in the engine's cycle it publishes (as `loadlink engine --publish-point`).
    pub publish_point: PublishPoint,
    pub direct: DirectTarget,
    /// Pushed or polled snapshots ([`LoadDelivery`]).
    pub delivery: LoadDelivery,
    /// The routers' admission control (`loadlink route --max-… --admission …`); `None`: none, every
    /// routed request is forwarded ([`admission`]).
    pub admission: Option<AdmissionConfig>,
    /// Per engine, the model it serves (empty: every engine serves every request) ([`models`]).
    pub served: Vec<Arc<str>>,
    /// The routers' adapter book (defaults for engines that advertise nothing; [`models`]).
    pub adapter_book: AdapterBookConfig,
    /// Every this many seconds each router reads every engine's loaded adapters (`None`: never;
    /// the books run on their dispatch history) ([`models`]).
    pub adapter_reports_s: Option<f64>,
    /// A prefill–decode disaggregated fleet (`None`: every engine serves whole requests) ([`pd`]).
    pub pd: Option<PdFleet>,
    /// How many times a client sends a request again after a 429, each time after the refusal's
    /// `Retry-After` (the OpenAI and Anthropic SDKs default to 2); 0: it gives up at the first
    /// refusal, and a closed-loop session ends there ([`admission`]).
    pub client_retries: u32,
}

#[derive(Default)]
struct Req {
    arrived: f64,
    /// The scheduler (rank unit) that served it.
    unit: usize,
    first: Option<f64>,
    /// The cached prefix its prefilling engine admitted it with (the tokens it did not prefill).
    hit: u64,
    done: Option<f64>,
    guard: Option<InflightGuard>,
    /// The replica that routed it, its candidate, and when (ms).
    routed: Option<(usize, Candidate, u64)>,
    /// Times its client sent it again after a refusal ([`SimConfig::client_retries`]).
    retries: u32,
}

struct Sim<'a> {
    cfg: &'a SimConfig,
    arrivals: &'a [Arrival],
    heap: BinaryHeap<Item>,
    order: u64,
    layout: Layout,
    /// Every rank of every engine, engine-major ([`Layout`]); events name these units.
    engines: Vec<SimEngine>,
    /// Per engine: its dispatcher for requests that name no rank.
    dispatchers: Vec<Dispatcher>,
    books: Vec<Vec<Arc<Worker>>>,
    /// Each request's candidates (the engines serving its model) and adapter prices.
    models: models::ModelRouting,
    caches: Vec<RouterCache>,
    /// Scratch for one pick: per candidate, the request's cached tokens, the part of them on a
    /// host tier only, and the cache's size; and the adapter's price.
    scratch: (Vec<u64>, Vec<u64>, Vec<u64>),
    adapter_costs: Vec<loadlink_router::adapters::AdapterCost>,
    reqs: Vec<Req>,
    out: Outcome,
    queues: QueueSamples,
    /// Per router replica: its admission FIFO.
    admit: Vec<AdmissionQueue>,
    /// Requests neither finished nor rejected.
    remaining: usize,
    horizon: f64,
    /// What a poll reads, under [`LoadDelivery::Poll`].
    latest: delivery::Latest,
    /// The PD fleet's state ([`pd`]).
    pd: Option<pd::PdState>,
    /// The arrivals' page chains, for the lookahead oracle ([`oracle`]).
    chains: oracle::ChainMemo,
    /// Which arrivals wait for their session's previous turn ([`sessions`]).
    sessions: sessions::ClosedLoop,
}

fn ms(t: f64) -> u64 {
    (t * 1000.0) as u64 + 1
}

impl Sim<'_> {
    fn push(&mut self, t: f64, ev: Ev) {
        self.order += 1;
        self.heap.push(Item {
            t,
            order: self.order,
            ev,
        });
    }

    /// Sends what engine `e` published (snapshots and KV events) to every router replica,
    /// `net_delay_s` later.
    fn deliver_sent(&mut self, e: usize, t: f64) {
        let kv = self.engines[e].take_kv_events();
        if !kv.is_empty() && self.cfg.cache == CacheView::Index {
            let events = Rc::new(kv);
            for r in 0..self.cfg.routers {
                let events = events.clone();
                self.push(
                    t + self.cfg.net_delay_s,
                    Ev::Kv {
                        router: r,
                        engine: e,
                        events,
                    },
                );
            }
        }
        let sent: Vec<_> = self.engines[e].take_sent().collect();
        self.dispatcher_reads(e, &sent);
        for s in self.held_for_polls(e, sent) {
            for r in 0..self.cfg.routers {
                self.push(
                    t + self.cfg.net_delay_s,
                    Ev::Deliver {
                        router: r,
                        engine: e,
                        seq: s.seq,
                        snap: Box::new(s.snapshot.clone()),
                    },
                );
            }
        }
    }

    /// Engine `e`'s cycle moved at `t`: deliver what it published, and time a step it started.
    fn advance(&mut self, e: usize, t: f64, started: Option<f64>) {
        self.deliver_sent(e, t);
        if let Some(duration) = started {
            self.push(t + duration, Ev::StepDone(e));
        }
    }

    fn run(&mut self) {
        for i in 0..self.arrivals.len() {
            if !self.sessions.held(i) {
                self.push(self.arrivals[i].t, Ev::Arrive(i));
            }
        }
        for e in 0..self.engines.len() {
            self.push(0.0, Ev::Heartbeat(e));
        }
        self.push(1.0, Ev::Sample);
        self.start_polls();
        while let Some(Item { t, ev, .. }) = self.heap.pop() {
            if t > self.horizon {
                break;
            }
            match ev {
                Ev::Arrive(i) => self.arrive(i, t),
                Ev::StepDone(e) => self.step_done(e, t),
                Ev::Deliver {
                    router,
                    engine,
                    seq,
                    snap,
                } => {
                    let (e, rank) = (self.layout.engine_of(engine), self.layout.rank_of(engine));
                    self.books[router][e].record_at(rank, seq, &snap, ms(t));
                }
                Ev::Kv {
                    router,
                    engine,
                    events,
                } => self.caches[router].apply(engine, &events),
                Ev::Heartbeat(e) => {
                    self.engines[e].heartbeat(t);
                    self.deliver_sent(e, t);
                    if self.remaining > 0 {
                        self.push(t + IDLE_PUBLISH_FLOOR.as_secs_f64(), Ev::Heartbeat(e));
                    }
                }
                Ev::Poll { router, engine } if self.remaining > 0 => self.poll(router, engine, t),
                Ev::Poll { .. } => {}
                Ev::Sample => self.sample(t),
                Ev::AdmitPoll(r) => self.poll_admission(r, t),
                Ev::Transferred(i) => self.transferred(i, t),
            }
            if self.remaining == 0 {
                break; // every request has finished or was rejected; only heartbeats remain
            }
        }
    }

    /// Engine `e`'s step ended at `t`: its requests' first tokens and completions.
    fn step_done(&mut self, e: usize, t: f64) {
        let (events, started) = self.engines[e].step_done(t);
        for ev in events {
            self.note_hit(e, &ev);
            if self.pd_event(e, &ev, t) {
                continue;
            }
            match ev {
                Event::FirstToken { id } => self.reqs[id as usize].first = Some(t),
                Event::Finished { id, .. } => {
                    self.adapter_done(id as usize, ms(t));
                    let r = &mut self.reqs[id as usize];
                    r.done = Some(t);
                    r.first.get_or_insert(t);
                    r.guard = None;
                    self.remaining -= 1;
                    if let Some((next, think_s)) = self.sessions.next(id as usize) {
                        self.push(t + think_s, Ev::Arrive(next));
                    }
                    self.out.makespan = t;
                }
                Event::Token { .. } => {}
            }
        }
        self.advance(e, t, started);
    }

    /// Request `i` will never be sent (refused by admission, its client's retries spent); nor
    /// will its session's later turns.
    fn reject(&mut self, i: usize) {
        let abandoned = self.sessions.abandon(i);
        self.out.rejected += 1;
        self.out.abandoned += abandoned;
        self.remaining -= 1 + abandoned;
    }

    fn submit_of(&self, i: usize) -> Submit {
        let a = &self.arrivals[i];
        let s = match &a.prompt {
            Some(p) => Submit::tokens(i as u64, p.clone(), a.output_tokens),
            None => Submit::counted(i as u64, a.prompt_tokens, a.output_tokens),
        };
        match self.models.adapter(i) {
            Some(ad) => s.with_adapter(ad),
            None => s,
        }
    }

    fn arrive(&mut self, i: usize, t: f64) {
        if self.reqs[i].retries == 0 {
            // A closed-loop turn's nominal time is not when it is sent; a retry's TTFT counts
            // from its first attempt.
            self.reqs[i].arrived = t;
        }
        if self.arrive_pd(i, t) {
            return;
        }
        let a = &self.arrivals[i];
        let submit = self.submit_of(i);
        let n = self.layout.engines;
        let unit = if a.direct {
            let worker = match self.cfg.direct {
                DirectTarget::Pinned => 0,
                DirectTarget::Uniform => (mix(i as u64 ^ 0xd1ec7) % n as u64) as u32,
            };
            self.unit_for(Candidate { worker, rank: None })
        } else {
            match self.route(i, &submit, t, true) {
                Some(pick) => pick,
                None => return,
            }
        };
        self.start(i, unit, submit, t);
    }

    /// Request `i` goes to scheduler `unit` at `t` (its TTFT still counts from its arrival).
    fn start(&mut self, i: usize, unit: usize, submit: Submit, t: f64) {
        self.reqs[i].unit = unit;
        self.out.submitted += 1;
        let started = self.engines[unit].arrive(submit, t);
        self.advance(unit, t, started);
    }

    /// The routed request `i`'s scheduler, picked by its router replica (or the clairvoyant); holds
    /// the in-flight guard and records the dispatch in the replica's approximate tree. `None`: not
    /// sent now (refused by admission: rejected, or queued when it is a new `arrival`).
    fn route(&mut self, i: usize, submit: &Submit, t: f64, arrival: bool) -> Option<usize> {
        let policy = match self.cfg.router {
            SimRouter::Clairvoyant => return Some(self.oracle_pick(Oracle::Greedy, i, submit, t)),
            SimRouter::Oracle(o) => return Some(self.oracle_pick(o, i, submit, t)),
            SimRouter::Policy(p) => p,
        };
        let r = i % self.cfg.routers;
        let chain = cache::chain(submit, self.cfg, i);
        let list = self.models.candidates(i);
        if list.is_empty() {
            if arrival {
                self.reject(i); // no engine serves its model
            }
            return None;
        }
        let (mut cached, mut host, mut sizes) = std::mem::take(&mut self.scratch);
        let targets = Candidates::listed(&self.books[r], list);
        let caches = &mut self.caches[r];
        caches.lookup(&chain, ms(t), targets, &mut cached, (&mut host, &mut sizes));
        self.models
            .fill_costs(r, i, targets, ms(t), &mut self.adapter_costs);
        let mut view = FleetView::new(&self.books[r], self.cfg.signal, self.cfg.freshness_ms)
            .with_candidates(list)
            .with_prefix(submit.prompt_tokens, &cached)
            .with_host_cached(&host)
            .with_cache_sizes(&sizes)
            .with_regret(self.caches[r].regret())
            .with_reuse(self.caches[r].reuse())
            .with_chain(
                &chain,
                self.cfg.engines.first().map_or(16, |m| m.page_size) as u64,
            )
            .with_adapter_costs(&self.adapter_costs);
        view.now_ms = ms(t);
        let cfg = self.cfg;
        let gate = cfg
            .admission
            .as_ref()
            .map_or(Gate::Admit, |a| admission::gate(&view, a, None));
        let pick = match (&cfg.admission, gate) {
            (None, _) => policy.pick(&view, i as u64),
            (Some(adm), Gate::Admit) => admission::pick(&policy, &view, adm, i as u64),
            (Some(_), _) => None,
        };
        if let (Some(adm), false) = (&cfg.admission, gate == Gate::Admit) {
            self.scratch = (cached, host, sizes);
            if arrival {
                // Refused by the gate (reject mode) or told to wait (queued while there is room).
                let (queued, hint) = match gate {
                    Gate::Wait => (self.admit[r].refuse(adm, i, t), None),
                    Gate::Refuse(_, hint) => (Refused::Rejected, hint),
                    Gate::Admit => (Refused::Rejected, None), // not here: admitted above
                };
                match queued {
                    Refused::Rejected => self.refused(i, t, hint),
                    Refused::Queued => self.schedule_poll(r, t),
                }
            }
            return None;
        }
        let picked = pick.map(|p| (p, view.targets.get(p), view.load_of(p).source));
        let mut unit = None;
        if let Some((p, c, source)) = picked {
            let w = self.books[r][c.worker as usize].clone();
            self.out.decisions += 1;
            if source == Source::Fallback {
                self.out.fallback_decisions += 1;
            }
            let uncached = submit.prompt_tokens.saturating_sub(cached[p]);
            self.reqs[i].guard = Some(InflightGuard::to_target(w, c.rank, uncached));
            let deepest = cached.iter().copied().max().unwrap_or(0);
            self.caches[r].dispatched(c, &chain, deepest, ms(t));
            self.adapter_dispatched(r, i, c, ms(t));
            unit = Some(self.unit_for(c));
        }
        self.scratch = (cached, host, sizes);
        unit
    }
}

/// Runs `arrivals` through the configured fleet; gives up at `horizon_s` of virtual time.
pub fn simulate(cfg: &SimConfig, arrivals: &[Arrival], horizon_s: f64) -> Outcome {
    simulate_with_queues(cfg, arrivals, horizon_s).0
}

/// [`simulate`], with how unevenly the engines' queues filled.
pub fn simulate_with_queues(
    cfg: &SimConfig,
    arrivals: &[Arrival],
    horizon_s: f64,
) -> (Outcome, QueueStats) {
    let epoch = Instant::now();
    let layout = Layout::new(cfg.engines.len(), cfg.ranks);
    let books = layout.books(cfg.routers.max(1), epoch);
    let mut sim = Sim {
        cfg,
        arrivals,
        heap: BinaryHeap::new(),
        order: 0,
        layout,
        engines: layout.schedulers(cfg),
        dispatchers: vec![Dispatcher::new(layout.ranks); layout.engines],
        models: models::ModelRouting::new(
            arrivals,
            (&cfg.served, &cfg.engines),
            (&books[0], &pd::routed_candidates(cfg, &books[0])),
            cfg.routers.max(1),
            cfg.adapter_book,
        ),
        books,
        caches: (0..cfg.routers.max(1))
            .map(|_| {
                let m = cfg.engines.first().copied().unwrap_or_default();
                let pages = (m.max_total_tokens as usize / m.page_size.max(1)).max(1);
                RouterCache::new(cfg.cache, m.page_size, pages, layout)
            })
            .collect(),
        scratch: Default::default(),
        adapter_costs: Vec::new(),
        reqs: arrivals
            .iter()
            .map(|a| Req {
                arrived: a.t,
                ..Req::default()
            })
            .collect(),
        out: Outcome::default(),
        queues: QueueSamples::default(),
        admit: (0..cfg.routers.max(1))
            .map(|_| AdmissionQueue::default())
            .collect(),
        remaining: arrivals.len(),
        horizon: horizon_s,
        latest: delivery::Latest::new(layout.units()),
        pd: cfg
            .pd
            .map(|f| pd::PdState::new(f, layout.engines, arrivals.len())),
        chains: Default::default(),
        sessions: sessions::ClosedLoop::new(arrivals),
    };
    sim.set_pd_modes();
    sim.run();
    sim.finish()
}
