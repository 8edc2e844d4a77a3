//! The KV index's nesting invariant under every event order the protocol allows.
//!
//! `KvIndex::match_into` binary-searches a request's chain, which is only exact while the index's
//! holders are nested (a slot holding block i+1 of a chain holds block i). Engines keep that true
//! of their own caches (they store children under held parents and evict leaves), but the index
//! also drops blocks of its own: at the fleet-wide bound, at a slot's quota, on a resync. This
//! test drives the index with random event sequences of engines that follow the protocol: stores
//! chaining onto held parents, removals of leaves, clears, resyncs and releases, with the bound
//! and the quota small enough to be hit often. After every step it checks, per slot: every held
//! block's parent is held (or it is a root), the index holds nothing its engine does not, the
//! per-slot count is right, and the lookup's depth for every chain of the block forest equals a
//! brute-force scan of the slot's blocks.

use loadlink_router::cache::KvIndex;
use loadlink_wire::kv_events::{BlockRemoved, BlockStored, KvEvent};
use proptest::prelude::*;
use std::collections::BTreeSet;

/// Blocks in the forest the engines draw their caches from.
const NODES: usize = 32;
/// Slots (worker ranks) fed at once.
const SLOTS: usize = 3;

fn hash(node: usize) -> i64 {
    // Spread like real block hashes, negative ones included.
    (node as i64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_u64 as i64)
}

/// A block forest: each block's parent, `None` at a root. Block hashes name their prefix, so a
/// block has one parent wherever it is cached.
#[derive(Debug, Clone)]
struct Forest {
    parent: Vec<Option<usize>>,
}

impl Forest {
    fn new(picks: &[u8]) -> Self {
        let parent = (0..NODES)
            .map(|k| {
                let p = picks[k] as usize;
                (k >= 2 && !p.is_multiple_of(6)).then(|| p % k)
            })
            .collect();
        Forest { parent }
    }

    fn children(&self, node: usize) -> impl Iterator<Item = usize> + '_ {
        (0..NODES).filter(move |&c| self.parent[c] == Some(node))
    }

    /// The chain of block hashes from the root down to `node`.
    fn chain(&self, node: usize) -> Vec<i64> {
        let mut path = vec![node];
        while let Some(p) = self.parent[*path.last().unwrap()] {
            path.push(p);
        }
        path.iter().rev().map(|&n| hash(n)).collect()
    }
}

/// One step, drawn as numbers and interpreted against the engines' current caches so that every
/// step is one the protocol allows.
#[derive(Debug, Clone)]
enum Step {
    /// A `BlockStored` of up to `len` pages going down from a block whose parent is cached.
    Store {
        slot: usize,
        pick: usize,
        len: usize,
    },
    /// A `BlockRemoved` of up to `count` leaves, one after another.
    Remove {
        slot: usize,
        pick: usize,
        count: usize,
    },
    /// `AllBlocksCleared`.
    Clear { slot: usize },
    /// The book clears the slot to rebuild it (a gap, a restart): the engine keeps its cache.
    Resync { slot: usize },
    /// The slot is released and given to a fresh stream (a new engine, empty).
    Release { slot: usize },
    /// One bounded step of unlinking cleared slots' holder entries.
    Unlink { budget: usize },
}

fn step() -> impl Strategy<Value = Step> {
    let slot = 0..SLOTS;
    prop_oneof![
        6 => (slot.clone(), any::<usize>(), 1..5usize)
            .prop_map(|(slot, pick, len)| Step::Store { slot, pick, len }),
        3 => (slot.clone(), any::<usize>(), 1..4usize)
            .prop_map(|(slot, pick, count)| Step::Remove { slot, pick, count }),
        1 => slot.clone().prop_map(|slot| Step::Clear { slot }),
        1 => slot.clone().prop_map(|slot| Step::Resync { slot }),
        1 => slot.prop_map(|slot| Step::Release { slot }),
        2 => (1..6usize).prop_map(|budget| Step::Unlink { budget }),
    ]
}

/// The engines' own caches (the truth the index follows) and the index.
struct World {
    forest: Forest,
    engines: Vec<BTreeSet<usize>>,
    ix: KvIndex,
}

impl World {
    fn pick<T: Copy>(items: &[T], pick: usize) -> Option<T> {
        (!items.is_empty()).then(|| items[pick % items.len()])
    }

    /// Applies `step` to the engine it names and returns the event that engine publishes.
    fn run(&mut self, step: &Step) {
        match *step {
            Step::Store { slot, pick, len } => {
                let cache = &self.engines[slot];
                let starts: Vec<usize> = (0..NODES)
                    .filter(|n| !cache.contains(n))
                    .filter(|n| self.forest.parent[*n].is_none_or(|p| cache.contains(&p)))
                    .collect();
                let Some(start) = Self::pick(&starts, pick) else {
                    return;
                };
                let mut pages = vec![start];
                while pages.len() < len {
                    let kids: Vec<usize> = self.forest.children(*pages.last().unwrap()).collect();
                    match Self::pick(&kids, pick / 7 + pages.len()) {
                        Some(k) => pages.push(k),
                        None => break,
                    }
                }
                self.engines[slot].extend(&pages);
                let event = KvEvent::Stored(BlockStored {
                    block_hashes: pages.iter().map(|&n| hash(n)).collect(),
                    parent_block_hash: self.forest.parent[start].map(hash),
                    block_size: 16,
                    ..Default::default()
                });
                self.ix.apply(slot as u32, &event);
            }
            Step::Remove { slot, pick, count } => {
                let mut gone = Vec::new();
                for i in 0..count {
                    let cache = &self.engines[slot];
                    let leaves: Vec<usize> = cache
                        .iter()
                        .copied()
                        .filter(|&n| self.forest.children(n).all(|c| !cache.contains(&c)))
                        .collect();
                    let Some(leaf) = Self::pick(&leaves, pick + i) else {
                        break;
                    };
                    self.engines[slot].remove(&leaf);
                    gone.push(hash(leaf));
                }
                let event = KvEvent::Removed(BlockRemoved {
                    block_hashes: gone,
                    medium: None,
                });
                self.ix.apply(slot as u32, &event);
            }
            Step::Clear { slot } => {
                self.engines[slot].clear();
                self.ix.apply(slot as u32, &KvEvent::AllCleared);
            }
            Step::Resync { slot } => self.ix.detach_slot(slot as u32),
            Step::Release { slot } => {
                self.engines[slot].clear();
                self.ix.release_slot(slot as u32);
            }
            Step::Unlink { budget } => {
                self.ix.unlink_step(budget, &mut Vec::new());
            }
        }
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let by_hash = |h: i64| (0..NODES).find(|&n| hash(n) == h).expect("a forest block");
        let mut held: Vec<BTreeSet<usize>> = Vec::new();
        for slot in 0..SLOTS {
            let blocks: BTreeSet<usize> = self.ix.slot_blocks(slot as u32).map(by_hash).collect();
            for &b in &blocks {
                if let Some(p) = self.forest.parent[b] {
                    prop_assert!(
                        blocks.contains(&p),
                        "slot {slot} holds block {b} but not its parent {p}"
                    );
                }
                prop_assert!(
                    self.engines[slot].contains(&b),
                    "slot {slot} holds block {b}, which its engine does not"
                );
            }
            let st = self.ix.slot_stats(slot as u32);
            prop_assert_eq!(st.blocks, blocks.len() as u64, "slot {}'s count", slot);
            if st.over_quota {
                prop_assert!(
                    blocks.is_empty(),
                    "slot {slot} over quota still holds blocks"
                );
            }
            held.push(blocks);
        }
        prop_assert!(self.ix.len() <= self.ix.max_blocks());
        let mut got = Vec::new();
        for node in 0..NODES {
            let mut chain = self.forest.chain(node);
            chain.push(hash(NODES + 1)); // a page no engine has
            self.ix.match_into(&chain, &mut got);
            got.sort_unstable();
            let want: Vec<(u32, u32)> = (0..SLOTS)
                .map(|s| {
                    let depth = chain
                        .iter()
                        .take_while(|&&h| held[s].iter().any(|&b| hash(b) == h))
                        .count();
                    (s as u32, depth as u32)
                })
                .filter(|&(_, d)| d > 0)
                .collect();
            prop_assert_eq!(&got, &want, "depths of the chain to block {}", node);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn holders_stay_nested_and_lookups_match_a_scan(
        picks in proptest::collection::vec(any::<u8>(), NODES),
        max_blocks in 4..24usize,
        quota in 3..16usize,
        steps in proptest::collection::vec(step(), 1..60),
    ) {
        let mut w = World {
            forest: Forest::new(&picks),
            engines: vec![BTreeSet::new(); SLOTS],
            ix: KvIndex::new(max_blocks),
        };
        w.ix.set_slot_quota(quota);
        for s in &steps {
            w.run(s);
            w.check()?;
        }
    }
}
