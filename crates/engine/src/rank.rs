//! The real-time driver of one DP rank: a thread that owns the rank's `Scheduler` and `Publisher`.
//!
//! Each loop iteration (one scheduler cycle) takes new commands, runs one scheduler step, sleeps
//! the step's duration divided by `time_scale`, then delivers the step's events to the waiting HTTP
//! handlers. An idle rank blocks on the command channel for up to [`IDLE_PUBLISH_FLOOR`], so it
//! publishes a heartbeat instead of spinning.
//!
//! The driver does not decide when to publish: it reports each part of the cycle to the shared
//! [`PublishCycle`] (the simulator in `loadlink-bench` does the same) and passes the answer to its
//! `Publisher`. The cycle itself ([`RankLoop`]) is separate from the thread, so a test can drive it
//! turn by turn.

use crate::cycle::{CycleEvent, IDLE_PUBLISH_FLOOR, PublishCycle, PublishPoint};
use crate::model::{Event, ModelConfig, Scheduler, Step, StepKind, Submit};
use loadlink_publish::{
    CacheCut, KvEventPublisher, KvPublisherStats, KvSeq, LoadSource, Publisher, Sink, SinkStats,
};
use loadlink_wire::kv_events::KvEventBatch;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::UnboundedSender;

/// What a rank thread accepts.
pub enum Command {
    Submit(Submit, UnboundedSender<Event>),
    Abort(u64),
    /// Drop every cached page no running request holds (SGLang's `/flush_cache`).
    FlushCache,
    /// Disaggregation: the decode side of prefill request `id` registered for its KV.
    PeerRegistered(u64),
    /// Disaggregation: prefill request `id`'s KV was sent, `latency_s` after its prefill; it
    /// finishes now with its one token.
    TransferDone {
        id: u64,
        latency_s: f64,
    },
    /// Disaggregation: decode request `id`'s KV arrived, `latency_s` after it was asked for.
    KvArrived {
        id: u64,
        latency_s: f64,
    },
    Stop,
}

/// The prefix cache's figures, as of the rank's last step (for `/metrics`).
#[derive(Debug, Default)]
pub struct CacheCounters {
    /// Cached prompt tokens of every admission.
    pub hit_tokens: AtomicU64,
    /// Prompt tokens of every admission.
    pub prompt_tokens: AtomicU64,
    /// Tokens in the cache now.
    pub cached_tokens: AtomicU64,
    /// LoRA adapter loads since start.
    pub lora_loads: AtomicU64,
    /// LoRA adapters resident now.
    pub lora_resident: AtomicU64,
}

/// Handle on a running rank.
pub struct RankHandle {
    pub rank: u32,
    pub commands: Sender<Command>,
    pub sink_stats: Vec<(&'static str, Arc<SinkStats>)>,
    pub steps: Arc<AtomicU64>,
    pub cache: Arc<CacheCounters>,
    /// The KV-event publisher's counters, when this rank publishes KV events.
    pub kv_events: Option<Arc<KvPublisherStats>>,
    /// The rank's scheduler, for read-only debug routes (`/cache_blocks`).
    pub scheduler: Arc<Mutex<Scheduler>>,
    /// The KV-event seq counter (read under the scheduler lock, it agrees with the cache) and
    /// the publisher's epoch, when this rank publishes KV events.
    pub kv_seq: Option<(KvSeq, u64)>,
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

/// Starts rank `rank` with its sinks (internal first) and its KV-event publisher, if any, on its
/// own thread.
pub fn spawn(
    rank: u32,
    cfg: ModelConfig,
    time_scale: f64,
    point: PublishPoint,
    sinks: Vec<Box<dyn Sink>>,
    kv: Option<KvEventPublisher>,
) -> RankHandle {
    let (tx, rx) = std::sync::mpsc::channel();
    let scheduler = Arc::new(Mutex::new(if kv.is_some() {
        Scheduler::with_kv_events(cfg)
    } else {
        Scheduler::new(cfg)
    }));
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
    let kv_events = kv.as_ref().map(KvEventPublisher::stats);
    let kv_seq = kv.as_ref().map(|k| (k.seq(), k.epoch()));
    if let Some(k) = &kv {
        k.set_snapshot_source(snapshot_source(rank, scheduler.clone(), k.seq()));
    }
    let shared = scheduler.clone();
    let mut turns = RankLoop::new(scheduler, publisher, point, virtual_now);
    turns.kv = kv.map(|p| (rank, p));
    let cache = turns.cache.clone();
    let thread = std::thread::Builder::new()
        .name(format!("rank-{rank}"))
        .spawn(move || run(rx, turns, scale, steps2))
        .expect("spawning a rank thread");
    RankHandle {
        rank,
        commands: tx,
        sink_stats,
        steps,
        cache,
        kv_events,
        scheduler: shared,
        kv_seq,
        thread: Mutex::new(Some(thread)),
    }
}

/// The rank's snapshot source, called on the publisher's replay thread: under the scheduler lock
/// (where every batch is handed over and given its seq) it reads the last assigned seq and copies
/// the cache's pages, nothing more; the publisher orders and encodes them after the lock is gone.
fn snapshot_source(
    rank: u32,
    sched: Arc<Mutex<Scheduler>>,
    seq: KvSeq,
) -> loadlink_publish::SnapshotSource {
    Arc::new(move || {
        let s = sched.lock().ok()?;
        let barrier_seq = seq.last_assigned();
        let pages = s.prefix_cache().export_pages();
        let page_size = u32::try_from(s.config().page_size).unwrap_or(u32::MAX);
        drop(s);
        Some(CacheCut {
            replica_rank: rank,
            barrier_seq,
            page_size,
            pages,
        })
    })
}

/// The rank thread: wait for commands (bounded while idle), one turn, sleep the step, deliver.
fn run<S: LoadSource>(
    rx: Receiver<Command>,
    mut turns: RankLoop<S>,
    scale: f64,
    steps: Arc<AtomicU64>,
) {
    loop {
        // Idle: block for the next command (bounded, for the heartbeat). Busy: just drain.
        let first = if turns.is_idle() {
            match rx.recv_timeout(IDLE_PUBLISH_FLOOR) {
                Ok(c) => Some(c),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        } else {
            None
        };
        let commands = first
            .into_iter()
            .chain(std::iter::from_fn(|| rx.try_recv().ok()));
        let Some(step) = turns.begin(commands) else {
            return;
        };
        if step.kind == StepKind::Idle {
            continue;
        }
        steps.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs_f64(step.duration / scale));
        turns.end(&step);
    }
}

/// One rank's scheduler cycle without the thread and the sleeping: take in commands, schedule a
/// step, and after it ran, deliver its events. Publishing happens where the [`PublishCycle`] says.
pub struct RankLoop<S: LoadSource> {
    sched: Arc<Mutex<Scheduler>>,
    publisher: Publisher<S>,
    cycle: PublishCycle,
    clients: HashMap<u64, UnboundedSender<Event>>,
    virtual_now: Box<dyn Fn() -> f64 + Send>,
    /// This rank's KV-event publisher and its rank number.
    kv: Option<(u32, KvEventPublisher)>,
    cache: Arc<CacheCounters>,
}

impl<S: LoadSource> RankLoop<S> {
    /// `publisher`'s source must read `sched` (it is collected with the lock released).
    pub fn new(
        sched: Arc<Mutex<Scheduler>>,
        publisher: Publisher<S>,
        point: PublishPoint,
        virtual_now: impl Fn() -> f64 + Send + 'static,
    ) -> Self {
        RankLoop {
            sched,
            publisher,
            cycle: PublishCycle::new(point),
            clients: HashMap::new(),
            virtual_now: Box::new(virtual_now),
            kv: None,
            cache: Arc::default(),
        }
    }

    /// Whether the last step was idle (the thread waits for work before the next turn).
    pub fn is_idle(&self) -> bool {
        self.cycle.is_idle()
    }

    fn on(&mut self, ev: CycleEvent) {
        if let Some(force) = self.cycle.on(ev).force() {
            self.publisher.publish(force);
        }
    }

    /// Takes in `commands`, then schedules the next step. `None`: stop (the sinks are closed).
    pub fn begin(&mut self, commands: impl IntoIterator<Item = Command>) -> Option<Step> {
        let (mut arrived, mut flushed) = (false, false);
        let mut finished = Vec::new();
        {
            let mut sched = self.sched.lock().ok()?;
            for cmd in commands {
                match cmd {
                    Command::Submit(s, reply) => {
                        self.clients.insert(s.id, reply);
                        sched.submit(s);
                        arrived = true;
                    }
                    Command::Abort(id) => {
                        sched.abort(id);
                        self.clients.remove(&id);
                    }
                    Command::FlushCache => {
                        sched.flush_cache();
                        flushed = true;
                    }
                    Command::PeerRegistered(id) => {
                        sched.peer_registered(id);
                    }
                    Command::TransferDone { id, latency_s } => {
                        finished.extend(sched.finish_transfer(id, latency_s));
                    }
                    Command::KvArrived { id, latency_s } => {
                        arrived |= sched.kv_arrived(id, latency_s);
                    }
                    Command::Stop => {
                        drop(sched);
                        self.publisher.close();
                        if let Some((_, kv)) = &mut self.kv {
                            kv.close();
                        }
                        return None;
                    }
                }
            }
        } // The source locks the scheduler itself.
        // A finished transfer cached its prompt: announced like a flush, even if no step follows.
        flushed |= !finished.is_empty();
        for e in finished {
            if let Event::Finished { id, .. } = e
                && let Some(client) = self.clients.remove(&id)
            {
                let _ = client.send(e);
            }
        }
        if flushed {
            self.cache_changes(); // announce the change even if no step follows
        }
        self.on(CycleEvent::Ingest { arrived });
        let now = (self.virtual_now)();
        let step = self.sched.lock().ok()?.step(now);
        self.on(CycleEvent::Scheduled(step.kind));
        Some(step)
    }

    /// The step ran: hands its events to the waiting handlers, then the batch-end publish point.
    pub fn end(&mut self, step: &Step) {
        for e in &step.events {
            let id = match *e {
                Event::FirstToken { id } | Event::Token { id } | Event::Finished { id, .. } => id,
            };
            let gone = self.clients.get(&id).is_none_or(|c| c.send(*e).is_err());
            if matches!(e, Event::Finished { .. }) || gone {
                self.clients.remove(&id);
            }
            if gone && !matches!(e, Event::Finished { .. }) {
                // The client left without its abort arriving yet: free the KV now.
                if let Ok(mut s) = self.sched.lock() {
                    s.abort(id);
                }
            }
        }
        self.cache_changes();
        self.on(CycleEvent::BatchEnd);
    }

    /// After a step: the cache's events go out as one batch, and its counters are refreshed.
    /// The events are taken **and** handed over (given their seq) under the scheduler lock, so
    /// the cache and the last assigned seq always agree under that lock (snapshot cuts and
    /// `/cache_blocks` read both there).
    fn cache_changes(&mut self) {
        let Ok(mut sched) = self.sched.lock() else {
            return;
        };
        let (hit, prompt) = sched.cache_totals();
        self.cache.hit_tokens.store(hit, Ordering::Relaxed);
        self.cache.prompt_tokens.store(prompt, Ordering::Relaxed);
        let cached = sched.cache_stats().cached_tokens;
        self.cache.cached_tokens.store(cached, Ordering::Relaxed);
        let loads = sched.adapter_loads();
        self.cache.lora_loads.store(loads, Ordering::Relaxed);
        let resident = sched.resident_count() as u64;
        self.cache.lora_resident.store(resident, Ordering::Relaxed);
        let Some((rank, kv)) = &self.kv else {
            return;
        };
        let events = sched.take_kv_events();
        if !events.is_empty() {
            // A try_send: the lock is held for the seq increment and the queue push only.
            kv.publish(KvEventBatch {
                ts: wall_now(),
                events,
                attn_dp_rank: Some(i64::from(*rank)),
            });
        }
        drop(sched);
    }
}
