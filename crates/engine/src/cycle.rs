//! When a rank publishes its load: the one decision both drivers of the scheduler model share.
//!
//! The real-time rank driver (`rank`) and the discrete-event simulator (`loadlink-bench`) both
//! report what happened in a scheduler cycle as [`CycleEvent`]s to a [`PublishCycle`], and hand
//! the answer to the real `loadlink_publish::Publisher`. The cycle decides *whether to publish now
//! and whether to force*; the `Publisher` alone decides which sinks are due (their per-sink interval
//! is the decode cadence). So a change to when loadlink publishes is made here, once, and a
//! simulated run cannot drift from a live one.
//!
//! The rules: where in the cycle the snapshot is collected is a [`PublishPoint`]. A publish is
//! forced after a prefill step, when new requests arrived, when the rank goes idle and on every
//! idle heartbeat ([`IDLE_PUBLISH_FLOOR`]); after decode steps it is left to the cadence.

use crate::model::StepKind;
use std::time::Duration;

/// An idle rank wakes (and force-publishes) at most this often.
pub const IDLE_PUBLISH_FLOOR: Duration = Duration::from_millis(100);

/// Where in the scheduler cycle (take in requests → schedule the next batch → run it) a rank
/// collects and publishes its snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PublishPoint {
    /// After new requests are taken in, before the next batch is scheduled: requests about to be
    /// prefilled still count as waiting, with their uncached tokens. loadlink's choice.
    #[default]
    Ingest,
    /// After the next batch is scheduled, before it runs: SGLang 0.5.23's overlap loop (its
    /// default). The prefill about to run has left the waiting queue.
    Scheduled,
    /// After the batch ran, before new requests are read: SGLang 0.5.23's normal loop. Requests
    /// that arrived during the step stay hidden until the next one.
    BatchEnd,
}

impl PublishPoint {
    pub const ALL: [PublishPoint; 3] = [
        PublishPoint::Ingest,
        PublishPoint::Scheduled,
        PublishPoint::BatchEnd,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PublishPoint::Ingest => "ingest",
            PublishPoint::Scheduled => "scheduled",
            PublishPoint::BatchEnd => "batch-end",
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                format!("unknown publish point {s:?}; expected ingest, scheduled or batch-end")
            })
    }
}

/// What happened in a rank's scheduler cycle, in the order a cycle goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CycleEvent {
    /// New commands were taken in; `arrived`: at least one of them was a new request.
    Ingest { arrived: bool },
    /// The next batch was scheduled (`Idle`: there was nothing to run).
    Scheduled(StepKind),
    /// The scheduled batch finished running.
    BatchEnd,
    /// An idle rank's heartbeat: nothing arrived and nothing was run. The same decision as
    /// `Ingest { arrived: false }` followed by `Scheduled(Idle)`, for a driver that does not step
    /// an idle scheduler.
    IdleTick,
}

/// The cycle's answer: whether to call `Publisher::publish` now, and with which `force`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Publish {
    /// Not a publish point.
    Skip,
    /// Publish if the sink's cadence says so (`publish(false)`).
    Cadence,
    /// Publish to every sink (`publish(true)`).
    Force,
}

impl Publish {
    /// The `force` argument for `Publisher::publish`, or `None` when there is nothing to call.
    pub fn force(self) -> Option<bool> {
        match self {
            Publish::Skip => None,
            Publish::Cadence => Some(false),
            Publish::Force => Some(true),
        }
    }

    fn forced_if(force: bool) -> Self {
        if force {
            Publish::Force
        } else {
            Publish::Cadence
        }
    }
}

/// The state a rank's publish decisions depend on: where it publishes, whether it is idle, what
/// it ran last and whether the current cycle must publish.
#[derive(Debug, Clone)]
pub struct PublishCycle {
    point: PublishPoint,
    idle: bool,
    last_kind: StepKind,
    /// Set at ingest: this cycle's publish is forced (idle, arrivals or a prefill just ran).
    due: bool,
}

impl PublishCycle {
    /// A rank that has not run anything yet (not idle: its first cycle does not wait).
    pub fn new(point: PublishPoint) -> Self {
        PublishCycle {
            point,
            idle: false,
            last_kind: StepKind::Idle,
            due: false,
        }
    }

    pub fn point(&self) -> PublishPoint {
        self.point
    }

    /// Whether the last scheduled batch was empty: the rank waits for work (at most
    /// [`IDLE_PUBLISH_FLOOR`]) instead of spinning.
    pub fn is_idle(&self) -> bool {
        self.idle
    }

    /// Records `ev` and says whether and how to publish now.
    pub fn on(&mut self, ev: CycleEvent) -> Publish {
        let point = self.point;
        match ev {
            CycleEvent::Ingest { arrived } => {
                self.due = self.idle || arrived || self.last_kind == StepKind::Prefill;
                match point {
                    PublishPoint::Ingest => Publish::forced_if(self.due),
                    _ => Publish::Skip,
                }
            }
            CycleEvent::Scheduled(StepKind::Idle) => {
                // Going idle is said at once, whatever the cadence skipped; after that, one
                // heartbeat per idle wake-up (Ingest already sent it at the top of the cycle).
                let p = if point != PublishPoint::Ingest || self.last_kind != StepKind::Idle {
                    Publish::Force
                } else {
                    Publish::Skip
                };
                (self.idle, self.last_kind) = (true, StepKind::Idle);
                p
            }
            CycleEvent::Scheduled(kind) => {
                let p = match point {
                    PublishPoint::Scheduled => {
                        Publish::forced_if(self.due || kind == StepKind::Prefill)
                    }
                    _ => Publish::Skip,
                };
                (self.idle, self.last_kind) = (false, kind);
                p
            }
            CycleEvent::BatchEnd => match point {
                PublishPoint::BatchEnd => Publish::forced_if(self.last_kind == StepKind::Prefill),
                _ => Publish::Skip,
            },
            CycleEvent::IdleTick => {
                let ingest = self.on(CycleEvent::Ingest { arrived: false });
                ingest.max(self.on(CycleEvent::Scheduled(StepKind::Idle)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CycleEvent::*;
    use Publish::*;
    use StepKind::{Decode, Idle, Prefill};

    /// One request: it arrives at an idle rank, is prefilled, decoded twice (a second request
    /// arrives during the first decode), then the rank goes idle and ticks.
    const SCRIPT: [CycleEvent; 14] = [
        IdleTick,
        Ingest { arrived: true },
        Scheduled(Prefill),
        BatchEnd,
        Ingest { arrived: false },
        Scheduled(Decode),
        BatchEnd,
        Ingest { arrived: true },
        Scheduled(Decode),
        BatchEnd,
        Ingest { arrived: false },
        Scheduled(Idle),
        IdleTick,
        IdleTick,
    ];

    fn run(point: PublishPoint) -> Vec<Publish> {
        let mut c = PublishCycle::new(point);
        SCRIPT.iter().map(|e| c.on(*e)).collect()
    }

    #[test]
    fn ingest_publishes_every_cycle_forced_after_arrivals_prefill_and_idle() {
        assert_eq!(
            run(PublishPoint::Ingest),
            [
                Cadence, Force, Skip, Skip, Force, Skip, Skip, Force, Skip, Skip, Cadence, Force,
                Force, Force
            ]
        );
    }

    #[test]
    fn scheduled_publishes_after_scheduling_and_when_going_idle() {
        assert_eq!(
            run(PublishPoint::Scheduled),
            [
                Force, Skip, Force, Skip, Skip, Force, Skip, Skip, Force, Skip, Skip, Force, Force,
                Force
            ]
        );
    }

    #[test]
    fn batch_end_hides_arrivals_and_forces_only_after_prefill() {
        assert_eq!(
            run(PublishPoint::BatchEnd),
            [
                Force, Skip, Skip, Force, Skip, Skip, Cadence, Skip, Skip, Cadence, Skip, Force,
                Force, Force
            ]
        );
    }

    #[test]
    fn an_idle_tick_decides_as_an_empty_ingest_then_an_idle_schedule() {
        for point in PublishPoint::ALL {
            let (mut a, mut b) = (PublishCycle::new(point), PublishCycle::new(point));
            for warmup in [Ingest { arrived: true }, Scheduled(Decode), BatchEnd] {
                a.on(warmup);
                b.on(warmup);
            }
            for _ in 0..3 {
                let tick = a.on(IdleTick);
                let pair = b.on(Ingest { arrived: false }).max(b.on(Scheduled(Idle)));
                assert_eq!(tick, pair, "{point:?}");
                assert!(a.is_idle() && b.is_idle());
            }
        }
    }

    #[test]
    fn publish_points_round_trip_their_names() {
        for p in PublishPoint::ALL {
            assert_eq!(PublishPoint::parse(p.as_str()), Ok(p));
        }
        assert!(PublishPoint::parse("later").is_err());
    }
}
