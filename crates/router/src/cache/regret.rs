//! Eviction regret of one index slot (one engine rank's device cache): the share of what its pool
//! evicted that was stored again within one pool turnover.
//!
//! Why: placing a request's uncached tokens on a full pool evicts someone's cached prefix. That
//! costs something only if the prefix is needed again before it would have aged out anyway. A
//! pool whose evictions come back (multi-turn sessions, shared system prompts under pressure) is
//! one where pollution is expensive; a pool of unique prompts evicts what nobody wants (regret 0).
//! The KV events already say both halves: `BlockRemoved` is the eviction, a later `BlockStored`
//! of the same hash is the recompute it caused.
//!
//! How: a FIFO of recently evicted block hashes with a map for membership, bounded by the slot's
//! peak block count (the pool as the index has seen it: one turnover, no constant). An eviction
//! is pushed (the oldest falls out past the bound); a store of a hash still remembered counts one
//! *restore* and forgets it (a block is regretted once per eviction). Both counts decay by
//! `1 − 1/bound` per eviction, so the ratio follows the last turnover or so:
//! `regret = restored / removed`, in [0, 1].
//!
//! Updated on KV events only (under the index's write lock); a pick reads one number.

use super::id_hash::IdMap;
use std::collections::VecDeque;

/// One slot's regret tracker.
#[derive(Debug, Default)]
pub struct Regret {
    /// Evicted hashes, oldest first, with the eviction's number (to tell a hash evicted twice).
    fifo: VecDeque<(i64, u64)>,
    /// Hashes in `fifo` not restored since, with their latest eviction's number.
    remembered: IdMap<i64, u64>,
    evictions: u64,
    /// The most blocks the slot held at once: the FIFO's bound.
    peak: usize,
    /// Decayed counts of evictions and restores.
    removed: f64,
    restored: f64,
}

impl Regret {
    /// The slot now holds `held` blocks (after a store): the bound follows its peak.
    pub fn held(&mut self, held: usize) {
        self.peak = self.peak.max(held);
    }

    /// The slot's pool evicted `hash`.
    pub fn removed(&mut self, hash: i64) {
        let bound = self.peak.max(1);
        let keep = 1.0 - 1.0 / bound as f64;
        self.removed = self.removed * keep + 1.0;
        self.restored *= keep;
        self.evictions += 1;
        self.fifo.push_back((hash, self.evictions));
        self.remembered.insert(hash, self.evictions);
        while self.fifo.len() > bound {
            if let Some((old, n)) = self.fifo.pop_front()
                && self.remembered.get(&old) == Some(&n)
            {
                self.remembered.remove(&old);
            }
        }
    }

    /// The slot stored `hash` (newly held on the device): a restore if it was evicted lately.
    pub fn stored(&mut self, hash: i64) {
        if self.remembered.remove(&hash).is_some() {
            self.restored += 1.0;
        }
    }

    /// restored ÷ removed over about the last turnover, 0–1 (0 before any eviction).
    pub fn regret(&self) -> f64 {
        if self.removed > 0.0 {
            (self.restored / self.removed).min(1.0)
        } else {
            0.0
        }
    }

    /// Entries in the FIFO (at most the peak block count).
    pub fn remembered(&self) -> usize {
        self.fifo.len()
    }

    /// The FIFO's bound: the most blocks the slot held at once.
    pub fn bound(&self) -> usize {
        self.peak
    }
}
