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
//!   which holds an in-flight guard until the request finishes; direct requests skip routers.

mod engine;

use crate::workload::Arrival;
use engine::SimEngine;
use loadlink_engine::model::{Event, ModelConfig, Scheduler, StepKind, Submit};
use loadlink_engine::{IDLE_PUBLISH_FLOOR, PublishPoint};
use loadlink_router::fleet::FleetView;
use loadlink_router::policy::mix;
use loadlink_router::{InflightGuard, LoadSignal, Policy, Source, Worker};
use loadlink_wire::LoadSnapshot;
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Instant;

/// Where direct (router-bypassing) traffic goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectTarget {
    /// Spread uniformly over engines.
    Uniform,
    /// All of it on engine 0 (a hot tenant, a pinned batch job).
    Pinned,
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    /// One model config per engine (heterogeneous fleets allowed).
    pub engines: Vec<ModelConfig>,
    pub routers: usize,
    pub policy: Policy,
    pub signal: LoadSignal,
    pub freshness_ms: u64,
    /// Publish → router delivery delay.
    pub net_delay_s: f64,
    /// The engines' `--load-snapshot-publish-interval`: publish every Nth cycle unless forced.
    pub publish_every: u32,
    /// Where in the engine's cycle it publishes (as `loadlink engine --publish-point`).
    pub publish_point: PublishPoint,
    pub direct: DirectTarget,
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub ttft: Vec<f64>,
    /// Each request's TTFT on an idle engine of its kind (its own prefill): what no router can
    /// remove. Same order as `ttft`.
    pub ttft_floor: Vec<f64>,
    pub e2e: Vec<f64>,
    pub completed: usize,
    pub submitted: usize,
    /// Virtual seconds until the last completion.
    pub makespan: f64,
    /// Mean over 1 s samples of the coefficient of variation of waiting requests across engines.
    pub queue_cv: f64,
    pub decisions: u64,
    pub fallback_decisions: u64,
    /// `(cached, prompt)` tokens summed over the fleet's engines for the run; `None`: unknown
    /// (a live engine that does not export them).
    pub cache_tokens: Option<(u64, u64)>,
}

impl Outcome {
    /// Per request, TTFT minus its floor: the waiting that routing can influence.
    pub fn waits(&self) -> Vec<f64> {
        self.ttft
            .iter()
            .zip(&self.ttft_floor)
            .map(|(t, f)| (t - f).max(0.0))
            .collect()
    }

    /// Σ cached / Σ prompt tokens over the fleet (0 without prompts; `None` when unknown).
    pub fn cache_hit_rate(&self) -> Option<f64> {
        let (cached, prompt) = self.cache_tokens?;
        Some(if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        })
    }
}

#[derive(Debug)]
enum Ev {
    Arrive(usize),
    StepDone(usize),
    Deliver {
        router: usize,
        engine: usize,
        seq: i64,
        snap: Box<LoadSnapshot>,
    },
    Heartbeat(usize),
    Sample,
}

struct Item {
    t: f64,
    order: u64,
    ev: Ev,
}

impl PartialEq for Item {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    /// Reversed: `BinaryHeap` pops the earliest event (ties in insertion order).
    fn cmp(&self, o: &Self) -> Ordering {
        o.t.total_cmp(&self.t).then(o.order.cmp(&self.order))
    }
}

struct Req {
    arrived: f64,
    engine: usize,
    first: Option<f64>,
    done: Option<f64>,
    guard: Option<InflightGuard>,
}

struct Sim<'a> {
    cfg: &'a SimConfig,
    arrivals: &'a [Arrival],
    heap: BinaryHeap<Item>,
    order: u64,
    engines: Vec<SimEngine>,
    books: Vec<Vec<Arc<Worker>>>,
    reqs: Vec<Req>,
    out: Outcome,
    cv_samples: Vec<f64>,
    horizon: f64,
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

    /// Sends what engine `e` published to every router replica, `net_delay_s` later.
    fn deliver_sent(&mut self, e: usize, t: f64) {
        let sent: Vec<_> = self.engines[e].take_sent().collect();
        for s in sent {
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
            self.push(self.arrivals[i].t, Ev::Arrive(i));
        }
        for e in 0..self.engines.len() {
            self.push(0.0, Ev::Heartbeat(e));
        }
        self.push(1.0, Ev::Sample);
        let mut remaining = self.arrivals.len();
        while let Some(Item { t, ev, .. }) = self.heap.pop() {
            if t > self.horizon {
                break;
            }
            match ev {
                Ev::Arrive(i) => self.arrive(i, t),
                Ev::StepDone(e) => {
                    let (events, started) = self.engines[e].step_done(t);
                    for ev in events {
                        match ev {
                            Event::FirstToken { id } => self.reqs[id as usize].first = Some(t),
                            Event::Finished { id, .. } => {
                                let r = &mut self.reqs[id as usize];
                                r.done = Some(t);
                                r.first.get_or_insert(t);
                                r.guard = None;
                                remaining -= 1;
                                self.out.makespan = t;
                            }
                            Event::Token { .. } => {}
                        }
                    }
                    self.advance(e, t, started);
                }
                Ev::Deliver {
                    router,
                    engine,
                    seq,
                    snap,
                } => {
                    self.books[router][engine].record_at(0, seq, &snap, ms(t));
                }
                Ev::Heartbeat(e) => {
                    self.engines[e].heartbeat(t);
                    self.deliver_sent(e, t);
                    if remaining > 0 {
                        self.push(t + IDLE_PUBLISH_FLOOR.as_secs_f64(), Ev::Heartbeat(e));
                    }
                }
                Ev::Sample => {
                    let w: Vec<f64> = self
                        .engines
                        .iter()
                        .map(|e| e.num_waiting() as f64)
                        .collect();
                    let m = w.iter().sum::<f64>() / w.len() as f64;
                    if m > 0.0 {
                        let sd = (w.iter().map(|x| (x - m).powi(2)).sum::<f64>() / w.len() as f64)
                            .sqrt();
                        self.cv_samples.push(sd / m);
                    } else {
                        self.cv_samples.push(0.0);
                    }
                    if remaining > 0 {
                        self.push(t + 1.0, Ev::Sample);
                    }
                }
            }
            if remaining == 0 {
                break; // every request has finished; only heartbeats and deliveries remain
            }
        }
    }

    fn arrive(&mut self, i: usize, t: f64) {
        let a = &self.arrivals[i];
        let n = self.engines.len();
        let engine = if a.direct {
            match self.cfg.direct {
                DirectTarget::Pinned => 0,
                DirectTarget::Uniform => (mix(i as u64 ^ 0xd1ec7) % n as u64) as usize,
            }
        } else {
            let r = i % self.cfg.routers;
            let mut view = FleetView::new(&self.books[r], self.cfg.signal, self.cfg.freshness_ms);
            view.now_ms = ms(t);
            let Some(pick) = self.cfg.policy.pick(&view, i as u64) else {
                return;
            };
            let w = self.books[r][pick].clone();
            self.out.decisions += 1;
            if w.load_at(self.cfg.signal, self.cfg.freshness_ms, ms(t))
                .source
                == Source::Fallback
            {
                self.out.fallback_decisions += 1;
            }
            self.reqs[i].guard = Some(InflightGuard::new(w));
            pick
        };
        self.reqs[i].arrived = t;
        self.reqs[i].engine = engine;
        self.out.submitted += 1;
        let submit = match &a.prompt {
            Some(p) => Submit::tokens(i as u64, p.clone(), a.output_tokens),
            None => Submit::counted(i as u64, a.prompt_tokens, a.output_tokens),
        };
        let started = self.engines[engine].arrive(submit, t);
        self.advance(engine, t, started);
    }
}

/// Runs `arrivals` through the configured fleet; gives up at `horizon_s` of virtual time.
pub fn simulate(cfg: &SimConfig, arrivals: &[Arrival], horizon_s: f64) -> Outcome {
    let epoch = Instant::now();
    let books = (0..cfg.routers.max(1))
        .map(|_| {
            (0..cfg.engines.len())
                .map(|e| Arc::new(Worker::new(format!("sim://engine{e}"), 1, None, epoch)))
                .collect()
        })
        .collect();
    let mut sim = Sim {
        cfg,
        arrivals,
        heap: BinaryHeap::new(),
        order: 0,
        engines: cfg
            .engines
            .iter()
            .enumerate()
            .map(|(e, m)| SimEngine::new(e as u32, *m, cfg.publish_point, cfg.publish_every))
            .collect(),
        books,
        reqs: arrivals
            .iter()
            .map(|a| Req {
                arrived: a.t,
                engine: 0,
                first: None,
                done: None,
                guard: None,
            })
            .collect(),
        out: Outcome::default(),
        cv_samples: Vec::new(),
        horizon: horizon_s,
    };
    sim.run();
    let mut out = std::mem::take(&mut sim.out);
    let mut floors = std::collections::HashMap::new();
    for (i, r) in sim.reqs.iter().enumerate() {
        if let (Some(f), Some(d)) = (r.first, r.done) {
            out.ttft.push(f - r.arrived);
            out.e2e.push(d - r.arrived);
            let m = cfg.engines[r.engine];
            let prompt = arrivals[i].prompt_tokens;
            let floor = *floors
                .entry((r.engine, prompt))
                .or_insert_with(|| isolated_ttft(m, prompt));
            out.ttft_floor.push(floor);
        }
    }
    out.completed = out.e2e.len();
    let totals = sim.engines.iter().map(SimEngine::cache_totals);
    out.cache_tokens = Some(totals.fold((0, 0), |(c, p), (ec, ep)| (c + ec, p + ep)));
    out.queue_cv = if sim.cv_samples.is_empty() {
        0.0
    } else {
        sim.cv_samples.iter().sum::<f64>() / sim.cv_samples.len() as f64
    };
    out
}

/// Time to the first token of a lone request with `prompt` tokens on an idle engine.
pub fn isolated_ttft(m: ModelConfig, prompt: u64) -> f64 {
    let mut s = Scheduler::new(m);
    s.submit(Submit::counted(0, prompt, 2));
    let mut t = 0.0;
    loop {
        let step = s.step(t);
        t += step.duration;
        if step.kind == StepKind::Idle
            || step
                .events
                .iter()
                .any(|e| matches!(e, Event::FirstToken { .. } | Event::Finished { .. }))
        {
            return t;
        }
    }
}

/// The `p`-quantile (0–1) of `v` (nearest rank); NaN when empty.
pub fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * p).round() as usize]
}
