//! The router's belief about engines' caches: which (worker, rank) holds which KV block, fed by
//! the engines' KV-event streams, and the longest cached prefix of a request on each of them.
//!
//! * **Blocks.** A block hash names its whole prefix (the engine chains page hashes parent →
//!   child), so the index is one map from block hash to the sorted list of slots holding it; no
//!   tree is needed.
//! * **Nesting, kept by construction.** An engine cache only evicts leaves, so along a request's
//!   chain the engine's holders of block i+1 are a subset of its holders of block i. The index
//!   keeps that true of *its* holders even when it drops blocks (at the bound, the quota, or a
//!   block whose parent it never saw): a `BlockStored` is applied to a slot only from where its
//!   parent (`parent_block_hash`, then each previous hash of the event) is held by that slot or is
//!   the root; the rest of the event is skipped and counted ([`SlotStats::orphaned_blocks`]).
//!   Without that rule one dropped block leaves its children indexed under a hole, and the binary
//!   search below can land past the hole and overstate a match. `tests/kv_index_nesting.rs`
//!   checks the rule against every event order the protocol allows.
//! * **Matching.** Given nesting, along a request's chain the holders of block i+1 are a subset
//!   of the holders of block i. The deepest block any slot holds is found by
//!   binary search on the chain, and each slot's own depth by a binary search with a membership
//!   probe in that slot's own block set (small, so it stays in cache): O(slots · log blocks)
//!   lookups instead of O(slots · blocks), with no allocation once the caller's output buffer has
//!   grown. If lost events broke the nesting, the answer is a conservative estimate until the
//!   stream resyncs.
//! * **Two views of one fact, one of them the truth.** Each slot's block set says what the slot
//!   holds; the block → holders map says who may hold a block, and is only ever a superset. That
//!   is what lets a slot be cleared in O(1): its block set is swapped out ([`KvIndex::detach_slot`])
//!   and the holder entries it leaves behind are unlinked later in bounded steps
//!   ([`KvIndex::unlink_step`]), so the caller can release its lock between steps instead of
//!   holding it for O(blocks) work while every request's lookup waits. Until then a stale holder
//!   entry only costs a probe: every depth is checked against the slot's own set.
//! * **Tiers** ([`super::tier`]): a slot holds a block on the device, the host or both; the
//!   lookup answers each slot's depth on any tier and on the device
//!   ([`KvIndex::match_tiers_into`]). A device store needs its parent on the device, a host store
//!   its parent on any tier, which keeps both views nested.
//! * **Bounds.** At most `max_blocks` distinct blocks; a `BlockStored` past that is dropped and
//!   counted (`dropped_blocks`), and the slot is marked for resync, so memory never grows without
//!   bound and the loss is visible. And at most `quota` blocks per slot, so one worker rank cannot
//!   fill the index for everyone: a slot that would pass it is cleared and stops being indexed
//!   ([`SlotStats::over_quota`]) until it is released. It is not refilled and cleared again on
//!   every batch: that would be a resync loop costing O(quota) per batch.
//! * **Regret** ([`super::regret`]): per slot, the share of device evictions stored again within
//!   one pool turnover ([`KvIndex::regret`]); reset when the slot is cleared.
//!
//! Pure: no I/O, no clock. The cache book assigns slots, feeds decoded batches and runs the
//! unlinking between lock acquisitions.

use super::id_hash::{IdMap, IdSet};
use super::regret::Regret;
use super::tier::{SlotTiers, Tier, TierMatch};
use loadlink_wire::kv_events::KvEvent;
use smallvec::SmallVec;
use std::collections::{VecDeque, hash_set};

/// One (worker, DP rank) whose cache the index tracks.
pub type Slot = u32;

/// The block hasher (block hashes are already uniformly distributed ids).
pub use super::id_hash::IdHasher as BlockHasher;

type Holders = SmallVec<[Slot; 4]>;
type BlockSet = IdSet<i64>;

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
    /// The slot tried to hold more than the per-slot quota: it was cleared and is no longer
    /// indexed (its events are ignored) until it is released.
    pub over_quota: bool,
    /// Blocks of `BlockStored` events not applied because their parent was not held by the slot
    /// (dropped at the bound, or announced before this view began): applying them would break
    /// the nesting the lookup relies on.
    pub orphaned_blocks: u64,
    /// Of `blocks`, those on the device (filled when read).
    pub device_blocks: u64,
    /// Of `blocks`, those with a host-tier copy (filled when read).
    pub host_blocks: u64,
    /// A host copy had to be inferred after a partial view (see [`super::tier`]): the slot's
    /// lookups scan until it is cleared (filled when read).
    pub unnested: bool,
}

/// A cleared slot's former block set, whose holder entries are still to be unlinked.
#[derive(Debug)]
pub struct DetachedBlocks {
    slot: Slot,
    hashes: hash_set::IntoIter<i64>,
}

#[derive(Debug)]
pub struct KvIndex {
    blocks: IdMap<i64, Holders>,
    slots: Vec<SlotStats>,
    held: Vec<BlockSet>,
    /// Per slot, which held blocks have a host copy and which are off the device.
    tiers: Vec<SlotTiers>,
    /// Per slot, its eviction regret.
    regret: Vec<Regret>,
    /// Held blocks off the device, over all slots: 0 in a fleet without a host tier, which then
    /// skips the device pass of a lookup.
    off_device: usize,
    max_blocks: usize,
    quota: usize,
    dropped_blocks: u64,
    /// Cleared slots' block sets, oldest first, waiting for [`KvIndex::unlink_step`].
    detached: VecDeque<DetachedBlocks>,
    /// Slots that went over quota since [`KvIndex::take_over_quota`] was last called.
    newly_over_quota: Vec<Slot>,
}

impl KvIndex {
    /// An index of at most `max_blocks` distinct blocks, with no per-slot quota.
    pub fn new(max_blocks: usize) -> Self {
        KvIndex {
            blocks: IdMap::default(),
            slots: Vec::new(),
            held: Vec::new(),
            tiers: Vec::new(),
            regret: Vec::new(),
            off_device: 0,
            max_blocks,
            quota: usize::MAX,
            dropped_blocks: 0,
            detached: VecDeque::new(),
            newly_over_quota: Vec::new(),
        }
    }

    /// Sets the most blocks one slot may hold (see the module docs); applies to later stores.
    pub fn set_slot_quota(&mut self, quota: usize) {
        self.quota = quota.max(1);
    }

    /// The per-slot quota.
    pub fn slot_quota(&self) -> usize {
        self.quota
    }

    /// Distinct blocks with a holder entry (cleared slots' entries count until unlinked).
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
        let mut st = self.slots.get(slot as usize).copied().unwrap_or_default();
        let (host, off, unnested) = self.tiers.get(slot as usize).map_or((0, 0, false), |t| {
            (t.host.len(), t.off_device.len(), t.unnested)
        });
        st.host_blocks = host as u64;
        st.unnested = unnested;
        st.device_blocks = st.blocks.saturating_sub(off as u64);
        st
    }

    fn stats_mut(&mut self, slot: Slot) -> &mut SlotStats {
        let i = slot as usize;
        if self.slots.len() <= i {
            self.slots.resize(i + 1, SlotStats::default());
            self.held.resize_with(i + 1, BlockSet::default);
            self.tiers.resize_with(i + 1, SlotTiers::default);
            self.regret.resize_with(i + 1, Regret::default);
        }
        &mut self.slots[i]
    }

    /// Applies one event from `slot`'s stream (ignored, but counted, while it is over quota).
    pub fn apply(&mut self, slot: Slot, event: &KvEvent) {
        let over = self.stats_mut(slot).over_quota;
        match event {
            KvEvent::Stored(s) => {
                self.stats_mut(slot).stored_events += 1;
                if !over {
                    let tier = Tier::of_medium(s.medium.as_deref());
                    self.store_chain(slot, tier, s.parent_block_hash, &s.block_hashes);
                }
            }
            KvEvent::Removed(r) => {
                self.stats_mut(slot).removed_events += 1;
                let tier = Tier::of_medium(r.medium.as_deref());
                for &h in r.block_hashes.iter().take_while(|_| !over) {
                    self.remove(slot, tier, h);
                }
            }
            KvEvent::AllCleared => self.clear_slot(slot),
        }
    }

    /// Stores the pages of one `BlockStored` on `tier` for `slot`, each only while its parent is
    /// held there (see the module docs); counts what is skipped.
    fn store_chain(&mut self, slot: Slot, tier: Tier, parent: Option<i64>, hashes: &[i64]) {
        let mut parent = parent;
        for (i, &h) in hashes.iter().enumerate() {
            if parent.is_some_and(|p| !self.holds_for_child(slot, tier, p)) {
                self.stats_mut(slot).orphaned_blocks += (hashes.len() - i) as u64;
                return;
            }
            if !self.store(slot, tier, parent, h) {
                return;
            }
            parent = Some(h);
        }
    }

    /// Whether `slot` holds `parent` where a child stored on `tier` needs it: on the device for
    /// a device store, on any tier for a host store.
    fn holds_for_child(&self, slot: Slot, tier: Tier, parent: i64) -> bool {
        let i = slot as usize;
        self.held[i].contains(&parent)
            && (tier == Tier::Host || !self.tiers[i].off_device.contains(&parent))
    }

    /// Stores `hash` on `tier` for `slot`; false when the slot just went over quota (stop
    /// storing).
    fn store(&mut self, slot: Slot, tier: Tier, parent: Option<i64>, hash: i64) -> bool {
        let i = slot as usize;
        if self.held[i].contains(&hash) {
            let t = &mut self.tiers[i];
            match tier {
                Tier::Device if t.clear_off_device(hash) => {
                    self.off_device -= 1;
                    self.regret[i].stored(hash); // loaded back onto the device
                }
                Tier::Device => {}
                Tier::Host => {
                    t.host.entry(hash).or_insert(parent);
                }
            }
            return true;
        }
        if self.held[slot as usize].len() >= self.quota {
            self.go_over_quota(slot);
            return false;
        }
        let full = self.blocks.len() >= self.max_blocks;
        let holders = match self.blocks.get_mut(&hash) {
            Some(h) => h,
            None if full => {
                self.dropped_blocks += 1;
                self.stats_mut(slot).needs_resync = true;
                return true;
            }
            None => self.blocks.entry(hash).or_default(),
        };
        if let Err(at) = holders.binary_search(&slot) {
            holders.insert(at, slot);
        }
        self.held[i].insert(hash);
        if tier == Tier::Host {
            self.tiers[i].host.insert(hash, parent);
            self.tiers[i].set_off_device(hash);
            self.off_device += 1;
        } else {
            self.regret[i].stored(hash);
            self.regret[i].held(self.held[i].len() - self.tiers[i].off_device.len());
        }
        self.stats_mut(slot).blocks += 1;
        true
    }

    /// Removes `hash`'s copy on `tier` from `slot`; the block is gone once no tier holds it.
    fn remove(&mut self, slot: Slot, tier: Tier, hash: i64) {
        let i = slot as usize;
        if !self.held[i].contains(&hash) {
            return;
        }
        let t = &mut self.tiers[i];
        let gone = match tier {
            Tier::Device if t.off_device.contains(&hash) => return,
            Tier::Device if t.host.contains_key(&hash) || t.host_only_children(hash) > 0 => {
                // Demoted; or a host copy the view missed, which the host-only children prove
                // (see `tier.rs`).
                if let std::collections::hash_map::Entry::Vacant(v) = t.host.entry(hash) {
                    v.insert(None);
                    t.unnested = true;
                    self.stats_mut(slot).needs_resync = true;
                }
                self.tiers[i].set_off_device(hash);
                self.off_device += 1;
                self.regret[i].removed(hash); // off the device pool, kept on the host
                return;
            }
            Tier::Device => true,
            Tier::Host if !t.host.contains_key(&hash) => return,
            Tier::Host => {
                let host_only = t.clear_off_device(hash);
                t.host.remove(&hash);
                if host_only {
                    self.off_device -= 1;
                    // Only a stale view holds host-only children of an evicted host leaf.
                    if t.host_only_children(hash) > 0 {
                        t.unnested = true;
                        self.stats_mut(slot).needs_resync = true;
                    }
                }
                host_only
            }
        };
        if !gone {
            return;
        }
        if tier == Tier::Device {
            self.regret[i].removed(hash);
        }
        self.held[i].remove(&hash);
        unlink(&mut self.blocks, slot, hash);
        let st = self.stats_mut(slot);
        st.blocks = st.blocks.saturating_sub(1);
    }

    fn go_over_quota(&mut self, slot: Slot) {
        self.detach_slot(slot);
        self.stats_mut(slot).over_quota = true;
        self.newly_over_quota.push(slot);
    }

    /// The slots that went over quota since the last call (usually none; no allocation then).
    pub fn take_over_quota(&mut self) -> Vec<Slot> {
        std::mem::take(&mut self.newly_over_quota)
    }

    /// Forgets everything `slot` held in O(1): its block set is swapped out and queued for
    /// [`KvIndex::unlink_step`]. Lookups see the slot empty at once. Counts a clear; keeps
    /// `over_quota` (a cleared slot over quota stays unindexed).
    pub fn detach_slot(&mut self, slot: Slot) {
        let st = self.stats_mut(slot);
        st.blocks = 0;
        st.clears += 1;
        st.needs_resync = false;
        let set = std::mem::take(&mut self.held[slot as usize]);
        // The tier tables only name held blocks and hold plain integers: dropping them is one
        // free each.
        let tiers = std::mem::take(&mut self.tiers[slot as usize]);
        self.off_device -= tiers.off_device.len();
        self.regret[slot as usize] = Regret::default();
        if !set.is_empty() {
            self.detached.push_back(DetachedBlocks {
                slot,
                hashes: set.into_iter(),
            });
        }
    }

    /// Detaches `slot` and forgets its history (counters, quota state): it may be given to another
    /// stream.
    pub fn release_slot(&mut self, slot: Slot) {
        self.detach_slot(slot);
        self.slots[slot as usize] = SlotStats::default();
    }

    /// Unlinks up to `budget` holder entries left by detached slots; block sets used up are moved
    /// to `spent` (for the caller to drop after releasing its lock: freeing a large table is not
    /// free either). Returns whether work remains.
    pub fn unlink_step(&mut self, budget: usize, spent: &mut Vec<DetachedBlocks>) -> bool {
        let mut left = budget;
        while left > 0 {
            let Some(d) = self.detached.front_mut() else {
                break;
            };
            let n = left.min(d.hashes.len());
            let own = &self.held[d.slot as usize];
            for h in d.hashes.by_ref().take(n) {
                // Stored again since the clear (or by the slot's next owner): still held.
                if !own.contains(&h) {
                    unlink(&mut self.blocks, d.slot, h);
                }
            }
            left -= n;
            if d.hashes.len() == 0 {
                spent.extend(self.detached.pop_front());
            }
        }
        !self.detached.is_empty()
    }

    /// Holder entries of detached slots still to be unlinked.
    pub fn pending_unlinks(&self) -> usize {
        self.detached.iter().map(|d| d.hashes.len()).sum()
    }

    /// Forgets everything `slot` held, unlinking at once: O(the slot's blocks). For callers
    /// without a lock to release (the simulator); the book uses `detach_slot` + `unlink_step`.
    pub fn clear_slot(&mut self, slot: Slot) {
        self.detach_slot(slot);
        let mut spent = Vec::new();
        while self.unlink_step(usize::MAX, &mut spent) {}
    }

    /// Marks `slot`'s view as incomplete (its stream had a gap that replay could not fill).
    pub fn mark_stale(&mut self, slot: Slot) {
        self.stats_mut(slot).needs_resync = true;
    }

    /// The blocks `slot` holds on any tier, in no order (tests compare them with an engine's own
    /// cache).
    pub fn slot_blocks(&self, slot: Slot) -> impl Iterator<Item = i64> + '_ {
        self.held.get(slot as usize).into_iter().flatten().copied()
    }

    /// The blocks `slot` holds on `tier`, in no order.
    pub fn slot_blocks_on(&self, slot: Slot, tier: Tier) -> Vec<i64> {
        let (Some(held), Some(t)) = (self.held.get(slot as usize), self.tiers.get(slot as usize))
        else {
            return Vec::new();
        };
        match tier {
            Tier::Device => held
                .iter()
                .filter(|h| !t.off_device.contains(h))
                .copied()
                .collect(),
            Tier::Host => t.host.keys().copied().collect(),
        }
    }

    /// Blocks held on `tier`, summed over the slots (a block held by two slots counts twice).
    pub fn tier_blocks(&self, tier: Tier) -> u64 {
        (0..self.slots.len() as Slot)
            .map(|s| {
                let st = self.slot_stats(s);
                match tier {
                    Tier::Device => st.device_blocks,
                    Tier::Host => st.host_blocks,
                }
            })
            .sum()
    }

    /// Held blocks on a host tier only, over all slots.
    pub fn off_device_blocks(&self) -> usize {
        self.off_device
    }

    /// `slot`'s eviction regret, 0–1 ([`super::regret`]; 0 for a slot never seen).
    #[inline]
    pub fn regret(&self, slot: Slot) -> f64 {
        self.regret.get(slot as usize).map_or(0.0, Regret::regret)
    }

    /// `slot`'s regret tracker (its bound and what it remembers, for tests and reports).
    pub fn regret_tracker(&self, slot: Slot) -> Option<&Regret> {
        self.regret.get(slot as usize)
    }

    /// The bound on distinct blocks.
    pub fn max_blocks(&self) -> usize {
        self.max_blocks
    }
}

/// Removes `slot` from `hash`'s holders, and the entry when it was the last.
fn unlink(blocks: &mut IdMap<i64, Holders>, slot: Slot, hash: i64) {
    let Some(holders) = blocks.get_mut(&hash) else {
        return;
    };
    if let Ok(at) = holders.binary_search(&slot) {
        holders.remove(at);
    }
    if holders.is_empty() {
        blocks.remove(&hash);
    }
}

mod matching;

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
