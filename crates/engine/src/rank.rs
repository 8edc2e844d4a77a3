//! The real-time driver of one DP rank: a thread that owns the rank's `Scheduler` and `Publisher`.
//!
//! Each loop iteration (one scheduler cycle) takes new commands, publishes, runs one scheduler
//! step, sleeps the step's duration divided by `time_scale`, then delivers the step's events to the
//! waiting HTTP handlers.
//!
//! Where in the cycle the snapshot is collected is a [`PublishPoint`]. The default,
//! [`PublishPoint::Ingest`], collects it **after** the new requests are taken in and before the next
//! batch is scheduled, so it shows the work the coming step starts from. The two points SGLang
//! 0.5.23 uses are available for comparison; `docs/engine.md` measures all three. Cadence: forced
//! after a prefill step, when new requests arrived and when the rank goes idle; after decode steps
//! every Nth (the publisher's interval). An idle rank blocks on the command channel for up to
//! [`IDLE_PUBLISH_FLOOR`], so it publishes a heartbeat instead of spinning.

use crate::model::{Event, ModelConfig, Scheduler, StepKind, Submit};
use loadlink_publish::{Publisher, Sink, SinkStats};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::UnboundedSender;

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

/// What a rank thread accepts.
pub enum Command {
    Submit(Submit, UnboundedSender<Event>),
    Abort(u64),
    Stop,
}

/// Handle on a running rank.
pub struct RankHandle {
    pub rank: u32,
    pub commands: Sender<Command>,
    pub sink_stats: Vec<(&'static str, Arc<SinkStats>)>,
    pub steps: Arc<AtomicU64>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl RankHandle {
    /// Stops the thread and waits for it.
    pub fn stop(&self) {
        let _ = self.commands.send(Command::Stop);
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}

/// Wall-clock seconds since the epoch (snapshot timestamps, `/v1/loads`).
pub(crate) fn wall_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Starts rank `rank` with its sinks (internal first) on its own thread.
pub fn spawn(
    rank: u32,
    cfg: ModelConfig,
    time_scale: f64,
    point: PublishPoint,
    sinks: Vec<Box<dyn Sink>>,
) -> RankHandle {
    let (tx, rx) = std::sync::mpsc::channel();
    let scheduler = Arc::new(Mutex::new(Scheduler::new(cfg)));
    let start = Instant::now();
    let scale = if time_scale > 0.0 { time_scale } else { 1.0 };
    let virtual_now = move || start.elapsed().as_secs_f64() * scale;
    let source_sched = scheduler.clone();
    let source = move || {
        let s = source_sched
            .lock()
            .map_err(|_| "scheduler lock poisoned".to_string())?;
        Ok(s.snapshot(rank, wall_now()))
    };
    let publisher = Publisher::new(source, sinks);
    let sink_stats = publisher.stats();
    let steps = Arc::new(AtomicU64::new(0));
    let steps2 = steps.clone();
    let thread = std::thread::Builder::new()
        .name(format!("rank-{rank}"))
        .spawn(move || run(rx, scheduler, publisher, point, scale, virtual_now, steps2))
        .expect("spawning a rank thread");
    RankHandle {
        rank,
        commands: tx,
        sink_stats,
        steps,
        thread: Mutex::new(Some(thread)),
    }
}

fn run<S: loadlink_publish::LoadSource>(
    rx: Receiver<Command>,
    sched: Arc<Mutex<Scheduler>>,
    mut publisher: Publisher<S>,
    point: PublishPoint,
    scale: f64,
    virtual_now: impl Fn() -> f64,
    steps: Arc<AtomicU64>,
) {
    let mut clients: HashMap<u64, UnboundedSender<Event>> = HashMap::new();
    let mut idle = false;
    let mut last_kind = StepKind::Idle;
    loop {
        // Idle: block for the next command (bounded, for the heartbeat). Busy: just drain.
        let first = if idle {
            match rx.recv_timeout(IDLE_PUBLISH_FLOOR) {
                Ok(c) => Some(c),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        } else {
            None
        };
        let mut sched_guard = match sched.lock() {
            Ok(g) => g,
            Err(_) => return,
        };
        let mut arrived = false;
        for cmd in first
            .into_iter()
            .chain(std::iter::from_fn(|| rx.try_recv().ok()))
        {
            match cmd {
                Command::Submit(s, reply) => {
                    clients.insert(s.id, reply);
                    sched_guard.submit(s);
                    arrived = true;
                }
                Command::Abort(id) => {
                    sched_guard.abort(id);
                    clients.remove(&id);
                }
                Command::Stop => {
                    drop(sched_guard);
                    publisher.close();
                    return;
                }
            }
        }
        // The source locks the scheduler itself.
        drop(sched_guard);
        let due = idle || arrived || last_kind == StepKind::Prefill;
        if point == PublishPoint::Ingest {
            publisher.publish(due);
        }
        let step = match sched.lock() {
            Ok(mut g) => g.step(virtual_now()),
            Err(_) => return,
        };
        if step.kind == StepKind::Idle {
            // Going idle is said at once, whatever the decode cadence skipped; after that, one
            // heartbeat per idle wake-up (Ingest already sent it at the top of the cycle).
            if point != PublishPoint::Ingest || last_kind != StepKind::Idle {
                publisher.publish(true);
            }
            (idle, last_kind) = (true, StepKind::Idle);
            continue;
        }
        if point == PublishPoint::Scheduled {
            publisher.publish(due || step.kind == StepKind::Prefill);
        }
        (idle, last_kind) = (false, step.kind);
        steps.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs_f64(step.duration / scale));
        for e in &step.events {
            let id = match *e {
                Event::FirstToken { id } | Event::Token { id } | Event::Finished { id, .. } => id,
            };
            let gone = clients.get(&id).is_none_or(|c| c.send(*e).is_err());
            if matches!(e, Event::Finished { .. }) || gone {
                clients.remove(&id);
            }
            if gone && !matches!(e, Event::Finished { .. }) {
                // The client left without its abort arriving yet: free the KV now.
                if let Ok(mut s) = sched.lock() {
                    s.abort(id);
                }
            }
        }
        if point == PublishPoint::BatchEnd {
            publisher.publish(last_kind == StepKind::Prefill);
        }
    }
}
