//! Load ingest that scales with messages, not with workers.
//!
//! A small fixed set of threads (default one, `--ingest-threads`) owns every rank's SUB socket.
//! Each waits on an epoll set holding libzmq's `ZMQ_FD` of its sockets, so a wake-up costs
//! O(ready sockets), never O(fleet); idle sockets cost nothing. A ready socket is drained fully
//! ([`drain`]) and only its newest snapshot is decoded. Workers are added and removed through a
//! command channel with an eventfd doorbell. All ranks of a worker live on one thread, so each
//! book entry keeps a single writer.
//!
//! A safety sweep: once a second the thread drains every socket that has delivered nothing for a
//! second. If an edge were ever missed, libzmq would not signal that socket again (its pipe stays
//! non-empty), so its rank would stay stale for good; the sweep bounds that to a second and counts
//! what it finds in `loadlink_ingest_rescued_total` (0 when every edge is seen). It touches only
//! quiet sockets, so its cost is O(silent ranks) per second.
//!
//! KV-event streams ([`kv`]) live on the same threads and in the same epoll sets, beside their
//! worker's load sockets: one more SUB per rank, and a replay DEALER only while a replay runs.

pub mod drain;
mod epoll;
pub mod kv;
mod kv_replay;
mod kv_seq;
mod kv_subscribe;
pub mod stats;

use crate::book::Worker;
use crate::zctx::FleetContext;
use drain::{Scratch, drain_rank};
use epoll::{Doorbell, Epoll};
use kv::{KV_TAG, KvStreams, KvSubscription, REPLAY_TAG};
use stats::IngestStats;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How often quiet sockets are swept, and how quiet they must be.
const SWEEP: Duration = Duration::from_secs(1);

/// A worker's subscription: which thread holds its sockets, under which id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscriptionId {
    thread: usize,
    id: u64,
}

enum Command {
    Add {
        id: u64,
        worker: Arc<Worker>,
        sockets: Vec<(usize, zmq::Socket)>,
        kv: Option<KvSubscription>,
    },
    Remove {
        id: u64,
        done: mpsc::SyncSender<()>,
    },
    Stop,
}

struct Handle {
    tx: mpsc::Sender<Command>,
    bell: Arc<Doorbell>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The ingest threads.
pub struct Ingest {
    threads: Vec<Handle>,
    next_id: AtomicU64,
    stats: Arc<IngestStats>,
}

impl Ingest {
    /// Starts `threads` ingest threads (at least one); they keep `ctx` alive while they hold
    /// sockets made from it.
    pub fn start(threads: usize, ctx: Arc<FleetContext>) -> std::io::Result<Self> {
        let stats = Arc::new(IngestStats::default());
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let (tx, rx) = mpsc::channel();
            let bell = Arc::new(Doorbell::new()?);
            let lp = Loop::new(rx, bell.clone(), stats.clone(), ctx.clone())?;
            let thread = std::thread::Builder::new()
                .name(format!("ingest-{i}"))
                .spawn(move || lp.run())?;
            handles.push(Handle {
                tx,
                bell,
                thread: Some(thread),
            });
        }
        Ok(Ingest {
            threads: handles,
            next_id: AtomicU64::new(0),
            stats,
        })
    }

    pub fn stats(&self) -> &Arc<IngestStats> {
        &self.stats
    }

    /// Hands `sockets` (rank, connected SUB) of `worker`, and its KV-event streams if any, to an
    /// ingest thread.
    pub fn add(
        &self,
        worker: Arc<Worker>,
        sockets: Vec<(usize, zmq::Socket)>,
        kv: Option<KvSubscription>,
    ) -> SubscriptionId {
        let id = self.next_id.fetch_add(1, Relaxed);
        let thread = (id % self.threads.len() as u64) as usize;
        self.send(
            thread,
            Command::Add {
                id,
                worker,
                sockets,
                kv,
            },
        );
        SubscriptionId { thread, id }
    }

    /// Closes a subscription's sockets; waits (bounded) until its thread has done so.
    pub fn remove(&self, sub: SubscriptionId) {
        let (done, closed) = mpsc::sync_channel(1);
        self.send(sub.thread, Command::Remove { id: sub.id, done });
        let _ = closed.recv_timeout(Duration::from_secs(2));
    }

    fn send(&self, thread: usize, c: Command) {
        let h = &self.threads[thread];
        if h.tx.send(c).is_err() {
            tracing::error!("ingest thread {thread} is gone; load subscriptions are not served");
        }
        h.bell.ring();
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        for i in 0..self.threads.len() {
            self.send(i, Command::Stop);
        }
        for h in &mut self.threads {
            if let Some(t) = h.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// One rank's socket on a thread.
struct Slot {
    id: u64,
    worker: Arc<Worker>,
    rank: usize,
    socket: zmq::Socket,
    fd: std::os::fd::RawFd,
    /// When a drain last found messages.
    last_rx: Instant,
}

const BELL: u64 = u64::MAX;

/// One ingest thread's state. Field order matters: sockets close before the context goes.
struct Loop {
    epoll: Epoll,
    bell: Arc<Doorbell>,
    rx: mpsc::Receiver<Command>,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    by_id: HashMap<u64, Vec<usize>>,
    kv: KvStreams,
    /// A KV replay may be running: wake every `kv::REPLAY_POLL` to check on it.
    kv_replaying: bool,
    scratch: Scratch,
    stats: Arc<IngestStats>,
    ctx: Arc<FleetContext>,
}

impl Loop {
    fn new(
        rx: mpsc::Receiver<Command>,
        bell: Arc<Doorbell>,
        stats: Arc<IngestStats>,
        ctx: Arc<FleetContext>,
    ) -> std::io::Result<Self> {
        let epoll = Epoll::new()?;
        epoll.add(bell.raw(), BELL)?;
        Ok(Loop {
            epoll,
            bell,
            rx,
            slots: Vec::new(),
            free: Vec::new(),
            by_id: HashMap::new(),
            kv: KvStreams::default(),
            kv_replaying: false,
            scratch: Scratch::default(),
            stats,
            ctx,
        })
    }

    fn run(mut self) {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 512];
        let mut ready = Vec::with_capacity(events.len());
        let mut last_sweep = Instant::now();
        loop {
            let timeout = if self.kv_replaying {
                kv::REPLAY_POLL
            } else {
                SWEEP
            };
            self.epoll
                .wait(&mut ready, &mut events, timeout.as_millis() as i32);
            if last_sweep.elapsed() >= SWEEP {
                self.sweep();
                last_sweep = Instant::now();
            }
            self.stats.wakeups.fetch_add(1, Relaxed);
            for &token in &ready {
                if token == BELL {
                    self.bell.clear();
                    if !self.commands() {
                        return;
                    }
                } else if token & (KV_TAG | REPLAY_TAG) != 0 {
                    self.kv.ready(&self.epoll, &self.ctx, token);
                    self.kv_replaying = true;
                } else {
                    self.drain(token as usize);
                }
            }
            if self.kv_replaying {
                self.kv_replaying = self.kv.poll_replays(&self.epoll, &self.ctx);
            }
        }
    }

    /// Drains slot `i`; returns how many messages it had.
    fn drain(&mut self, i: usize) -> u64 {
        let Some(Some(s)) = self.slots.get_mut(i) else {
            return 0;
        };
        let d = drain_rank(&s.socket, &s.worker, s.rank, &mut self.scratch, &self.stats);
        self.stats.drains.fetch_add(1, Relaxed);
        if d.messages > 0 {
            s.last_rx = Instant::now();
        }
        d.messages
    }

    /// Drains the sockets that delivered nothing for [`SWEEP`] (see the module docs).
    fn sweep(&mut self) {
        for i in 0..self.slots.len() {
            let quiet = matches!(&self.slots[i], Some(s) if s.last_rx.elapsed() >= SWEEP);
            if quiet && self.drain(i) > 0 {
                self.stats.rescued.fetch_add(1, Relaxed);
            }
        }
        self.kv.sweep(&self.epoll, &self.ctx, SWEEP);
        self.kv_replaying = true; // a sweep may have started one; the next poll says
    }

    /// Applies queued commands; false on `Stop`.
    fn commands(&mut self) -> bool {
        while let Ok(c) = self.rx.try_recv() {
            match c {
                Command::Add {
                    id,
                    worker,
                    sockets,
                    kv,
                } => {
                    if let Some(kv) = kv {
                        self.kv.add(&self.epoll, &self.ctx, id, &worker, kv);
                        self.kv_replaying = true;
                    }
                    self.add(id, worker, sockets);
                }
                Command::Remove { id, done } => {
                    self.remove(id);
                    let _ = done.try_send(());
                }
                Command::Stop => return false,
            }
        }
        true
    }

    fn add(&mut self, id: u64, worker: Arc<Worker>, sockets: Vec<(usize, zmq::Socket)>) {
        for (rank, socket) in sockets {
            let fd = match socket.get_fd() {
                Ok(fd) => fd,
                Err(e) => {
                    tracing::warn!(worker = %worker.url, rank, "ZMQ_FD: {e}; rank not served");
                    continue;
                }
            };
            let i = self.free.pop().unwrap_or_else(|| {
                self.slots.push(None);
                self.slots.len() - 1
            });
            if let Err(e) = self.epoll.add(fd, i as u64) {
                tracing::warn!(worker = %worker.url, rank, "epoll: {e}; rank not served");
                self.free.push(i);
                continue;
            }
            self.slots[i] = Some(Slot {
                id,
                worker: worker.clone(),
                rank,
                socket,
                fd,
                last_rx: Instant::now(),
            });
            self.by_id.entry(id).or_default().push(i);
            self.stats.subscriptions.fetch_add(1, Relaxed);
            // Messages may have queued before the fd was registered: no edge will announce them.
            self.drain(i);
        }
    }

    fn remove(&mut self, id: u64) {
        self.kv.remove(&self.epoll, id);
        for i in self.by_id.remove(&id).unwrap_or_default() {
            if let Some(s) = self.slots[i].take() {
                debug_assert_eq!(s.id, id);
                self.epoll.remove(s.fd);
                self.stats.subscriptions.fetch_sub(1, Relaxed);
                self.free.push(i);
            }
        }
    }
}
