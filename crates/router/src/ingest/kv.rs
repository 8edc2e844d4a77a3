//! KV-event streams on the ingest threads: one SUB per (worker, rank) in the same epoll set as
//! the load sockets, every batch decoded and applied to the [`CacheBook`] in seq order.
//!
//! Gaps and restarts follow [`Sequencer`]'s rules. A replay is a DEALER to the engine's replay
//! ROUTER (SGLang's protocol: send `[b"", start seq]`, receive `[b"", topic, seq, payload]` per
//! buffered batch, then `[b"", b"", -1, b""]`). It is made when needed and closed when the replay
//! ends, so a stream costs one socket at rest. It is registered in the same epoll set, so nothing
//! blocks: a replay that does not answer within [`REPLAY_TIMEOUT`] (checked by the once-a-second
//! sweep) fails, the slot is cleared and marked incomplete, and replays from that stream pause for
//! [`REPLAY_BACKOFF`].
//!
//! Restarts an idle engine would hide: a restarted engine publishes KV batches only when its cache
//! changes, and those first batches usually go out before the router's SUB has reconnected. The
//! worker's load stream, which publishes every cycle and heartbeats when idle, notices the restart
//! (its seq goes back); the sweep reads that rank's load-restart counter and resyncs the KV slot
//! (clear, replay from 0) when it moved.
//!
//! Why a snapshot first on subscription: PUB/SUB delivers only what is published after the
//! connection is up, and an engine may have filled its cache long before. A snapshot
//! ([`super::kv_snapshot`]) brings the slot to the engine's state at a barrier seq; an engine
//! without snapshots is replayed from seq 0 instead (as far as its buffer reaches, else the slot
//! says it is incomplete). Uncovered gaps, restarts and new epochs recover the same way.
//!
//! Epochs: a topic frame ending in `\0sgl-kv-epoch=N` names the engine lifetime that published
//! it. A batch from an older lifetime than the stream follows is dropped (counted as fenced); a
//! newer one is a restart.

pub(super) use super::drain::readable;
use super::epoll::Epoll;
use super::kv_replay::ReplaySocket;
use super::kv_seq::{Live, Sequencer};
use super::kv_snapshot::SnapshotSupport;
pub use super::kv_subscribe::{KvSocket, KvSubscription, open_kv_sub, subscribe};
use crate::book::Worker;
use crate::cache::{CacheBook, ResyncReason};
use crate::zctx::FleetContext;
use loadlink_wire::frame::split_frames;
use loadlink_wire::kv_events::decode_kv_batch;
use loadlink_wire::kv_snapshot::split_epoch_topic;
use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hasher};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// How often the ingest loop wakes while a replay runs.
pub const REPLAY_POLL: Duration = Duration::from_millis(25);
/// Epoll tokens of KV SUB sockets: this bit | stream index.
pub const KV_TAG: u64 = 1 << 62;
/// Epoll tokens of replay DEALERs: this bit | stream index.
pub const REPLAY_TAG: u64 = 1 << 61;
/// A replay must answer (its first batch or its end) within this.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(3);
/// A replay that answered but then sent nothing for this long was cut short: the engine's ROUTER
/// sheds at its send high-water mark (1,000 messages by default, in SGLang's publisher as in
/// ours) while it writes a long replay in one loop, end marker included. What arrived is kept and
/// the rest is asked for again from there.
pub const REPLAY_IDLE: Duration = Duration::from_millis(100);
/// After a failed replay, gaps on that stream resync without one for this long.
pub const REPLAY_BACKOFF: Duration = Duration::from_secs(5);
/// Replays in a row that bring nothing new before gaps are resynced without one.
const FRUITLESS_LIMIT: u32 = 3;
/// Probe replays after a (re)subscription, until a live batch arrives: the first after this, each
/// next after twice the interval, none past [`PROBE_LAST`]. PUB/SUB drops what is published before
/// the SUB's connection is up; on a stream that then goes quiet no later batch would reveal the
/// gap, so the router asks the replay socket itself a few times while the connection comes up.
pub const PROBE_FIRST: Duration = Duration::from_secs(1);
/// The longest probe interval; probing stops after it.
pub const PROBE_LAST: Duration = Duration::from_secs(16);
/// Live batches kept while a replay runs; past this they are dropped (and replayed later).
const MAX_HELD: usize = 10_000;

pub(super) struct Stream {
    pub(super) id: u64,
    pub(super) book: Arc<CacheBook>,
    pub(super) worker: Arc<Worker>,
    /// The load stream's restart count of this rank, as last seen.
    pub(super) load_restarts: u64,
    pub(super) k: KvSocket,
    pub(super) fd: RawFd,
    pub(super) seq: Sequencer,
    pub(super) replay: Option<ReplaySocket>,
    pub(super) held: VecDeque<(i64, Vec<u8>)>,
    pub(super) backoff_until: Option<Instant>,
    pub(super) fruitless: u32,
    /// Until a live batch proves the SUB connected: when to ask the replay socket again (see
    /// [`PROBE_FIRST`]), and the interval after that.
    pub(super) probe: Option<(Instant, Duration)>,
    pub(super) last_rx: Instant,
    /// Messages one drain of its SUB or its replay DEALER may take (`Budgets::wakeup_messages`).
    pub(super) wakeup: u64,
    /// Whether the engine serves snapshots, and when a failed one may be asked again.
    pub(super) snapshots: SnapshotSupport,
    pub(super) snapshot_backoff: Option<Instant>,
    /// The engine lifetime the slot follows (from topic frames and snapshot headers).
    pub(super) epoch: Option<u64>,
    /// The worker's advertised block size (what snapshot records are stored with).
    pub(super) block_size: i64,
}

pub(super) fn digest(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    h.write(bytes);
    h.finish()
}

/// The KV streams of one ingest thread.
pub struct KvStreams {
    streams: Vec<Option<Stream>>,
    free: Vec<usize>,
    by_id: HashMap<u64, Vec<usize>>,
    /// Messages per stream per wakeup.
    wakeup: u64,
    /// Tokens of sockets whose drain stopped at the budget: the ingest loop serves them again on
    /// its next turn (no edge will announce what they still hold).
    revisit: Vec<u64>,
}

impl KvStreams {
    /// No streams yet; each drain takes at most `wakeup` messages.
    pub fn new(wakeup: usize) -> Self {
        KvStreams {
            streams: Vec::new(),
            free: Vec::new(),
            by_id: HashMap::new(),
            wakeup: (wakeup as u64).max(1),
            revisit: Vec::new(),
        }
    }

    /// Moves the tokens to serve again (see [`KvStreams::revisit`]) into `out`.
    pub fn take_revisits(&mut self, out: &mut Vec<u64>) {
        out.append(&mut self.revisit);
    }

    /// Registers `sub`'s streams under subscription `id` and starts each one's initial replay.
    pub fn add(
        &mut self,
        epoll: &Epoll,
        ctx: &FleetContext,
        id: u64,
        worker: &Arc<Worker>,
        sub: KvSubscription,
    ) {
        for k in sub.streams {
            let Ok(fd) = k.sub.get_fd() else {
                tracing::warn!(
                    rank = k.rank,
                    "ZMQ_FD of a KV stream failed; stream not served"
                );
                continue;
            };
            let i = self.free.pop().unwrap_or_else(|| {
                self.streams.push(None);
                self.streams.len() - 1
            });
            if let Err(e) = epoll.add(fd, KV_TAG | i as u64) {
                tracing::warn!(rank = k.rank, "epoll: {e}; KV stream not served");
                self.free.push(i);
                continue;
            }
            sub.book.counters.streams.fetch_add(1, Relaxed);
            let mut s = Stream {
                id,
                book: sub.book.clone(),
                worker: worker.clone(),
                load_restarts: 0,
                k,
                fd,
                seq: Sequencer::default(),
                replay: None,
                held: VecDeque::new(),
                backoff_until: None,
                fruitless: 0,
                probe: None,
                last_rx: Instant::now(),
                wakeup: self.wakeup,
                snapshots: SnapshotSupport::Unknown,
                snapshot_backoff: None,
                epoch: None,
                block_size: sub.block_size,
            };
            s.schedule_probes();
            s.load_restarts = s.load_restarts_now();
            s.recover(epoll, ctx, i);
            if s.drain_live(epoll, ctx, i) {
                self.revisit.push(KV_TAG | i as u64);
            }
            self.streams[i] = Some(s);
            self.by_id.entry(id).or_default().push(i);
        }
    }

    /// Closes subscription `id`'s streams.
    pub fn remove(&mut self, epoll: &Epoll, id: u64) {
        for i in self.by_id.remove(&id).unwrap_or_default() {
            if let Some(mut s) = self.streams[i].take() {
                debug_assert_eq!(s.id, id);
                epoll.remove(s.fd);
                s.close_replay(epoll);
                s.book.counters.streams.fetch_sub(1, Relaxed);
                self.free.push(i);
            }
        }
    }

    /// Serves a ready token carrying [`KV_TAG`] or [`REPLAY_TAG`].
    pub fn ready(&mut self, epoll: &Epoll, ctx: &FleetContext, token: u64) {
        let i = (token & !(KV_TAG | REPLAY_TAG)) as usize;
        let Some(Some(s)) = self.streams.get_mut(i) else {
            return;
        };
        let more = if token & REPLAY_TAG != 0 {
            s.drain_replay(epoll, ctx, i)
        } else {
            s.drain_live(epoll, ctx, i)
        };
        if more {
            self.revisit.push(token);
        }
    }

    /// Checks running replays: one silent past [`REPLAY_TIMEOUT`] fails, one that stalled past
    /// [`REPLAY_IDLE`] after answering is continued. Returns whether any replay still runs (the
    /// ingest loop then wakes every [`REPLAY_POLL`] to call this again).
    pub fn poll_replays(&mut self, epoll: &Epoll, ctx: &FleetContext) -> bool {
        let now = Instant::now();
        let mut running = false;
        for (i, s) in self.streams.iter_mut().enumerate() {
            let Some(s) = s else { continue };
            if s.replay.is_some() && s.drain_replay(epoll, ctx, i) {
                self.revisit.push(REPLAY_TAG | i as u64);
            }
            match &s.replay {
                Some(r) if r.first && now >= r.deadline => s.replay_timed_out(epoll, ctx, i),
                Some(r) if !r.first && now.duration_since(r.last_rx) >= REPLAY_IDLE => {
                    s.replay_stalled(epoll, ctx, i)
                }
                _ => {}
            }
            running |= s.replay.is_some();
        }
        running
    }

    /// The once-a-second sweep: drains quiet sockets (a missed edge), follows load restarts, sends
    /// due probe replays, and asks again for a snapshot a failed one left owed.
    pub fn sweep(&mut self, epoll: &Epoll, ctx: &FleetContext, quiet: Duration) {
        for (i, s) in self.streams.iter_mut().enumerate() {
            let Some(s) = s else { continue };
            s.probe_if_due(epoll, ctx, i);
            if s.last_rx.elapsed() >= quiet && s.drain_live(epoll, ctx, i) {
                self.revisit.push(KV_TAG | i as u64);
            }
            s.follow_load_restart(epoll, ctx, i);
            s.retry_snapshot_if_due(epoll, ctx, i);
        }
    }
}

impl Stream {
    /// Starts the probe schedule (a new subscription, or the SUB reconnecting to a new engine).
    fn schedule_probes(&mut self) {
        if self.k.replay_endpoint.is_some() {
            self.probe = Some((Instant::now() + PROBE_FIRST, PROBE_FIRST));
        }
    }

    fn probe_if_due(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) {
        let Some((at, every)) = self.probe else {
            return;
        };
        if Instant::now() < at || self.replay.is_some() {
            return;
        }
        self.probe = (every < PROBE_LAST).then(|| (Instant::now() + 2 * every, 2 * every));
        if self.can_replay()
            && self.start_replay(epoll, ctx, i)
            && let Some(r) = &mut self.replay
        {
            r.probe = true;
        }
    }

    fn load_restarts_now(&self) -> u64 {
        let rank = self.k.rank as usize;
        self.worker
            .ranks
            .get(rank)
            .map_or(0, |r| r.restarts.load(Relaxed))
    }

    /// Resyncs from seq 0 when this rank's load stream saw its engine restart.
    fn follow_load_restart(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) {
        let now = self.load_restarts_now();
        if now == self.load_restarts {
            return;
        }
        self.load_restarts = now;
        self.schedule_probes();
        self.restarted(epoll, ctx, i, "engine restarted (load stream)");
    }

    /// Receives up to [`Stream::wakeup`] live batches; true when it stopped there (messages may
    /// be left, and no edge will announce them).
    fn drain_live(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) -> bool {
        let mut taken = 0;
        loop {
            if taken >= self.wakeup {
                return true;
            }
            match self.k.sub.recv_multipart(zmq::DONTWAIT) {
                Ok(frames) => {
                    taken += 1;
                    self.last_rx = Instant::now();
                    let (seq, epoch) = match split_frames(&frames) {
                        Ok(raw) => (raw.seq, split_epoch_topic(raw.topic).1),
                        Err(_) => {
                            self.book.counters.decode_errors.fetch_add(1, Relaxed);
                            continue;
                        }
                    };
                    match self.fence(epoch) {
                        Some(true) => continue,
                        Some(false) => self.restarted(epoll, ctx, i, "a new epoch in the topic"),
                        None => {}
                    }
                    let payload = frames.into_iter().nth(2).unwrap_or_default();
                    self.on_live(epoll, ctx, i, seq, payload);
                }
                Err(zmq::Error::EAGAIN) if readable(&self.k.sub) => continue,
                Err(_) => return false,
            }
        }
    }

    fn on_live(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize, seq: i64, p: Vec<u8>) {
        match self.seq.live(seq) {
            Live::Apply => {
                self.apply(seq, &p, true);
                self.fruitless = 0;
                self.probe = None; // the SUB is connected: later batches come live
            }
            Live::Duplicate => {
                self.book.counters.duplicates.fetch_add(1, Relaxed);
            }
            Live::Hold => self.hold(seq, p),
            Live::Restart => {
                self.load_restarts = self.load_restarts_now();
                self.restarted(
                    epoll,
                    ctx,
                    i,
                    &format!("restarted (seq went back to {seq})"),
                );
                self.on_live(epoll, ctx, i, seq, p);
            }
            Live::Gap { from } => {
                self.k.stats.gaps.fetch_add(1, Relaxed);
                self.book.counters.gaps.fetch_add(1, Relaxed);
                tracing::debug!(rank = self.k.rank, "KV-event gap: {from}..{seq} missed");
                if self.can_replay() && self.start_replay(epoll, ctx, i)
                    || self.snapshot_for_gap(epoll, ctx, i)
                {
                    self.hold(seq, p);
                } else {
                    let why = if self.k.replay_endpoint.is_some() {
                        ResyncReason::GapNotCovered
                    } else {
                        ResyncReason::NoReplay
                    };
                    self.resync(why, true);
                    self.k.stats.set_view(self.incomplete_view());
                    self.seq.accept_any_next();
                    self.apply(seq, &p, true);
                }
            }
        }
    }

    /// After a gap no replay can fill: rebuilds the slot from a snapshot, if one may be asked.
    fn snapshot_for_gap(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) -> bool {
        if !self.snapshots_possible() || self.k.replay_endpoint.is_none() {
            return false;
        }
        self.resync(ResyncReason::GapNotCovered, false);
        self.seq.reset();
        self.start_snapshot(epoll, ctx, i)
    }

    fn hold(&mut self, seq: i64, p: Vec<u8>) {
        if self.held.len() < MAX_HELD {
            self.held.push_back((seq, p));
        }
    }

    fn can_replay(&self) -> bool {
        self.k.replay_endpoint.is_some()
            && self.fruitless < FRUITLESS_LIMIT
            && self.backoff_until.is_none_or(|t| Instant::now() >= t)
    }

    /// Decodes and applies one batch; a malformed one is counted and leaves the view incomplete.
    pub(super) fn apply(&mut self, seq: i64, payload: &[u8], live: bool) {
        match decode_kv_batch(payload) {
            Ok(batch) => self.book.apply(self.k.slot, &batch),
            Err(e) => {
                tracing::debug!(rank = self.k.rank, "malformed KV-event batch {seq}: {e}");
                self.book.counters.decode_errors.fetch_add(1, Relaxed);
                self.book.mark_stale(self.k.slot);
            }
        }
        self.seq.applied(seq, digest(payload), live);
        self.k.stats.last_seq.store(seq, Relaxed);
    }

    pub(super) fn resync(&mut self, why: ResyncReason, stale: bool) {
        self.k.stats.resyncs.fetch_add(1, Relaxed);
        self.book.resync(self.k.slot, why, stale);
        self.k.stats.last_seq.store(-1, Relaxed);
    }

    /// Passes the batches held during a replay through the live rules, oldest first.
    pub(super) fn flush_held(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) {
        let held = std::mem::take(&mut self.held);
        for (seq, p) in held {
            self.on_live(epoll, ctx, i, seq, p);
        }
    }
}
