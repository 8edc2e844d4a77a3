//! `CacheBook`: the router's one shared view of every worker's KV cache, fed by the engines'
//! KV-event streams through the ingest threads, read by the request path.
//!
//! * **What it holds.** The [`KvIndex`] (block hash → holder slots) and the stream map: each
//!   (worker, DP rank) with a KV-event stream gets a stream id (the [`Slot`] the ingest holds) and
//!   an index slot. Ids are never reused, index slots are: a stream that outlives its worker's
//!   removal (its sockets close a little later) writes to an id that no longer maps to anything,
//!   never into the slot of the worker that came next. Per stream, [`StreamStats`] shared with the
//!   ingest thread that owns the stream's sockets. Beside it, the approximate trees of workers
//!   priced without an index ([`ApproxSlots`]).
//! * **One worker per URL.** Registering a URL replaces whatever was registered under it, the
//!   same `Arc` or another (two adds of one URL racing): the replaced streams are cleared, so no
//!   registration leaks its slots.
//! * **Why one `RwLock` around index and slot map.** The request path takes a read lock for one
//!   longest-prefix match (microseconds) and never writes; the ingest threads take the write lock
//!   once per decoded batch, so a request waits at most for one batch's events. One lock keeps the
//!   index and the slot map consistent with each other for free.
//! * **Never O(blocks) under the lock.** Clearing a slot (a restart, a resync, a removed worker,
//!   a rank over quota) detaches its block set in O(1); the holder entries left behind are
//!   unlinked in steps of [`UNLINK_STEP`] entries, each under its own write lock, released
//!   *fairly* (`parking_lot`'s `unlock_fair` hands the lock to the waiting lookups instead of
//!   letting the clearing thread take it straight back). The caller of the clear does the steps
//!   (an ingest thread, or the fleet's removal), so a clear still returns only when it is done.
//! * **A quota per rank** ([`crate::budget::Budgets::index_blocks_per_rank`]): a rank that would
//!   hold more stops being indexed, its worker is priced from the approximate tree as well, and
//!   the refusal (`index_quota`) is counted on the worker.
//! * **No allocation on the request path.** [`CacheBook::cached_tokens`] reuses the caller's
//!   output and a thread-local scratch (match list, per-slot depth table) that only grows.

use super::approx_slots::{ApproxSlots, key};
use super::block_size::unmatched_reason;
use super::id_hash::IdMap;
use super::index::{DetachedBlocks, KvIndex, Slot};
use super::stream::{CacheCounters, ResyncReason, StreamStats};
use crate::book::Worker;
use crate::budget::Refusal;
use crate::candidate::Candidates;
use loadlink_wire::kv_events::{BlockStored, KvEvent, KvEventBatch};
use loadlink_wire::kv_snapshot::SnapshotRecord;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// Default bound on distinct blocks (`--kv-index-max-blocks`): 4 Mi blocks, about 64 Mi tokens
/// at page 16; a few hundred MB of index at most.
pub const DEFAULT_MAX_BLOCKS: usize = 1 << 22;

/// Holder entries unlinked per write lock when a slot is cleared: tens of microseconds.
pub const UNLINK_STEP: usize = 2048;

/// One rank's stream: its id (what the ingest holds), its index slot, its counters.
pub(crate) struct RankEntry {
    pub(crate) id: Slot,
    pub(crate) slot: Slot,
    pub(crate) stats: Arc<StreamStats>,
}

/// A worker's streams in the book.
pub(crate) struct WorkerEntry {
    pub(crate) url: String,
    pub(crate) block_size: u64,
    /// Rank order.
    pub(crate) ranks: SmallVec<[RankEntry; 8]>,
    /// Keeps the worker's address from being reused while it is a key here, and is where an
    /// over-quota refusal is counted.
    pub(crate) worker: Arc<Worker>,
}

impl WorkerEntry {
    /// The streams of a candidate: rank `rank`'s, or every rank's for the whole worker.
    pub(crate) fn of(&self, rank: Option<u32>) -> impl Iterator<Item = &RankEntry> + '_ {
        // Rank r's stream sits at index r ([`CacheBook::register`] gives ranks 0..n).
        let one = rank.map(|r| self.ranks.get(r as usize));
        let all = rank
            .is_none()
            .then(|| self.ranks.iter())
            .into_iter()
            .flatten();
        one.flatten().into_iter().chain(all)
    }
}

pub(crate) struct Inner {
    pub(crate) index: KvIndex,
    pub(crate) workers: IdMap<usize, WorkerEntry>,
    /// Live stream ids → index slots.
    streams: IdMap<Slot, Slot>,
    free: Vec<Slot>,
    pub(crate) next_slot: Slot,
    next_id: Slot,
    /// Workers without a stream, by URL, with why.
    pub(crate) no_stream: HashMap<String, String>,
}

/// The shared cache view; see the module docs.
pub struct CacheBook {
    inner: RwLock<Inner>,
    pub counters: CacheCounters,
    /// What this router sent to workers priced from the approximate tree (see `lookup.rs`).
    pub(crate) approx: ApproxSlots,
    /// Whether the tails of the prompts this router placed get reused ([`super::reuse`]).
    pub reuse: super::TailReuse,
}

impl Default for CacheBook {
    fn default() -> Self {
        CacheBook::new(DEFAULT_MAX_BLOCKS)
    }
}

impl CacheBook {
    /// An empty book whose index holds at most `max_blocks` distinct blocks (and no per-rank
    /// quota until [`CacheBook::with_rank_quota`]).
    pub fn new(max_blocks: usize) -> Self {
        CacheBook {
            inner: RwLock::new(Inner {
                index: KvIndex::new(max_blocks),
                workers: IdMap::default(),
                streams: IdMap::default(),
                free: Vec::new(),
                next_slot: 0,
                next_id: 0,
                no_stream: HashMap::new(),
            }),
            counters: CacheCounters::default(),
            approx: ApproxSlots::default(),
            reuse: super::TailReuse::default(),
        }
    }

    /// The book with at most `quota` blocks per worker rank
    /// ([`crate::budget::Budgets::index_blocks_per_rank`]).
    pub fn with_rank_quota(self, quota: usize) -> Self {
        self.write().index.set_slot_quota(quota);
        self
    }

    /// The per-rank quota in blocks.
    pub fn rank_quota(&self) -> usize {
        self.read().index.slot_quota()
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read()
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write()
    }

    /// For each candidate: whether it is indexed (it has a KV-event stream whose view is
    /// complete, a block size the router can hash at, and is not over its quota; a whole worker: every rank of it), and (into
    /// `blocks` and `block_sizes`, resized) the blocks it holds (a whole worker: its fullest rank)
    /// and its worker's advertised block size (0 without a stream), and into `regret` its eviction
    /// regret ([`super::regret`]; a whole worker: its most regretful rank; 0 without a stream).
    pub fn stream_blocks(
        &self,
        targets: Candidates<'_>,
        blocks: &mut Vec<u64>,
        block_sizes: &mut Vec<u64>,
        regret: &mut Vec<f32>,
    ) -> Vec<bool> {
        blocks.clear();
        blocks.resize(targets.len(), 0);
        block_sizes.clear();
        block_sizes.resize(targets.len(), 0);
        regret.clear();
        regret.resize(targets.len(), 0.0);
        let g = self.read();
        targets
            .iter()
            .zip(blocks.iter_mut().zip(block_sizes.iter_mut()))
            .zip(regret.iter_mut())
            .map(|((c, (b, size)), rg)| {
                let w = &targets.workers()[c.worker as usize];
                let Some(e) = g.workers.get(&key(w)) else {
                    return false;
                };
                *size = e.block_size;
                let mut indexed = !e.ranks.is_empty() && unmatched_reason(e.block_size).is_none();
                for r in e.of(c.rank) {
                    let st = g.index.slot_stats(r.slot);
                    *b = (*b).max(st.blocks);
                    *rg = rg.max(g.index.regret(r.slot) as f32);
                    // Only a complete view answers alone (see `View`).
                    indexed &= !st.over_quota && !st.needs_resync && r.stats.view().is_complete();
                }
                indexed
            })
            .collect()
    }

    /// Gives `worker`'s ranks `0..ranks` a stream each (hashes over `block_size`-token pages);
    /// returns their ids in rank order with their stats. Replaces an earlier registration of the
    /// same worker, or of another worker with the same URL (whose streams are cleared).
    pub fn register(
        &self,
        worker: &Arc<Worker>,
        block_size: u64,
        ranks: u32,
    ) -> Vec<(Slot, Arc<StreamStats>)> {
        let (ids, replaced) = {
            let mut guard = self.write();
            let g = &mut *guard;
            g.no_stream.remove(&worker.url);
            let keys: Vec<usize> = g
                .workers
                .iter()
                .filter(|(k, e)| **k == key(worker) || e.url == worker.url)
                .map(|(k, _)| *k)
                .collect();
            let replaced: Vec<WorkerEntry> =
                keys.iter().filter_map(|k| g.workers.remove(k)).collect();
            let mut ranks_out: SmallVec<[RankEntry; 8]> = SmallVec::new();
            for rank in 0..ranks {
                let slot = g.free.pop().unwrap_or_else(|| {
                    g.next_slot += 1;
                    g.next_slot - 1
                });
                let mut id = g.next_id;
                while g.streams.contains_key(&id) {
                    id = id.wrapping_add(1);
                }
                g.next_id = id.wrapping_add(1);
                g.streams.insert(id, slot);
                ranks_out.push(RankEntry {
                    id,
                    slot,
                    stats: Arc::new(StreamStats::new(rank)),
                });
            }
            let ids: Vec<_> = ranks_out.iter().map(|r| (r.id, r.stats.clone())).collect();
            // Freed after the new ranks took theirs: a replaced stream's slot is not reused by
            // its own successor.
            for e in &replaced {
                release(g, e);
            }
            let entry = WorkerEntry {
                url: worker.url.clone(),
                block_size,
                ranks: ranks_out,
                worker: worker.clone(),
            };
            g.workers.insert(key(worker), entry);
            (ids, replaced)
        };
        for e in replaced.iter().filter(|e| !Arc::ptr_eq(&e.worker, worker)) {
            self.approx.forget(&e.worker);
        }
        self.approx.revive(worker);
        self.finish_unlinks();
        ids
    }

    /// Records why `url` has no KV-event stream (shown in `/workers`).
    pub fn no_stream(&self, url: &str, reason: String) {
        self.write().no_stream.insert(url.to_string(), reason);
        self.approx.revive_url(url);
    }

    /// Forgets why `url` had no stream (the worker left the fleet).
    pub fn forget(&self, url: &str) {
        self.write().no_stream.remove(url);
    }

    /// Forgets `worker`: clears its slots (its stream ids stop mapping to anything) and its
    /// approximate tree; later dispatches to it are not recorded.
    pub fn unregister(&self, worker: &Arc<Worker>) {
        self.approx.forget(worker);
        let mut g = self.write();
        if let Some(e) = g.workers.remove(&key(worker)) {
            release(&mut g, &e);
        }
        drop(g);
        self.finish_unlinks();
    }

    /// Applies one decoded batch of stream `id`, under one write lock (a stream whose worker was
    /// removed or replaced is ignored). A rank that passes its quota here is cleared and counted
    /// as an `index_quota` refusal of its worker.
    pub fn apply(&self, id: Slot, batch: &KvEventBatch) {
        let c = &self.counters;
        c.batches.fetch_add(1, Relaxed);
        if batch.events.is_empty() {
            return;
        }
        let mut g = self.write();
        let Some(&slot) = g.streams.get(&id) else {
            return;
        };
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
        let over = g.index.take_over_quota();
        let pending = g.index.pending_unlinks() > 0;
        drop(g);
        if !over.is_empty() {
            self.refuse_over_quota(&over);
        }
        if pending {
            self.finish_unlinks();
        }
    }

    /// Counts an `index_quota` refusal on the worker of each slot in `over` (gone over quota).
    fn refuse_over_quota(&self, over: &[Slot]) {
        let g = self.read();
        let refused: Vec<(Arc<Worker>, u32)> = over.iter().filter_map(|s| owner(&g, *s)).collect();
        let quota = g.index.slot_quota();
        drop(g);
        for (worker, rank) in refused {
            worker.refusals.refuse(Refusal::IndexQuota, || {
                format!(
                    "the KV-event stream of rank {rank} stored more than {quota} blocks (--kv-index-max-blocks-per-rank): the rank is no longer indexed, the worker is priced from the approximate tree"
                )
            });
        }
        self.finish_unlinks();
    }

    /// Stores a snapshot chunk's records in stream `id`'s slot, under one write lock (records come
    /// parent first, so the index's nesting holds as they land); returns the blocks they carry.
    pub fn load_records(&self, id: Slot, records: Vec<SnapshotRecord>, block_size: i64) -> u64 {
        let mut g = self.write();
        let Some(&slot) = g.streams.get(&id) else {
            return 0;
        };
        let mut blocks = 0;
        for r in records {
            blocks += r.blocks.len() as u64;
            let e = KvEvent::Stored(BlockStored {
                block_hashes: r.blocks,
                parent_block_hash: r.parent,
                block_size,
                medium: r.medium,
                ..Default::default()
            });
            g.index.apply(slot, &e);
        }
        let over = g.index.take_over_quota();
        drop(g);
        if !over.is_empty() {
            self.refuse_over_quota(&over);
        }
        blocks
    }

    /// Clears stream `id`'s slot to rebuild it, counting why; `stale` marks the rebuilt view
    /// incomplete (the history before what can be replayed is lost). A rank over quota stays
    /// unindexed.
    pub fn resync(&self, id: Slot, reason: ResyncReason, stale: bool) {
        self.counters.resyncs[reason as usize].fetch_add(1, Relaxed);
        let mut g = self.write();
        let Some(&slot) = g.streams.get(&id) else {
            return;
        };
        g.index.detach_slot(slot);
        if stale {
            g.index.mark_stale(slot);
        }
        drop(g);
        self.finish_unlinks();
    }

    /// Marks stream `id`'s view incomplete without clearing it.
    pub fn mark_stale(&self, id: Slot) {
        let mut g = self.write();
        if let Some(&slot) = g.streams.get(&id) {
            g.index.mark_stale(slot);
        }
    }

    /// Unlinks what cleared slots left behind, [`UNLINK_STEP`] entries per write lock, handing
    /// the lock fairly to waiting readers between steps; returns when nothing is left.
    fn finish_unlinks(&self) {
        let mut spent: Vec<DetachedBlocks> = Vec::new();
        loop {
            let mut g = self.write();
            let more = g.index.unlink_step(UNLINK_STEP, &mut spent);
            RwLockWriteGuard::unlock_fair(g);
            spent.clear();
            if !more {
                return;
            }
        }
    }

    /// The blocks the index holds for `url`'s rank `rank` (`None`: no such stream). For tests and
    /// debugging; O(the slot's blocks).
    pub fn rank_blocks(&self, url: &str, rank: u32) -> Option<Vec<i64>> {
        let g = self.read();
        let e = g.workers.values().find(|e| e.url == url)?;
        let r = e.ranks.iter().find(|r| r.stats.rank == rank)?;
        Some(g.index.slot_blocks(r.slot).collect())
    }

    /// Distinct blocks in the index (a cleared slot's count until its clear has finished).
    pub fn blocks(&self) -> usize {
        self.read().index.len()
    }

    /// Streams (worker ranks) registered, and workers with an approximate tree: what a removal
    /// must bring back down.
    pub fn registrations(&self) -> (usize, usize) {
        (self.read().streams.len(), self.approx.len())
    }
}

/// Detaches and frees `e`'s slots; their ids stop mapping.
fn release(g: &mut Inner, e: &WorkerEntry) {
    for r in &e.ranks {
        g.streams.remove(&r.id);
        g.index.release_slot(r.slot);
        g.free.push(r.slot);
    }
}

/// The worker and rank of index slot `slot`.
fn owner(g: &Inner, slot: Slot) -> Option<(Arc<Worker>, u32)> {
    g.workers.values().find_map(|e| {
        let r = e.ranks.iter().find(|r| r.slot == slot)?;
        Some((e.worker.clone(), r.stats.rank))
    })
}

#[cfg(test)]
#[path = "book_tests.rs"]
mod tests;
