//! Load ingest that scales with messages, not with workers.
//!
//! A small fixed set of threads (default one, `--ingest-threads`) owns every rank's SUB socket.
//! Each waits on an epoll set holding libzmq's `ZMQ_FD` of its sockets, so a wake-up costs
//! O(ready sockets), never O(fleet); idle sockets cost nothing. A ready socket is drained
//! ([`drain`]) and only its newest snapshot is decoded.
//!
//! Work per wakeup is bounded per stream (`Budgets::wakeup_messages`): a drain stops after that
//! many messages so one flooding publisher cannot keep its thread from every other socket. Since
//! `ZMQ_FD` is edge-triggered and no new edge comes for a socket that still holds messages, such
//! a socket is put on a revisit list and served again on the next turn, before the thread sleeps
//! (the next `epoll_wait` then does not block). Workers are added and removed through a
//! command channel with an eventfd doorbell. All ranks of a worker live on one thread, so each
//! book entry keeps a single writer.
//!
//! A safety sweep: once a second the thread drains every socket that has delivered nothing for a
//! second. If an edge were ever missed, libzmq would not signal that socket again (its pipe stays
//! non-empty), so its rank would stay stale for good; the sweep bounds that to a second and counts
//! what it finds in `loadlink_ingest_rescued_total` (0 when every edge is seen). It touches only
//! quiet sockets, so its cost is O(silent ranks) per second.
//!
//! The sweep also redials a load socket silent for [`REDIAL_AFTER`] (a load publisher sends every
//! cycle and heartbeats when idle, so such a rank has lost its connection). libzmq redials a lost
//! publisher by itself, except after a protocol error, such as a message over `ZMQ_MAXMSGSIZE`:
//! it then drops the connection for good and the rank would stay deaf. The redial bounds what a
//! publisher that sent one oversized message loses to [`REDIAL_AFTER`], and what a hostile one
//! costs to one refused connection per interval (counted in `loadlink_ingest_redials_total`, and
//! as a `load_message_too_large` refusal of the worker once [`refused`] tells it from a lost one).
//!
//! KV-event streams ([`kv`]) live on the same threads and in the same epoll sets, beside their
//! worker's load sockets: one more SUB per rank, and a replay DEALER only while a replay runs.
//!
//! Removal: a subscription's cache-book slots are freed by its ingest thread itself, right after
//! it closed the subscription's sockets ([`Ingest::remove`] hands the thread what to free). A
//! freed slot can then be reused at once: no stream still writes into it, however late the thread
//! is. The caller's wait for the acknowledgement is bounded and only for its own bookkeeping.

pub mod drain;
mod epoll;
pub mod kv;
mod kv_replay;
mod kv_seq;
mod kv_snapshot;
mod kv_subscribe;
mod refused;
pub mod stats;

use crate::book::Worker;
use crate::budget::Refusal;
use crate::cache::CacheBook;
use crate::zctx::FleetContext;
use drain::{Scratch, drain_rank_at_most};
use epoll::{Doorbell, Epoll};
use kv::{KV_TAG, KvStreams, KvSubscription, REPLAY_TAG};
use refused::{Seen, WATCH_TAG, Watch};
use stats::IngestStats;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How often quiet sockets are swept, and how quiet they must be.
const SWEEP: Duration = Duration::from_secs(1);
/// A load socket silent this long is redialled (see the module docs), at most once per interval.
pub const REDIAL_AFTER: Duration = Duration::from_secs(5);

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
        sockets: Vec<(usize, String, zmq::Socket)>,
        kv: Option<KvSubscription>,
    },
    Remove {
        id: u64,
        /// Freed once the sockets are closed (see the module docs).
        release: Option<Release>,
        done: mpsc::SyncSender<()>,
    },
    Stop,
}

/// A removed worker's cache-book registration, released by the ingest thread.
pub struct Release {
    pub book: Arc<CacheBook>,
    pub worker: Arc<Worker>,
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
    /// Starts `threads` ingest threads (at least one), each stream taking at most
    /// `wakeup_messages` messages per wakeup; they keep `ctx` alive while they hold sockets made
    /// from it.
    pub fn start(
        threads: usize,
        ctx: Arc<FleetContext>,
        wakeup_messages: usize,
    ) -> std::io::Result<Self> {
        let stats = Arc::new(IngestStats::default());
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let (tx, rx) = mpsc::channel();
            let bell = Arc::new(Doorbell::new()?);
            let lp = Loop::new(
                rx,
                bell.clone(),
                stats.clone(),
                ctx.clone(),
                wakeup_messages,
            )?;
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

    /// Hands `sockets` (rank, endpoint, SUB connected to it) of `worker`, and its KV-event
    /// streams if any, to an ingest thread.
    pub fn add(
        &self,
        worker: Arc<Worker>,
        sockets: Vec<(usize, String, zmq::Socket)>,
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

    /// Closes a subscription's sockets, then (on its thread) frees `release`'s cache-book slots;
    /// waits (bounded by `wait`) until the thread has done so, and says whether it had.
    pub fn remove(&self, sub: SubscriptionId, release: Option<Release>, wait: Duration) -> bool {
        let (done, closed) = mpsc::sync_channel(1);
        let c = Command::Remove {
            id: sub.id,
            release,
            done,
        };
        self.send(sub.thread, c);
        closed.recv_timeout(wait).is_ok()
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
    endpoint: String,
    fd: std::os::fd::RawFd,
    /// When a drain last found messages, or the socket was last redialled.
    last_rx: Instant,
    /// A monitor while the socket is silent and redialled ([`refused`]).
    watch: Option<Watch>,
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
    /// Messages per stream per wakeup.
    wakeup: u64,
    /// Tokens whose drain stopped at the budget, served again on the next turn.
    revisit: Vec<u64>,
    /// Load sockets with a monitor ([`refused`]), at most [`refused::MAX_WATCHES`].
    watching: usize,
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
        wakeup_messages: usize,
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
            kv: KvStreams::new(wakeup_messages),
            kv_replaying: false,
            wakeup: (wakeup_messages as u64).max(1),
            revisit: Vec::new(),
            watching: 0,
            scratch: Scratch::default(),
            stats,
            ctx,
        })
    }

    fn run(mut self) {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 512];
        let mut ready = Vec::with_capacity(events.len());
        let mut last_sweep = Instant::now();
        let mut carried = Vec::new();
        loop {
            self.kv.take_revisits(&mut self.revisit);
            std::mem::swap(&mut carried, &mut self.revisit);
            let timeout = if !carried.is_empty() {
                Duration::ZERO
            } else if self.kv_replaying {
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
            // What the last turn left unfinished goes after what became ready since: a flooding
            // socket waits its turn behind the others.
            ready.append(&mut carried);
            for &token in &ready {
                if token == BELL {
                    self.bell.clear();
                    if !self.commands() {
                        return;
                    }
                } else if token & WATCH_TAG != 0 {
                    self.watch_events((token & !WATCH_TAG) as usize);
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

    /// Drains slot `i` (at most the wakeup budget; see the module docs); returns how many
    /// messages it had.
    fn drain(&mut self, i: usize) -> u64 {
        let Some(Some(s)) = self.slots.get_mut(i) else {
            return 0;
        };
        let d = drain_rank_at_most(
            &s.socket,
            &s.worker,
            s.rank,
            &mut self.scratch,
            &self.stats,
            self.wakeup,
        );
        self.stats.drains.fetch_add(1, Relaxed);
        if d.messages > 0 {
            s.last_rx = Instant::now();
        }
        if d.more {
            self.revisit.push(i as u64);
        }
        if d.messages > 0
            && let Some(w) = s.watch.take()
        {
            w.stop(&mut s.socket, &self.epoll);
            self.watching -= 1;
        }
        d.messages
    }

    /// Reads slot `i`'s monitor events; a lost publisher (libzmq redials it) ends the watch.
    fn watch_events(&mut self, i: usize) {
        let Some(Some(s)) = self.slots.get_mut(i) else {
            return;
        };
        if let Some(w) = &mut s.watch
            && w.read() == Seen::Lost
            && let Some(w) = s.watch.take()
        {
            w.stop(&mut s.socket, &self.epoll);
            self.watching -= 1;
        }
    }

    /// Drains the sockets that delivered nothing for [`SWEEP`], and redials those silent for
    /// [`REDIAL_AFTER`] (see the module docs).
    fn sweep(&mut self) {
        for i in 0..self.slots.len() {
            let quiet = matches!(&self.slots[i], Some(s) if s.last_rx.elapsed() >= SWEEP);
            if quiet && self.drain(i) > 0 {
                self.stats.rescued.fetch_add(1, Relaxed);
            }
            let Some(s) = &mut self.slots[i] else {
                continue;
            };
            // Events are read on their edge too; reading here as well bounds a missed one.
            if let Some(w) = &mut s.watch
                && w.read() == Seen::Lost
                && let Some(w) = s.watch.take()
            {
                w.stop(&mut s.socket, &self.epoll);
                self.watching -= 1;
            }
            if let Some(w) = &mut s.watch
                && w.refused()
            {
                let (rank, ep) = (s.rank, &s.endpoint);
                s.worker.refusals.refuse(Refusal::LoadMessageTooLarge, || {
                    format!("rank {rank}: libzmq dropped the connection to {ep} for a protocol error, a message over the load-message budget (or a malformed frame header)")
                });
            }
            if s.last_rx.elapsed() >= REDIAL_AFTER {
                if s.watch.is_none() && self.watching < refused::MAX_WATCHES {
                    match Watch::start(&self.ctx, &s.socket, &self.epoll, i) {
                        Ok(w) => {
                            s.watch = Some(w);
                            self.watching += 1;
                        }
                        Err(e) => tracing::debug!(worker = %s.worker.url, "socket monitor: {e}"),
                    }
                }
                // ENOENT when libzmq already dropped the endpoint; connect anew either way.
                let _ = s.socket.disconnect(&s.endpoint);
                if let Err(e) = s.socket.connect(&s.endpoint) {
                    tracing::debug!(worker = %s.worker.url, rank = s.rank, "redial: {e}");
                }
                s.last_rx = Instant::now();
                self.stats.redials.fetch_add(1, Relaxed);
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
                Command::Remove { id, release, done } => {
                    self.remove(id);
                    if let Some(r) = release {
                        r.book.unregister(&r.worker);
                    }
                    let _ = done.try_send(());
                }
                Command::Stop => return false,
            }
        }
        true
    }

    fn add(&mut self, id: u64, worker: Arc<Worker>, sockets: Vec<(usize, String, zmq::Socket)>) {
        for (rank, endpoint, socket) in sockets {
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
                endpoint,
                fd,
                last_rx: Instant::now(),
                watch: None,
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
            if let Some(mut s) = self.slots[i].take() {
                debug_assert_eq!(s.id, id);
                if let Some(w) = s.watch.take() {
                    w.stop(&mut s.socket, &self.epoll);
                    self.watching -= 1;
                }
                self.epoll.remove(s.fd);
                self.stats.subscriptions.fetch_sub(1, Relaxed);
                self.free.push(i);
            }
        }
    }
}
