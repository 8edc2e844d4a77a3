//! The router's belief about engines' caches: which (worker, rank) holds which KV block, fed by
//! the engines' KV-event streams, and the longest cached prefix of a request on each of them.
//!
//! * **Blocks.** A block hash names its whole prefix (the engine chains page hashes parent →
//!   child), so the index is one map from block hash to the sorted list of slots holding it; no
//!   tree is needed.
//! * **Matching.** An engine cache only evicts leaves, so along a request's chain the holders of
//!   block i+1 are a subset of the holders of block i. The deepest block any slot holds is found by
//!   binary search on the chain, and each slot's own depth by a binary search with a membership
//!   probe in that slot's own block set (small, so it stays in cache): O(slots · log blocks)
//!   lookups instead of O(slots · blocks), with no allocation once the caller's output buffer has
//!   grown. If lost events broke the nesting, the answer is a conservative estimate until the
//!   stream resyncs.
//! * **Two views of one fact.** The block → holders map answers "who holds this block"; each
//!   slot's block set answers "does this slot hold it" and makes clearing a slot O(its blocks).
//!   Both change together in `store`/`remove`, nowhere else.
//! * **Bounds.** At most `max_blocks` distinct blocks; a `BlockStored` past that is dropped and
//!   counted (`dropped_blocks`), and the slot is marked for resync, so memory never grows without
//!   bound and the loss is visible.
//!
//! Pure: no I/O, no clock. The subscription layer assigns slots and feeds decoded batches.

use loadlink_wire::kv_events::KvEvent;
use smallvec::SmallVec;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// One (worker, DP rank) whose cache the index tracks.
pub type Slot = u32;

/// Block hashes are already uniformly distributed 64-bit ids (prefixes of SHA-256): hashing them
/// again would only cost time. One multiply spreads the bits the table uses.
#[derive(Default)]
pub struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_i64(&mut self, v: i64) {
        self.0 = (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Holders = SmallVec<[Slot; 4]>;
type BlockSet = HashSet<i64, BuildHasherDefault<BlockHasher>>;

/// Per-slot figures for `/workers` and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotStats {
    pub blocks: u64,
    pub stored_events: u64,
    pub removed_events: u64,
    pub clears: u64,
    /// A block of this slot was dropped at the bound, or its stream lost events: the slot's view
    /// is incomplete until it resyncs.
    pub needs_resync: bool,
}

#[derive(Debug)]
pub struct KvIndex {
    blocks: HashMap<i64, Holders, BuildHasherDefault<BlockHasher>>,
    slots: Vec<SlotStats>,
    held: Vec<BlockSet>,
    max_blocks: usize,
    dropped_blocks: u64,
}

impl KvIndex {
    pub fn new(max_blocks: usize) -> Self {
        KvIndex {
            blocks: HashMap::default(),
            slots: Vec::new(),
            held: Vec::new(),
            max_blocks,
            dropped_blocks: 0,
        }
    }

    /// Distinct blocks held by any slot.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Blocks refused at the bound since start.
    pub fn dropped_blocks(&self) -> u64 {
        self.dropped_blocks
    }

    pub fn slot_stats(&self, slot: Slot) -> SlotStats {
        self.slots.get(slot as usize).copied().unwrap_or_default()
    }

    fn stats_mut(&mut self, slot: Slot) -> &mut SlotStats {
        let i = slot as usize;
        if self.slots.len() <= i {
            self.slots.resize(i + 1, SlotStats::default());
            self.held.resize_with(i + 1, BlockSet::default);
        }
        &mut self.slots[i]
    }

    /// Applies one event from `slot`'s stream.
    pub fn apply(&mut self, slot: Slot, event: &KvEvent) {
        match event {
            KvEvent::Stored(s) => {
                self.stats_mut(slot).stored_events += 1;
                for &h in &s.block_hashes {
                    self.store(slot, h);
                }
            }
            KvEvent::Removed(r) => {
                self.stats_mut(slot).removed_events += 1;
                for &h in &r.block_hashes {
                    self.remove(slot, h);
                }
            }
            KvEvent::AllCleared => self.clear_slot(slot),
        }
    }

    fn store(&mut self, slot: Slot, hash: i64) {
        let full = self.blocks.len() >= self.max_blocks;
        let holders = match self.blocks.get_mut(&hash) {
            Some(h) => h,
            None if full => {
                self.dropped_blocks += 1;
                self.stats_mut(slot).needs_resync = true;
                return;
            }
            None => self.blocks.entry(hash).or_default(),
        };
        if let Err(at) = holders.binary_search(&slot) {
            holders.insert(at, slot);
            self.stats_mut(slot).blocks += 1;
            self.held[slot as usize].insert(hash);
        }
    }

    fn remove(&mut self, slot: Slot, hash: i64) {
        let Some(holders) = self.blocks.get_mut(&hash) else {
            return;
        };
        if let Ok(at) = holders.binary_search(&slot) {
            holders.remove(at);
            let st = self.stats_mut(slot);
            st.blocks = st.blocks.saturating_sub(1);
            self.held[slot as usize].remove(&hash);
        }
        if self.blocks.get(&hash).is_some_and(SmallVec::is_empty) {
            self.blocks.remove(&hash);
        }
    }

    /// Forgets everything `slot` held: `AllBlocksCleared`, an engine restart, a removed worker, or
    /// the start of a resync. O(the slot's blocks).
    pub fn clear_slot(&mut self, slot: Slot) {
        self.stats_mut(slot);
        for hash in std::mem::take(&mut self.held[slot as usize]) {
            if let Some(holders) = self.blocks.get_mut(&hash) {
                if let Ok(at) = holders.binary_search(&slot) {
                    holders.remove(at);
                }
                if holders.is_empty() {
                    self.blocks.remove(&hash);
                }
            }
        }
        let st = self.stats_mut(slot);
        st.blocks = 0;
        st.clears += 1;
        st.needs_resync = false;
    }

    /// Marks `slot`'s view as incomplete (its stream had a gap that replay could not fill).
    pub fn mark_stale(&mut self, slot: Slot) {
        self.stats_mut(slot).needs_resync = true;
    }

    /// The blocks `slot` holds, in no order (tests compare them with an engine's own cache).
    pub fn slot_blocks(&self, slot: Slot) -> impl Iterator<Item = i64> + '_ {
        self.held.get(slot as usize).into_iter().flatten().copied()
    }

    /// The bound on distinct blocks.
    pub fn max_blocks(&self) -> usize {
        self.max_blocks
    }

    fn holds(&self, slot: Slot, hash: i64) -> bool {
        self.held
            .get(slot as usize)
            .is_some_and(|set| set.contains(&hash))
    }

    /// Number of leading blocks of `chain` held by anyone (the deepest shared depth).
    fn any_depth(&self, chain: &[i64]) -> usize {
        // First index with no holder, assuming nested holders along the chain.
        chain.partition_point(|h| self.blocks.contains_key(h))
    }

    /// For each slot holding at least the first block of `chain`: how many leading blocks it
    /// holds, written to `out` (cleared first; its capacity is reused).
    pub fn match_into(&self, chain: &[i64], out: &mut Vec<(Slot, u32)>) {
        out.clear();
        let depth = self.any_depth(chain);
        let Some(first) = chain.first().filter(|_| depth > 0) else {
            return;
        };
        let Some(candidates) = self.blocks.get(first) else {
            return;
        };
        let prefix = &chain[..depth];
        for &slot in candidates {
            let held = prefix.partition_point(|&h| self.holds(slot, h));
            out.push((slot, held as u32));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loadlink_wire::kv_events::{BlockRemoved, BlockStored};

    fn stored(hashes: &[i64]) -> KvEvent {
        KvEvent::Stored(BlockStored {
            block_hashes: hashes.to_vec(),
            block_size: 16,
            ..Default::default()
        })
    }

    fn removed(hashes: &[i64]) -> KvEvent {
        KvEvent::Removed(BlockRemoved {
            block_hashes: hashes.to_vec(),
            medium: None,
        })
    }

    #[test]
    fn longest_prefix_per_slot() {
        let mut ix = KvIndex::new(1000);
        ix.apply(0, &stored(&[1, 2, 3, 4]));
        ix.apply(1, &stored(&[1, 2]));
        ix.apply(2, &stored(&[9]));
        let mut out = Vec::new();
        ix.match_into(&[1, 2, 3, 5, 6], &mut out);
        out.sort();
        assert_eq!(out, vec![(0, 3), (1, 2)]);
        ix.match_into(&[7, 1], &mut out);
        assert!(out.is_empty(), "a chain's first block is its root");
        ix.apply(0, &removed(&[4, 3]));
        ix.match_into(&[1, 2, 3], &mut out);
        out.sort();
        assert_eq!(out, vec![(0, 2), (1, 2)]);
        assert_eq!(ix.slot_stats(0).blocks, 2);
    }

    #[test]
    fn clear_forgets_one_slot_only_and_the_bound_is_counted() {
        let mut ix = KvIndex::new(3);
        ix.apply(0, &stored(&[1, 2]));
        ix.apply(1, &stored(&[1, 3]));
        assert_eq!(ix.len(), 3);
        ix.apply(1, &stored(&[4]));
        assert_eq!(ix.dropped_blocks(), 1);
        assert!(ix.slot_stats(1).needs_resync);
        ix.apply(0, &KvEvent::AllCleared);
        assert_eq!(ix.len(), 2);
        let mut out = Vec::new();
        ix.match_into(&[1, 3], &mut out);
        assert_eq!(out, vec![(1, 2)]);
        assert_eq!(ix.slot_stats(0).blocks, 0);
    }
}
