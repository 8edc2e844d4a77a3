//! One simulated engine: the production scheduler model, the production publish cycle and the real
//! `Publisher`, in virtual time. The simulator only says what happened (a request arrived, the
//! running step ended, an idle heartbeat); when to publish is decided by
//! `loadlink_engine::cycle::PublishCycle` and which sink is due by the `Publisher`, exactly as in
//! `loadlink engine`. Snapshots leave through an in-memory sink whose interval is the live engine's
//! decode cadence, and the simulator delivers them to the routers.

use loadlink_engine::model::{Event, ModelConfig, Scheduler, StepKind, Submit};
use loadlink_engine::radix::PageChain;
use loadlink_engine::{CycleEvent, PublishCycle, PublishPoint};
use loadlink_publish::{LoadSource, MemorySink, Publisher, Sent, sink_interval};
use loadlink_wire::LoadSnapshot;
use loadlink_wire::kv_events::KvEvent;
use std::sync::mpsc::Receiver;

/// The engine's load source: its scheduler, read at the current virtual time.
struct SimSource {
    sched: Scheduler,
    rank: u32,
    now: f64,
}

impl LoadSource for SimSource {
    fn collect(&mut self) -> Result<LoadSnapshot, String> {
        Ok(self.sched.snapshot(self.rank, self.now))
    }
}

pub(crate) struct SimEngine {
    publisher: Publisher<SimSource>,
    sent: Receiver<Sent>,
    cycle: PublishCycle,
    busy: bool,
    /// When the running step ends (meaningful while `busy`).
    busy_until: f64,
    /// Requests arrived during the running step (taken in at its end).
    arrived: bool,
    /// Under [`PublishPoint::BatchEnd`], those requests: not taken in before the publish.
    inbox: Vec<Submit>,
    /// The running step's events, which happen at its end.
    pending: Vec<Event>,
}

impl SimEngine {
    /// Engine `rank`, publishing at `point`, every `publish_every`-th cycle unless forced (as
    /// `loadlink engine --load-snapshot-publish-interval`).
    pub(crate) fn new(
        rank: u32,
        model: ModelConfig,
        point: PublishPoint,
        publish_every: u32,
    ) -> Self {
        let (sink, sent) = MemorySink::new(sink_interval(publish_every));
        let source = SimSource {
            sched: Scheduler::with_kv_events(model),
            rank,
            now: 0.0,
        };
        SimEngine {
            publisher: Publisher::new(source, vec![Box::new(sink)]),
            sent,
            cycle: PublishCycle::new(point),
            busy: false,
            busy_until: 0.0,
            arrived: false,
            inbox: Vec::new(),
            pending: Vec::new(),
        }
    }

    fn sched(&mut self) -> &mut Scheduler {
        &mut self.publisher.source_mut().sched
    }

    /// Sets the engine's role in prefill–decode disaggregation (before it runs).
    pub(crate) fn set_disaggregation(&mut self, mode: loadlink_engine::PdMode, link_gb_s: f64) {
        self.sched().set_disaggregation(mode, link_gb_s);
    }

    /// Requests in the running batch.
    pub(crate) fn num_running(&self) -> usize {
        self.publisher.source().sched.num_running()
    }

    /// Requests waiting, including those not taken in yet.
    pub(crate) fn num_waiting(&self) -> usize {
        self.publisher.source().sched.num_waiting() + self.inbox.len()
    }

    /// Prompt tokens queued here that the engine will compute: the scheduler's (their cached
    /// prefixes left out) and, whole, those not taken in yet.
    pub(crate) fn queued_uncached_tokens(&self) -> u64 {
        let inbox: u64 = self.inbox.iter().map(|s| s.prompt_tokens).sum();
        self.publisher.source().sched.waiting_uncached_tokens() + inbox
    }

    /// The share of the KV pool in use, as the engine publishes it.
    pub(crate) fn token_usage(&self) -> f64 {
        self.publisher.source().sched.token_usage()
    }

    /// The cached prefix request `id` was admitted with here (`None`: not admitted here).
    pub(crate) fn admitted_hit(&self, id: u64) -> Option<u64> {
        self.publisher.source().sched.admitted_hit(id)
    }

    /// Lifetime `(cached, prompt)` tokens of the engine's admissions.
    pub(crate) fn cache_totals(&self) -> (u64, u64) {
        self.publisher.source().sched.cache_totals()
    }

    /// Lifetime tokens loaded back from the engine's host tier (0 without one).
    pub(crate) fn loaded_back_tokens(&self) -> u64 {
        self.publisher
            .source()
            .sched
            .cache_stats()
            .loaded_back_tokens
    }

    /// Lifetime LoRA adapter loads (0 without adapters).
    pub(crate) fn adapter_loads(&self) -> u64 {
        self.publisher.source().sched.adapter_loads()
    }

    /// The adapters loaded now, least recently used first.
    pub(crate) fn resident_adapters(&self) -> Vec<u32> {
        self.publisher.source().sched.resident_adapters()
    }

    /// The KV events of the engine's cache since the last call, in order.
    pub(crate) fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.sched().take_kv_events()
    }

    /// A copy of the scheduler as it will be when it next schedules, and when that is: the end of
    /// the running step, or `now` when idle (for the clairvoyant router's forward simulation).
    pub(crate) fn fork(&self, now: f64) -> (Scheduler, f64) {
        let mut sched = self.publisher.source().sched.clone();
        for s in &self.inbox {
            sched.submit(s.clone());
        }
        (sched, if self.busy { self.busy_until } else { now })
    }

    /// The engine's model config (page size, step timing).
    pub(crate) fn model(&self) -> &ModelConfig {
        self.publisher.source().sched.config()
    }

    /// Tokens of `chain` this engine has cached or will have once the requests it holds (queued,
    /// running, or not taken in yet) finish: the match an oracle router knows of.
    pub(crate) fn will_match(&self, chain: &PageChain) -> u64 {
        let sched = &self.publisher.source().sched;
        let page = self.model().page_size;
        let inbox = self.inbox.iter().filter_map(|s| {
            let p = s.prompt.as_deref().filter(|p| !p.is_empty())?;
            let c = PageChain::in_namespace(&p[..p.len() - 1], page, s.namespace.clone());
            let shared = c.hashes.iter().zip(&chain.hashes);
            Some(shared.take_while(|(a, b)| a == b).count() as u64 * page as u64)
        });
        (sched.prefix_cache().matched_tokens(chain))
            .max(sched.queued_match(chain))
            .max(inbox.max().unwrap_or(0))
    }

    /// Tokens of `chain` this engine has cached now (what its KV events have told the routers).
    pub(crate) fn cached_match(&self, chain: &PageChain) -> u64 {
        self.publisher
            .source()
            .sched
            .prefix_cache()
            .matched_tokens(chain)
    }

    /// Snapshots published since the last call, in order.
    pub(crate) fn take_sent(&mut self) -> impl Iterator<Item = Sent> + '_ {
        self.sent.try_iter()
    }

    fn on(&mut self, ev: CycleEvent, t: f64) {
        if let Some(force) = self.cycle.on(ev).force() {
            self.publisher.source_mut().now = t;
            self.publisher.publish(force);
        }
    }

    /// Schedules the next step at `t`; its duration when it is not idle.
    fn schedule(&mut self, t: f64) -> Option<f64> {
        let step = self.sched().step(t);
        self.on(CycleEvent::Scheduled(step.kind), t);
        if step.kind == StepKind::Idle {
            return None;
        }
        self.busy = true;
        self.busy_until = t + step.duration;
        self.pending = step.events;
        Some(step.duration)
    }

    /// Request `s` arrives at `t`. A busy engine takes it in when its step ends; an idle one starts
    /// a cycle now. Returns the duration of a step it started.
    pub(crate) fn arrive(&mut self, s: Submit, t: f64) -> Option<f64> {
        if self.busy {
            self.arrived = true;
            if self.cycle.point() == PublishPoint::BatchEnd {
                self.inbox.push(s);
            } else {
                self.sched().submit(s);
            }
            return None;
        }
        self.sched().submit(s);
        self.on(CycleEvent::Ingest { arrived: true }, t);
        self.schedule(t)
    }

    /// The running step ends at `t`: its events, and the duration of the next step if one started.
    pub(crate) fn step_done(&mut self, t: f64) -> (Vec<Event>, Option<f64>) {
        self.busy = false;
        let events = std::mem::take(&mut self.pending);
        self.on(CycleEvent::BatchEnd, t);
        for s in std::mem::take(&mut self.inbox) {
            self.sched().submit(s);
        }
        let arrived = std::mem::take(&mut self.arrived);
        self.on(CycleEvent::Ingest { arrived }, t);
        (events, self.schedule(t))
    }

    /// Something outside the scheduler's steps changes it at `t` (`change`: a KV transfer ended on
    /// a prefill engine, a request's KV arrived on a decode engine), as a command the live rank
    /// takes in: a busy engine sees it when its step ends, an idle one starts a cycle now.
    /// Returns what `change` returned and the duration of a step it started. (Under
    /// [`PublishPoint::BatchEnd`], requests held for the step's end are taken in first, so the
    /// change finds a request that arrived during the step.)
    pub(crate) fn outside<R>(
        &mut self,
        t: f64,
        change: impl FnOnce(&mut Scheduler) -> R,
    ) -> (R, Option<f64>) {
        for s in std::mem::take(&mut self.inbox) {
            self.sched().submit(s);
        }
        let r = change(self.sched());
        if self.busy {
            self.arrived = true;
            return (r, None);
        }
        self.on(CycleEvent::Ingest { arrived: true }, t);
        (r, self.schedule(t))
    }

    /// The idle heartbeat at `t` (nothing happens while a step runs).
    pub(crate) fn heartbeat(&mut self, t: f64) {
        if !self.busy {
            self.on(CycleEvent::IdleTick, t);
        }
    }
}

#[cfg(test)]
mod tests {
    //! Both drivers of the scheduler model over one scripted sequence: the live rank's
    //! [`RankLoop`] and the simulator's [`SimEngine`] must publish the same snapshots at the same
    //! points. Each publishes through a real `Publisher` into a `MemorySink`; with a cadence above 1,
    //! a driver that counted decode steps or forced on its own would publish a different sequence.

    use super::*;
    use loadlink_engine::model::Step;
    use loadlink_engine::rank::{Command, RankLoop};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Copy)]
    enum Op {
        /// Requests (by id) arriving now; at an idle engine, one starts its cycle at once.
        Arrive(&'static [u64]),
        /// The running step ends (the engine takes in what arrived and schedules the next);
        /// nothing when the engine is idle, so a run of these drains the engine.
        Finish,
        /// An idle heartbeat.
        Tick,
    }

    /// A request arrives at an idle rank; two more arrive during its decode; then the rank runs
    /// everything to the end and ticks while idle.
    fn script() -> Vec<Op> {
        let mut ops = vec![Op::Tick, Op::Arrive(&[1]), Op::Finish, Op::Arrive(&[2, 3])];
        ops.extend([Op::Finish; 40]);
        ops.extend([
            Op::Tick,
            Op::Tick,
            Op::Arrive(&[4]),
            Op::Finish,
            Op::Arrive(&[5]),
        ]);
        ops.extend([Op::Finish; 40]);
        ops.push(Op::Tick);
        ops
    }

    fn model() -> ModelConfig {
        ModelConfig {
            chunked_prefill_size: 256,
            ..ModelConfig::default()
        }
    }

    fn submit(id: u64) -> Submit {
        Submit::counted(id, 300 + 50 * id, 3 + id)
    }

    /// What a router would see: (after which op, seq, running, waiting, used tokens).
    type Seen = Vec<(usize, i64, i64, i64, i64)>;

    fn record(seen: &mut Seen, op: usize, sent: impl Iterator<Item = Sent>) {
        seen.extend(sent.map(|s| {
            let n = &s.snapshot;
            (
                op,
                s.seq,
                n.num_running_reqs,
                n.num_waiting_reqs,
                n.num_used_tokens,
            )
        }));
    }

    fn simulated(point: PublishPoint, every: u32) -> Seen {
        let mut e = SimEngine::new(0, model(), point, every);
        let (mut t, mut running) = (0.0, None);
        let mut seen = Seen::new();
        for (i, op) in script().into_iter().enumerate() {
            match op {
                Op::Arrive(ids) => {
                    for &id in ids {
                        running = e.arrive(submit(id), t).or(running);
                    }
                }
                Op::Finish => {
                    if let Some(d) = running {
                        t += d;
                        running = e.step_done(t).1;
                    }
                }
                Op::Tick => e.heartbeat(t),
            }
            record(&mut seen, i, e.take_sent());
        }
        seen
    }

    /// One rank turn; the step it started, unless idle.
    fn turn<S: LoadSource>(rank: &mut RankLoop<S>, commands: Vec<Command>) -> Option<Step> {
        let step = rank.begin(commands).expect("not stopped");
        (step.kind != StepKind::Idle).then_some(step)
    }

    fn live(point: PublishPoint, every: u32) -> Seen {
        let sched = Arc::new(Mutex::new(Scheduler::new(model())));
        let source_sched = sched.clone();
        let source = move || Ok(source_sched.lock().unwrap().snapshot(0, 0.0));
        let (sink, sent) = MemorySink::new(sink_interval(every));
        let publisher = Publisher::new(source, vec![Box::new(sink)]);
        let clock = Arc::new(AtomicU64::new(0f64.to_bits()));
        let now = clock.clone();
        let mut rank = RankLoop::new(sched, publisher, point, move || {
            f64::from_bits(now.load(Ordering::Relaxed))
        });
        let (reply, _events) = tokio::sync::mpsc::unbounded_channel();
        let (mut queued, mut running) = (Vec::new(), None);
        let mut seen = Seen::new();
        for (i, op) in script().into_iter().enumerate() {
            match op {
                Op::Arrive(ids) => {
                    let submits = ids.iter().map(|&id| submit(id));
                    queued.extend(submits.map(|s| Command::Submit(s, reply.clone())));
                    if running.is_none() {
                        running = turn(&mut rank, std::mem::take(&mut queued));
                    }
                }
                Op::Finish => {
                    let Some(step) = running.take() else {
                        continue;
                    };
                    let t = f64::from_bits(clock.load(Ordering::Relaxed)) + step.duration;
                    clock.store(t.to_bits(), Ordering::Relaxed);
                    rank.end(&step);
                    running = turn(&mut rank, std::mem::take(&mut queued));
                }
                Op::Tick => assert!(turn(&mut rank, Vec::new()).is_none(), "idle"),
            }
            record(&mut seen, i, sent.try_iter());
        }
        seen
    }

    #[test]
    fn the_rank_driver_and_the_simulator_publish_the_same_snapshots_at_the_same_points() {
        for point in PublishPoint::ALL {
            for every in [1, 3] {
                let (sim, rank) = (simulated(point, every), live(point, every));
                assert!(sim.len() > 10, "{point:?}/{every}: the script publishes");
                assert_eq!(sim, rank, "{point:?}, publish every {every}");
            }
        }
    }

    #[test]
    fn a_cadence_above_one_skips_decode_publishes() {
        for point in PublishPoint::ALL {
            assert!(
                simulated(point, 3).len() < simulated(point, 1).len(),
                "{point:?}"
            );
        }
    }
}
