//! The approximate cache view for workers that publish no KV events: what this router sent to
//! each worker, as SGLang's `cache_aware` router keeps it, but keyed by the request's page-hash
//! chain (the chain the engine and [`super::KvIndex`] use), so both answer "how many leading
//! blocks of this chain does slot s hold" in the same shape ([`ApproxTree::match_into`]).
//!
//! * **A chain is a tree.** A block hash names its whole prefix, so one map per slot from block
//!   hash to its last use is the radix tree of what was sent there; no node structure is needed.
//! * **Recording** a dispatched chain stamps every block of it with `now`: a prefix is then never
//!   older than any of its extensions.
//! * **Eviction** is least-recently-used by (stamp, deeper first): with the invariant above the
//!   oldest entry is always a leaf, so **a prefix is evicted no earlier than its extensions**, and
//!   a slot's blocks stay nested along every chain (what `match_into`'s binary search needs).
//! * **Bounds**: at most `max_blocks` per slot (the engine's cache cannot hold more either) and a
//!   time-to-live: blocks unused for `ttl_ms` are gone (the engine has likely evicted them).
//!
//! Pure: no I/O, no clock (callers pass `now_ms`).

use super::id_hash::IdBuild;
use super::index::Slot;
use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

/// One recorded block: when it was last sent and how deep in its chain it sits.
#[derive(Debug, Clone, Copy)]
struct Stamp {
    last_ms: u64,
    depth: u32,
}

/// Eviction order: oldest first, deeper first among equals.
type Order = (u64, Reverse<u32>, i64);

#[derive(Debug, Default)]
struct SlotTree {
    blocks: HashMap<i64, Stamp, IdBuild>,
    lru: BTreeSet<Order>,
}

impl SlotTree {
    fn touch(&mut self, hash: i64, depth: u32, now_ms: u64) {
        let stamp = Stamp {
            last_ms: now_ms,
            depth,
        };
        if let Some(old) = self.blocks.insert(hash, stamp) {
            self.lru.remove(&(old.last_ms, Reverse(old.depth), hash));
        }
        self.lru.insert((now_ms, Reverse(depth), hash));
    }

    /// Evicts the oldest entries while `over` says so; returns how many went.
    fn evict_while(&mut self, mut over: impl FnMut(&Self, u64) -> bool) -> u64 {
        let mut n = 0;
        while let Some(&first) = self.lru.first() {
            if !over(self, first.0) {
                break;
            }
            self.lru.pop_first();
            self.blocks.remove(&first.2);
            n += 1;
        }
        n
    }
}

/// Per-slot figures for `/workers`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApproxStats {
    pub blocks: u64,
    pub recorded_chains: u64,
    pub evicted_blocks: u64,
}

/// What this router sent to each slot, bounded by size and age.
#[derive(Debug)]
pub struct ApproxTree {
    slots: Vec<SlotTree>,
    stats: Vec<ApproxStats>,
    max_blocks: usize,
    ttl_ms: u64,
}

impl ApproxTree {
    /// At most `max_blocks` blocks per slot, each forgotten `ttl_ms` after it was last sent.
    pub fn new(max_blocks: usize, ttl_ms: u64) -> Self {
        ApproxTree {
            slots: Vec::new(),
            stats: Vec::new(),
            max_blocks: max_blocks.max(1),
            ttl_ms,
        }
    }

    fn slot_mut(&mut self, slot: Slot) -> &mut SlotTree {
        let i = slot as usize;
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, SlotTree::default);
            self.stats.resize(i + 1, ApproxStats::default());
        }
        &mut self.slots[i]
    }

    /// Records that `chain` was sent to `slot` at `now_ms`, then applies the bounds there.
    pub fn record(&mut self, slot: Slot, chain: &[i64], now_ms: u64) {
        let (max, ttl) = (self.max_blocks, self.ttl_ms);
        let tree = self.slot_mut(slot);
        for (depth, &h) in chain.iter().enumerate() {
            tree.touch(h, depth as u32, now_ms);
        }
        let cutoff = now_ms.saturating_sub(ttl);
        let evicted = tree.evict_while(|t, oldest| t.blocks.len() > max || oldest < cutoff);
        let blocks = tree.blocks.len() as u64;
        let st = &mut self.stats[slot as usize];
        st.recorded_chains += 1;
        st.evicted_blocks += evicted;
        st.blocks = blocks;
    }

    /// Forgets blocks of every slot unused since `now_ms - ttl_ms`. `record` does it for its own
    /// slot only, so callers call this before reading matches or sizes (cheap: one look at each
    /// slot's oldest block when nothing expires); otherwise a worker that stopped receiving
    /// traffic keeps its old blocks, and its size, for ever.
    pub fn expire(&mut self, now_ms: u64) {
        let cutoff = now_ms.saturating_sub(self.ttl_ms);
        for (tree, st) in self.slots.iter_mut().zip(&mut self.stats) {
            st.evicted_blocks += tree.evict_while(|_, oldest| oldest < cutoff);
            st.blocks = tree.blocks.len() as u64;
        }
    }

    /// Forgets everything sent to `slot` (a removed or restarted worker).
    pub fn clear_slot(&mut self, slot: Slot) {
        let tree = self.slot_mut(slot);
        tree.blocks.clear();
        tree.lru.clear();
        self.stats[slot as usize].blocks = 0;
    }

    pub fn slot_stats(&self, slot: Slot) -> ApproxStats {
        self.stats.get(slot as usize).copied().unwrap_or_default()
    }

    /// Blocks held over all slots.
    pub fn len(&self) -> usize {
        self.slots.iter().map(|t| t.blocks.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.iter().all(|t| t.blocks.is_empty())
    }

    /// How many leading blocks of `chain` `slot` holds.
    pub fn slot_depth(&self, slot: Slot, chain: &[i64]) -> u32 {
        let Some(tree) = self.slots.get(slot as usize) else {
            return 0;
        };
        chain.partition_point(|h| tree.blocks.contains_key(h)) as u32
    }

    /// For each slot holding at least the first block of `chain`: how many leading blocks it
    /// holds, written to `out` (cleared first; its capacity is reused). Same shape as
    /// [`super::KvIndex::match_into`].
    pub fn match_into(&self, chain: &[i64], out: &mut Vec<(Slot, u32)>) {
        out.clear();
        let Some(first) = chain.first() else {
            return;
        };
        for (slot, tree) in self.slots.iter().enumerate() {
            if !tree.blocks.contains_key(first) {
                continue;
            }
            let held = chain.partition_point(|h| tree.blocks.contains_key(h));
            out.push((slot as Slot, held as u32));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(t: &ApproxTree, chain: &[i64]) -> Vec<(Slot, u32)> {
        let mut out = Vec::new();
        t.match_into(chain, &mut out);
        out
    }

    #[test]
    fn records_per_slot_and_matches_the_longest_prefix() {
        let mut t = ApproxTree::new(100, 60_000);
        t.record(0, &[1, 2, 3, 4], 10);
        t.record(2, &[1, 2], 10);
        t.record(1, &[9, 8], 10);
        assert_eq!(matches(&t, &[1, 2, 3, 7]), vec![(0, 3), (2, 2)]);
        assert_eq!(
            matches(&t, &[7, 1]),
            vec![],
            "a chain's first block is its root"
        );
        assert_eq!(matches(&t, &[]), vec![]);
        assert_eq!(t.slot_stats(0).blocks, 4);
        assert_eq!(t.len(), 8);
    }

    #[test]
    fn the_size_bound_evicts_least_recent_leaves_first() {
        let mut t = ApproxTree::new(5, 60_000);
        t.record(0, &[1, 2, 3], 10); // an old conversation
        t.record(0, &[1, 4], 20); // a newer one sharing block 1
        assert_eq!(t.slot_stats(0).blocks, 4);
        t.record(0, &[7, 8], 30); // over the bound by one: block 3 (oldest leaf) goes
        assert_eq!(matches(&t, &[1, 2, 3]), vec![(0, 2)]);
        t.record(0, &[9], 40); // next oldest: 2 (block 1 was touched at 20)
        assert_eq!(matches(&t, &[1, 2, 3]), vec![(0, 1)]);
        assert_eq!(matches(&t, &[1, 4]), vec![(0, 2)]);
        assert_eq!(t.slot_stats(0).evicted_blocks, 2);
    }

    #[test]
    fn a_prefix_outlives_its_extensions_even_when_stamped_together() {
        // One chain recorded at one instant: equal stamps, so depth decides (deepest first).
        let mut t = ApproxTree::new(3, 60_000);
        t.record(0, &[1, 2, 3, 4, 5], 10);
        assert_eq!(matches(&t, &[1, 2, 3, 4, 5]), vec![(0, 3)]);
        t.record(1, &[5], 10);
        assert_eq!(matches(&t, &[5]), vec![(1, 1)], "slots are bounded apart");
    }

    #[test]
    fn blocks_expire_after_the_ttl_and_slots_clear() {
        let mut t = ApproxTree::new(100, 1_000);
        t.record(0, &[1, 2], 0);
        t.record(0, &[1, 3], 800);
        t.expire(1_500);
        assert_eq!(
            matches(&t, &[1, 2]),
            vec![(0, 1)],
            "2 expired; 1 was reused at 800"
        );
        t.expire(2_000);
        assert!(t.is_empty());
        assert_eq!((t.slot_depth(0, &[1, 2]), t.slot_depth(9, &[1])), (0, 0));
        t.record(3, &[4], 2_000);
        assert_eq!(t.slot_depth(3, &[4, 5]), 1);
        t.clear_slot(3);
        assert!(t.is_empty() && t.slot_stats(3).blocks == 0);
    }
}
