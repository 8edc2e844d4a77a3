//! `CacheBook`: the router's one shared view of every worker's KV cache, fed by the engines'
//! KV-event streams through the ingest threads, read by the request path.
//!
//! * **What it holds.** The [`KvIndex`] (block hash → holder slots) and the slot map: each
//!   (worker, DP rank) with a KV-event stream gets a [`Slot`]; a removed worker's slots are
//!   cleared and their ids reused. Per stream, [`StreamStats`] (gaps, replays, resyncs, last seq)
//!   shared with the ingest thread that owns the stream's sockets.
//! * **Why one `RwLock` around index and slot map.** The request path takes a read lock for one
//!   longest-prefix match (microseconds) and never writes; the ingest threads take the write lock
//!   once per decoded batch, so a request waits at most for one batch's events. A sharded or
//!   lock-free index would only pay off with many ingest threads writing at once; one lock keeps
//!   the index and the slot map consistent with each other for free. `std::sync::RwLock` (futex
//!   based on Linux) prefers writers, so a stream of readers cannot starve the ingest.
//! * **No allocation on the request path.** [`CacheBook::cached_tokens`] reuses the caller's
//!   output and a thread-local scratch (match list, per-slot depth table) that only grows.
//!
//! The ingest side ([`crate::ingest::kv`]) decides *when* to apply, clear or resync (seqs, gaps,
//! replays); this type only does it and counts it.

use super::index::{KvIndex, Slot};
use super::lookup::ApproxSlots;
use crate::book::Worker;
use loadlink_wire::kv_events::{KvEvent, KvEventBatch};
use smallvec::SmallVec;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Default bound on distinct blocks (`--kv-index-max-blocks`): 4 Mi blocks, about 64 Mi tokens
/// at page 16; a few hundred MB of index at most.
pub const DEFAULT_MAX_BLOCKS: usize = 1 << 22;

/// One KV-event stream's counters, shared by the ingest thread (writer) and `/workers`.
#[derive(Debug)]
pub struct StreamStats {
    pub rank: u32,
    /// Gaps detected (each a run of one or more missing seqs).
    pub gaps: AtomicU64,
    /// Replays requested.
    pub replays: AtomicU64,
    /// Times the slot was cleared and rebuilt (restart, uncovered gap, failed replay).
    pub resyncs: AtomicU64,
    /// The last seq applied; -1 before the first.
    pub last_seq: AtomicI64,
}

impl StreamStats {
    fn new(rank: u32) -> Self {
        StreamStats {
            rank,
            gaps: AtomicU64::new(0),
            replays: AtomicU64::new(0),
            resyncs: AtomicU64::new(0),
            last_seq: AtomicI64::new(-1),
        }
    }
}

/// Why a slot was cleared and rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResyncReason {
    /// The stream's seq went back, or a replay showed a different history: a new engine.
    Restart,
    /// The replay buffer no longer held the missing batches.
    GapNotCovered,
    /// The replay did not answer in time.
    ReplayFailed,
    /// A gap on a stream without a replay endpoint.
    NoReplay,
}

impl ResyncReason {
    pub const ALL: [ResyncReason; 4] = [
        ResyncReason::Restart,
        ResyncReason::GapNotCovered,
        ResyncReason::ReplayFailed,
        ResyncReason::NoReplay,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ResyncReason::Restart => "restart",
            ResyncReason::GapNotCovered => "gap_not_covered",
            ResyncReason::ReplayFailed => "replay_failed",
            ResyncReason::NoReplay => "no_replay",
        }
    }
}

/// Book-wide counters (the `loadlink_kv_*` families).
#[derive(Debug, Default)]
pub struct CacheCounters {
    /// Events applied, by type: stored, removed, cleared.
    pub events: [AtomicU64; 3],
    /// Block hashes carried by the applied stored / removed events.
    pub block_events: [AtomicU64; 2],
    pub batches: AtomicU64,
    pub gaps: AtomicU64,
    pub replays_requested: AtomicU64,
    pub replays_succeeded: AtomicU64,
    pub replays_failed: AtomicU64,
    /// Replays that went silent before their end marker (the engine shed at its HWM) and were
    /// continued from where they stopped.
    pub replays_cut_short: AtomicU64,
    /// Resyncs by [`ResyncReason`] (same order as [`ResyncReason::ALL`]).
    pub resyncs: [AtomicU64; 4],
    pub decode_errors: AtomicU64,
    /// Live seqs that were already applied (replayed first, then seen live).
    pub duplicates: AtomicU64,
    /// KV-event streams held by the ingest threads.
    pub streams: AtomicU64,
}

/// The `type` labels of [`CacheCounters::events`].
pub const EVENT_TYPES: [&str; 3] = ["stored", "removed", "cleared"];

/// A worker's streams in the book.
pub(crate) struct WorkerEntry {
    pub(crate) url: String,
    pub(crate) block_size: u64,
    /// (slot, stats) per rank, rank order.
    pub(crate) ranks: SmallVec<[(Slot, Arc<StreamStats>); 8]>,
    /// Keeps the worker's address from being reused while it is a key here.
    _worker: Arc<Worker>,
}

/// Keys are `Arc<Worker>` addresses: already unique, one multiply spreads them.
#[derive(Default)]
pub(crate) struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_usize(&mut self, v: usize) {
        self.0 = (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub(crate) struct Inner {
    pub(crate) index: KvIndex,
    pub(crate) workers: HashMap<usize, WorkerEntry, BuildHasherDefault<PtrHasher>>,
    free: Vec<Slot>,
    next_slot: Slot,
    /// Workers without a stream, by URL, with why.
    pub(crate) no_stream: HashMap<String, String>,
}

/// The shared cache view; see the module docs.
pub struct CacheBook {
    inner: RwLock<Inner>,
    pub counters: CacheCounters,
    /// What this router sent to workers priced without a stream (see `lookup.rs`).
    approx: Mutex<ApproxSlots>,
}

/// Reused buffers of [`CacheBook::cached_tokens`], one set per thread.
#[derive(Default)]
struct Scratch {
    matches: Vec<(Slot, u32)>,
    depth: Vec<u32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// A worker's key: its address (that of the `Worker` inside its `Arc`, so `&Worker` and
/// `&Arc<Worker>` give the same key).
pub(crate) fn key(w: &Worker) -> usize {
    std::ptr::from_ref(w) as usize
}

impl Default for CacheBook {
    fn default() -> Self {
        CacheBook::new(DEFAULT_MAX_BLOCKS)
    }
}

impl CacheBook {
    /// An empty book whose index holds at most `max_blocks` distinct blocks.
    pub fn new(max_blocks: usize) -> Self {
        CacheBook {
            inner: RwLock::new(Inner {
                index: KvIndex::new(max_blocks),
                workers: HashMap::default(),
                free: Vec::new(),
                next_slot: 0,
                no_stream: HashMap::new(),
            }),
            counters: CacheCounters::default(),
            approx: Mutex::default(),
        }
    }

    pub(crate) fn approx_lock(&self) -> MutexGuard<'_, ApproxSlots> {
        self.approx.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// For each of `workers`: whether it has a KV-event stream, and (into `blocks`, resized) the
    /// blocks its fullest rank holds.
    pub fn stream_blocks(&self, workers: &[Arc<Worker>], blocks: &mut Vec<u64>) -> Vec<bool> {
        blocks.clear();
        blocks.resize(workers.len(), 0);
        let g = self.read();
        workers
            .iter()
            .zip(blocks.iter_mut())
            .map(|(w, b)| match g.workers.get(&key(w)) {
                Some(e) => {
                    *b = e
                        .ranks
                        .iter()
                        .map(|(slot, _)| g.index.slot_stats(*slot).blocks)
                        .max()
                        .unwrap_or(0);
                    true
                }
                None => false,
            })
            .collect()
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives `worker`'s ranks `0..ranks` a slot each (hashes over `block_size`-token pages);
    /// returns them in rank order with their stats. Replaces an earlier registration of the same
    /// worker.
    pub fn register(
        &self,
        worker: &Arc<Worker>,
        block_size: u64,
        ranks: u32,
    ) -> Vec<(Slot, Arc<StreamStats>)> {
        self.unregister(worker);
        let mut g = self.write();
        g.no_stream.remove(&worker.url);
        let mut out = SmallVec::new();
        for rank in 0..ranks {
            let slot = g.free.pop().unwrap_or_else(|| {
                g.next_slot += 1;
                g.next_slot - 1
            });
            g.index.clear_slot(slot);
            out.push((slot, Arc::new(StreamStats::new(rank))));
        }
        let v = out.to_vec();
        let entry = WorkerEntry {
            url: worker.url.clone(),
            block_size,
            ranks: out,
            _worker: worker.clone(),
        };
        g.workers.insert(key(worker), entry);
        v
    }

    /// Records why `url` has no KV-event stream (shown in `/workers`).
    pub fn no_stream(&self, url: &str, reason: String) {
        self.write().no_stream.insert(url.to_string(), reason);
    }

    /// Forgets why `url` had no stream (the worker left the fleet).
    pub fn forget(&self, url: &str) {
        self.write().no_stream.remove(url);
    }

    /// Forgets `worker`: clears its slots and frees their ids. Call after its sockets are closed.
    pub fn unregister(&self, worker: &Arc<Worker>) {
        self.approx_lock().forget(worker);
        let mut g = self.write();
        if let Some(e) = g.workers.remove(&key(worker)) {
            for (slot, _) in e.ranks {
                g.index.clear_slot(slot);
                g.free.push(slot);
            }
        }
    }

    /// Applies one decoded batch of `slot`'s stream, under one write lock.
    pub fn apply(&self, slot: Slot, batch: &KvEventBatch) {
        let c = &self.counters;
        c.batches.fetch_add(1, Relaxed);
        if batch.events.is_empty() {
            return;
        }
        let mut g = self.write();
        for e in &batch.events {
            let (i, blocks) = match e {
                KvEvent::Stored(s) => (0, s.block_hashes.len()),
                KvEvent::Removed(r) => (1, r.block_hashes.len()),
                KvEvent::AllCleared => (2, 0),
            };
            c.events[i].fetch_add(1, Relaxed);
            if i < 2 {
                c.block_events[i].fetch_add(blocks as u64, Relaxed);
            }
            g.index.apply(slot, e);
        }
    }

    /// Clears `slot` to rebuild it, counting why; `stale` marks the rebuilt view incomplete (the
    /// history before what can be replayed is lost).
    pub fn resync(&self, slot: Slot, reason: ResyncReason, stale: bool) {
        self.counters.resyncs[reason as usize].fetch_add(1, Relaxed);
        let mut g = self.write();
        g.index.clear_slot(slot);
        if stale {
            g.index.mark_stale(slot);
        }
    }

    /// Marks `slot`'s view incomplete without clearing it.
    pub fn mark_stale(&self, slot: Slot) {
        self.write().index.mark_stale(slot);
    }

    /// For each of `workers` (in order), how many of the request's prompt tokens are cached there:
    /// the longest run of `chain` (the prompt's page hashes, `page_size` tokens each) held by any
    /// of its ranks, in tokens; 0 for a worker without a stream. `out` is overwritten; steady
    /// state allocates nothing.
    pub fn cached_tokens(
        &self,
        workers: &[Arc<Worker>],
        chain: &[i64],
        page_size: u64,
        out: &mut Vec<u64>,
    ) {
        out.clear();
        out.resize(workers.len(), 0);
        if chain.is_empty() || workers.is_empty() {
            return;
        }
        let g = self.read();
        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            g.index.match_into(chain, &mut s.matches);
            if s.matches.is_empty() {
                return;
            }
            if s.depth.len() < g.next_slot as usize {
                s.depth.resize(g.next_slot as usize, 0);
            }
            for &(slot, held) in &s.matches {
                if let Some(d) = s.depth.get_mut(slot as usize) {
                    *d = held;
                }
            }
            for (o, w) in out.iter_mut().zip(workers) {
                if let Some(e) = g.workers.get(&key(w)) {
                    let best = e
                        .ranks
                        .iter()
                        .map(|(slot, _)| s.depth[*slot as usize])
                        .max();
                    *o = u64::from(best.unwrap_or(0)) * page_size;
                }
            }
            for &(slot, _) in &s.matches {
                if let Some(d) = s.depth.get_mut(slot as usize) {
                    *d = 0;
                }
            }
        });
    }

    /// The blocks the index holds for `url`'s rank `rank` (`None`: no such stream). For tests and
    /// debugging; O(the slot's blocks).
    pub fn rank_blocks(&self, url: &str, rank: u32) -> Option<Vec<i64>> {
        let g = self.read();
        let e = g.workers.values().find(|e| e.url == url)?;
        let (slot, _) = e.ranks.iter().find(|(_, s)| s.rank == rank)?;
        Some(g.index.slot_blocks(*slot).collect())
    }

    /// Distinct blocks in the index.
    pub fn blocks(&self) -> usize {
        self.read().index.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loadlink_wire::kv_events::{BlockRemoved, BlockStored};
    use std::time::Instant;

    fn worker(url: &str) -> Arc<Worker> {
        Arc::new(Worker::new(url.into(), 1, None, Instant::now()))
    }

    fn batch(events: Vec<KvEvent>) -> KvEventBatch {
        KvEventBatch {
            ts: 0.0,
            events,
            attn_dp_rank: None,
        }
    }

    fn stored(h: &[i64]) -> KvEvent {
        KvEvent::Stored(BlockStored {
            block_hashes: h.to_vec(),
            block_size: 4,
            ..Default::default()
        })
    }

    #[test]
    fn cached_tokens_per_worker_in_order_max_over_ranks() {
        let book = CacheBook::new(100);
        let (a, b, c) = (
            worker("http://a:1"),
            worker("http://b:1"),
            worker("http://c:1"),
        );
        let sa = book.register(&a, 4, 2);
        let sb = book.register(&b, 4, 1);
        book.apply(sa[0].0, &batch(vec![stored(&[1, 2])]));
        book.apply(sa[1].0, &batch(vec![stored(&[1, 2, 3])]));
        book.apply(sb[0].0, &batch(vec![stored(&[1])]));
        let mut out = Vec::new();
        book.cached_tokens(
            &[c.clone(), b.clone(), a.clone()],
            &[1, 2, 3, 4],
            4,
            &mut out,
        );
        assert_eq!(out, [0, 4, 12]);
        let removed = KvEvent::Removed(BlockRemoved {
            block_hashes: vec![3],
            medium: None,
        });
        book.apply(sa[1].0, &batch(vec![removed]));
        book.cached_tokens(std::slice::from_ref(&a), &[1, 2, 3, 4], 4, &mut out);
        assert_eq!(out, [8]);
        assert_eq!(book.counters.events[1].load(Relaxed), 1);
        book.cached_tokens(&[a.clone(), b.clone()], &[9], 4, &mut out);
        assert_eq!(out, [0, 0], "no holder of the root: nothing cached");
    }

    #[test]
    fn removing_a_worker_clears_and_reuses_its_slots() {
        let book = CacheBook::new(100);
        let (a, b) = (worker("http://a:1"), worker("http://b:1"));
        let sa = book.register(&a, 4, 1);
        book.apply(sa[0].0, &batch(vec![stored(&[1, 2])]));
        assert_eq!(book.blocks(), 2);
        book.unregister(&a);
        assert_eq!(book.blocks(), 0);
        let sb = book.register(&b, 4, 1);
        assert_eq!(sb[0].0, sa[0].0, "the freed slot is reused");
        let mut out = Vec::new();
        book.cached_tokens(&[a, b], &[1, 2], 4, &mut out);
        assert_eq!(out, [0, 0]);
        assert_eq!(book.rank_blocks("http://b:1", 0), Some(vec![]));
        assert_eq!(book.rank_blocks("http://a:1", 0), None);
    }

    #[test]
    fn resync_clears_and_may_mark_stale() {
        let book = CacheBook::new(100);
        let a = worker("http://a:1");
        let s = book.register(&a, 4, 1)[0].0;
        book.apply(s, &batch(vec![stored(&[1, 2])]));
        book.resync(s, ResyncReason::GapNotCovered, true);
        assert_eq!(book.blocks(), 0);
        assert!(book.read().index.slot_stats(s).needs_resync);
        assert_eq!(
            book.counters.resyncs[ResyncReason::GapNotCovered as usize].load(Relaxed),
            1
        );
    }
}
