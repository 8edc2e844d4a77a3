//! One simulated engine: the production scheduler model, the production publish cycle and the real
//! `Publisher`, in virtual time. The simulator only says what happened (a request arrived, the
//! running step ended, an idle heartbeat); when to publish is decided by
//! `loadlink_engine::cycle::PublishCycle` and which sink is due by the `Publisher`, exactly as in
//! `loadlink engine`. Snapshots leave through an in-memory sink whose interval is the live engine's
//! decode cadence, and the simulator delivers them to the routers.

use loadlink_engine::model::{Event, ModelConfig, Scheduler, StepKind, Submit};
use loadlink_engine::{CycleEvent, PublishCycle, PublishPoint};
use loadlink_publish::{LoadSource, MemorySink, Publisher, Sent, sink_interval};
use loadlink_wire::LoadSnapshot;
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
            sched: Scheduler::new(model),
            rank,
            now: 0.0,
        };
        SimEngine {
            publisher: Publisher::new(source, vec![Box::new(sink)]),
            sent,
            cycle: PublishCycle::new(point),
            busy: false,
            arrived: false,
            inbox: Vec::new(),
            pending: Vec::new(),
        }
    }

    fn sched(&mut self) -> &mut Scheduler {
        &mut self.publisher.source_mut().sched
    }

    /// Requests waiting, including those not taken in yet.
    pub(crate) fn num_waiting(&self) -> usize {
        self.publisher.source().sched.num_waiting() + self.inbox.len()
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

    /// The idle heartbeat at `t` (nothing happens while a step runs).
    pub(crate) fn heartbeat(&mut self, t: f64) {
        if !self.busy {
            self.on(CycleEvent::IdleTick, t);
        }
    }
}
