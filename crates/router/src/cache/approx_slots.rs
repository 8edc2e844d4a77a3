//! The approximate trees of the workers priced without a KV index: one [`ApproxTree`] per worker,
//! each behind its own mutex, so the request paths of different workers never wait for each
//! other. Recording a dispatched chain is O(prompt) (every block restamped); under the single
//! global mutex this replaces, every request's lookup waited for every other request's record.
//!
//! * **Sharding.** The worker → tree map sits behind an `RwLock` taken for reading on the request
//!   path (lookups and records) and for writing only when a worker gets its first tree or leaves.
//! * **Removed workers stay removed.** A request that picked a worker just before it was removed
//!   still records its dispatch afterwards; without a note of the removal that would re-create a
//!   tree (and keep it for ever, since nobody removes the worker again). Removal leaves a
//!   tombstone (a `Weak` of the worker, so it cannot outlive the worker's address and wrongly
//!   match a new one); later records for it are ignored. A worker that joins again under the same
//!   `Arc` (a failed KV subscription rolls back, then the worker joins without a stream) is
//!   revived by [`ApproxSlots::revive`] / [`ApproxSlots::revive_url`].
//!
//! Trees are keyed by the worker's address (as the KV book), and each holds its worker's `Arc` so
//! the address is not reused while it is a key.

use super::approx::ApproxTree;
use super::id_hash::IdMap;
use crate::book::Worker;
use crate::candidate::Candidates;
use std::sync::{Arc, Mutex, RwLock, Weak};

/// The approximate tree's bound per worker (blocks) and age.
pub const APPROX_MAX_BLOCKS: usize = 1 << 20;
pub const APPROX_TTL_MS: u64 = 120_000;

/// The slot of a worker's tree for a candidate: 0 for what was sent to the whole worker, 1 + r for
/// what was routed to its rank r (each rank caches on its own).
fn slot(rank: Option<u32>) -> u32 {
    rank.map_or(0, |r| r.saturating_add(1))
}

struct Shard {
    tree: Mutex<ApproxTree>,
    /// Pins the key's address; its strong count tells whether anyone else still holds the worker.
    _worker: Arc<Worker>,
}

#[derive(Default)]
struct Shards {
    trees: IdMap<usize, Arc<Shard>>,
    removed: IdMap<usize, Weak<Worker>>,
}

/// Every worker's approximate tree; see the module docs.
#[derive(Default)]
pub(crate) struct ApproxSlots {
    shards: RwLock<Shards>,
}

/// A worker's key: its address (that of the `Worker` inside its `Arc`).
pub(crate) fn key(w: &Worker) -> usize {
    std::ptr::from_ref(w) as usize
}

impl ApproxSlots {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Shards> {
        self.shards.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Shards> {
        self.shards.write().unwrap_or_else(|p| p.into_inner())
    }

    /// For each candidate that `wanted` names (by position), its tree's figures at `now_ms`
    /// (after expiry): the size of its slot in blocks, and how many leading blocks of `chain` it
    /// holds; `(0, 0)` for the others and for a worker never sent anything. One read of the map;
    /// one tree lock at a time.
    pub(crate) fn peek_each(
        &self,
        targets: Candidates<'_>,
        wanted: impl Fn(usize) -> bool,
        chain: &[i64],
        now_ms: u64,
        out: &mut Vec<(u64, u32)>,
    ) {
        out.clear();
        out.resize(targets.len(), (0, 0));
        let g = self.read();
        for (i, o) in out.iter_mut().enumerate() {
            let c = targets.get(i);
            let w = &targets.workers()[c.worker as usize];
            let Some(shard) = g.trees.get(&key(w)).filter(|_| wanted(i)) else {
                continue;
            };
            let mut t = shard.tree.lock().unwrap_or_else(|p| p.into_inner());
            t.expire(now_ms);
            let s = slot(c.rank);
            *o = (t.slot_stats(s).blocks, t.slot_depth(s, chain));
        }
    }

    /// Records that `chain` was sent to `w` (its rank `rank` by name, if any) at `now_ms`; ignored
    /// for a removed worker.
    pub(crate) fn record(&self, w: &Arc<Worker>, rank: Option<u32>, chain: &[i64], now_ms: u64) {
        let shard = self.read().trees.get(&key(w)).cloned();
        let shard = match shard {
            Some(s) => s,
            None => {
                let mut g = self.write();
                let removed = g.removed.get(&key(w)).and_then(Weak::upgrade);
                if removed.is_some_and(|r| Arc::ptr_eq(&r, w)) {
                    return;
                }
                let pruned = prune(&mut g);
                let new = || {
                    Arc::new(Shard {
                        tree: Mutex::new(ApproxTree::new(APPROX_MAX_BLOCKS, APPROX_TTL_MS)),
                        _worker: w.clone(),
                    })
                };
                let shard = g.trees.entry(key(w)).or_insert_with(new).clone();
                drop(g);
                drop(pruned);
                shard
            }
        };
        let mut t = shard.tree.lock().unwrap_or_else(|p| p.into_inner());
        t.record(slot(rank), chain, now_ms);
    }

    /// Forgets `w`'s tree (the worker left) and ignores its later dispatches. The tree is dropped
    /// after the lock is released (freeing it is O(its blocks)).
    pub(crate) fn forget(&self, w: &Arc<Worker>) {
        let gone = {
            let mut g = self.write();
            g.removed.retain(|_, r| r.strong_count() > 0);
            g.removed.insert(key(w), Arc::downgrade(w));
            let mut gone = prune(&mut g);
            gone.extend(g.trees.remove(&key(w)));
            gone
        };
        drop(gone);
    }

    /// `w` (re)joins: its dispatches are recorded again.
    pub(crate) fn revive(&self, w: &Worker) {
        let mut g = self.write();
        if !g.removed.is_empty() {
            g.removed.remove(&key(w));
        }
    }

    /// The worker at `url` (re)joins (the caller knows it by URL only).
    pub(crate) fn revive_url(&self, url: &str) {
        let mut g = self.write();
        if !g.removed.is_empty() {
            g.removed
                .retain(|_, r| r.upgrade().is_some_and(|w| w.url != url));
        }
    }

    /// Workers with a tree (removed ones have none).
    pub(crate) fn len(&self) -> usize {
        self.read().trees.len()
    }
}

/// Takes out the trees of workers nobody else holds any more (gone from the fleet, and from every
/// request): a safety net for a removal this book was not told about. The caller drops them
/// after releasing the lock.
fn prune(g: &mut Shards) -> Vec<Arc<Shard>> {
    let dead: Vec<usize> = g
        .trees
        .iter()
        .filter(|(_, s)| Arc::strong_count(&s._worker) == 1)
        .map(|(k, _)| *k)
        .collect();
    dead.iter().filter_map(|k| g.trees.remove(k)).collect()
}
