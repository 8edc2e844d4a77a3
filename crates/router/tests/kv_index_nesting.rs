//! The KV index's nesting invariant under every event order the protocol allows.
//!
//! `KvIndex::match_into` binary-searches a request's chain, which is only exact while the index's
//! holders are nested (a slot holding block i+1 of a chain holds block i). Engines keep that true
//! of their own caches (they store children under held parents and evict leaves), but the index
//! also drops blocks of its own: at the fleet-wide bound, at a slot's quota, on a resync. This
//! test drives the index with random event sequences of engines that follow the protocol: stores
//! chaining onto held parents, removals of leaves, clears, resyncs and releases, and the tier moves
//! of a host tier (a host copy landing, demotion of a device leaf, host eviction, load-back), with
//! the bound and the quota small enough to be hit often. After every step it checks, per slot:
//! every block's parent is held on some tier, and every device block's parent on the device (or
//! it is a root); the index holds nothing on a tier its engine does not; the per-slot counts are
//! right; and the lookup's depths (any tier, device) for every chain of the block forest equal a
//! brute-force scan of the slot's blocks.

use loadlink_router::cache::{KvIndex, Tier, TierMatch};
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

/// One engine's cache: the blocks on its device and on its host tier (a block may be on both).
#[derive(Debug, Clone, Default)]
struct Cache {
    device: BTreeSet<usize>,
    host: BTreeSet<usize>,
}

impl Cache {
    fn holds(&self, n: usize) -> bool {
        self.device.contains(&n) || self.host.contains(&n)
    }

    fn clear(&mut self) {
        self.device.clear();
        self.host.clear();
    }
}

const HOST: &str = "CPU_PINNED";

fn stored(medium: Option<&str>, parent: Option<usize>, pages: &[usize]) -> KvEvent {
    KvEvent::Stored(BlockStored {
        block_hashes: pages.iter().map(|&n| hash(n)).collect(),
        parent_block_hash: parent.map(hash),
        block_size: 16,
        medium: medium.map(str::to_string),
        ..Default::default()
    })
}

fn removed(medium: Option<&str>, pages: &[usize]) -> KvEvent {
    KvEvent::Removed(BlockRemoved {
        block_hashes: pages.iter().map(|&n| hash(n)).collect(),
        medium: medium.map(str::to_string),
    })
}

/// One step, drawn as numbers and interpreted against the engines' current caches so that every
/// step is one the protocol allows.
#[derive(Debug, Clone)]
enum Step {
    /// A device `BlockStored` of up to `len` new pages going down from the device (or a root).
    Store {
        slot: usize,
        pick: usize,
        len: usize,
    },
    /// A device `BlockRemoved` of up to `count` leaves without a host copy, one after another.
    Remove {
        slot: usize,
        pick: usize,
        count: usize,
    },
    /// A host copy of a block lands: of a device block (write-through), or of a new block below
    /// any held parent (a prefetch from storage).
    HostStore { slot: usize, pick: usize },
    /// A device leaf is demoted: its host copy is announced (when new), then its device removal.
    Demote { slot: usize, pick: usize },
    /// A host copy goes: of a host-only leaf, or of a block still on the device.
    EvictHost { slot: usize, pick: usize },
    /// Host blocks are loaded back to the device, a path down from the device (or a root).
    LoadBack {
        slot: usize,
        pick: usize,
        len: usize,
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
    let pick = any::<usize>();
    prop_oneof![
        6 => (slot.clone(), pick, 1..5usize)
            .prop_map(|(slot, pick, len)| Step::Store { slot, pick, len }),
        3 => (slot.clone(), pick, 1..4usize)
            .prop_map(|(slot, pick, count)| Step::Remove { slot, pick, count }),
        2 => (slot.clone(), pick).prop_map(|(slot, pick)| Step::HostStore { slot, pick }),
        3 => (slot.clone(), pick).prop_map(|(slot, pick)| Step::Demote { slot, pick }),
        2 => (slot.clone(), pick).prop_map(|(slot, pick)| Step::EvictHost { slot, pick }),
        2 => (slot.clone(), pick, 1..4usize)
            .prop_map(|(slot, pick, len)| Step::LoadBack { slot, pick, len }),
        1 => slot.clone().prop_map(|slot| Step::Clear { slot }),
        1 => slot.clone().prop_map(|slot| Step::Resync { slot }),
        1 => slot.prop_map(|slot| Step::Release { slot }),
        2 => (1..6usize).prop_map(|budget| Step::Unlink { budget }),
    ]
}

/// The engines' own caches (the truth the index follows) and the index.
struct World {
    forest: Forest,
    engines: Vec<Cache>,
    ix: KvIndex,
}

fn pick<T: Copy>(items: &[T], pick: usize) -> Option<T> {
    (!items.is_empty()).then(|| items[pick % items.len()])
}

fn by_hash(h: i64) -> Option<usize> {
    (0..NODES).find(|&n| hash(n) == h)
}

impl World {
    /// The forest's blocks that pass `keep`, in order.
    fn nodes(&self, keep: impl Fn(usize) -> bool) -> Vec<usize> {
        (0..NODES).filter(|&n| keep(n)).collect()
    }

    fn parent(&self, n: usize) -> Option<usize> {
        self.forest.parent[n]
    }

    /// A path down from `start` through blocks that pass `keep`, at most `len` long.
    fn path(
        &self,
        start: usize,
        len: usize,
        at: usize,
        keep: impl Fn(usize) -> bool,
    ) -> Vec<usize> {
        let mut pages = vec![start];
        while pages.len() < len {
            let last = *pages.last().unwrap();
            let kids: Vec<usize> = self.forest.children(last).filter(|&k| keep(k)).collect();
            match pick(&kids, at / 7 + pages.len()) {
                Some(k) => pages.push(k),
                None => break,
            }
        }
        pages
    }

    /// Whether `n` has no child held on any tier of `c`.
    fn any_leaf(&self, c: &Cache, n: usize) -> bool {
        self.forest.children(n).all(|k| !c.holds(k))
    }

    fn publish(&mut self, slot: usize, event: &KvEvent) {
        self.ix.apply(slot as u32, event);
    }

    /// Applies `step` to the engine it names, and the events that engine publishes to the index.
    fn run(&mut self, step: &Step) {
        match *step {
            Step::Store {
                slot,
                pick: at,
                len,
            } => {
                let c = &self.engines[slot];
                let starts = self
                    .nodes(|n| !c.holds(n) && self.parent(n).is_none_or(|p| c.device.contains(&p)));
                let Some(start) = pick(&starts, at) else {
                    return;
                };
                let pages = self.path(start, len, at, |k| !c.holds(k));
                let event = stored(None, self.parent(start), &pages);
                self.engines[slot].device.extend(&pages);
                self.publish(slot, &event);
            }
            Step::Remove {
                slot,
                pick: at,
                count,
            } => {
                let mut gone = Vec::new();
                for i in 0..count {
                    let c = &self.engines[slot];
                    let leaves = self.nodes(|n| {
                        c.device.contains(&n) && !c.host.contains(&n) && self.any_leaf(c, n)
                    });
                    let Some(leaf) = pick(&leaves, at + i) else {
                        break;
                    };
                    self.engines[slot].device.remove(&leaf);
                    gone.push(leaf);
                }
                self.publish(slot, &removed(Some("GPU"), &gone));
            }
            Step::HostStore { slot, pick: at } => {
                let c = &self.engines[slot];
                let ok = self
                    .nodes(|n| !c.host.contains(&n) && self.parent(n).is_none_or(|p| c.holds(p)));
                let Some(n) = pick(&ok, at) else {
                    return;
                };
                self.engines[slot].host.insert(n);
                self.publish(slot, &stored(Some(HOST), self.parent(n), &[n]));
            }
            Step::Demote { slot, pick: at } => {
                let c = &self.engines[slot];
                let leaves = self.nodes(|n| {
                    c.device.contains(&n) && self.forest.children(n).all(|k| !c.device.contains(&k))
                });
                let Some(n) = pick(&leaves, at) else {
                    return;
                };
                if self.engines[slot].host.insert(n) {
                    self.publish(slot, &stored(Some(HOST), self.parent(n), &[n]));
                }
                self.engines[slot].device.remove(&n);
                self.publish(slot, &removed(Some("GPU"), &[n]));
            }
            Step::EvictHost { slot, pick: at } => {
                let c = &self.engines[slot];
                let ok = self.nodes(|n| {
                    c.host.contains(&n) && (c.device.contains(&n) || self.any_leaf(c, n))
                });
                let Some(n) = pick(&ok, at) else {
                    return;
                };
                self.engines[slot].host.remove(&n);
                self.publish(slot, &removed(Some(HOST), &[n]));
            }
            Step::LoadBack {
                slot,
                pick: at,
                len,
            } => {
                let c = &self.engines[slot];
                let host_only = |n: usize| c.host.contains(&n) && !c.device.contains(&n);
                let starts = self.nodes(|n| {
                    host_only(n) && self.parent(n).is_none_or(|p| c.device.contains(&p))
                });
                let Some(start) = pick(&starts, at) else {
                    return;
                };
                let pages = self.path(start, len, at, host_only);
                let event = stored(Some("GPU"), self.parent(start), &pages);
                self.engines[slot].device.extend(&pages);
                self.publish(slot, &event);
            }
            Step::Clear { slot } => {
                self.engines[slot].clear();
                self.publish(slot, &KvEvent::AllCleared);
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

    /// The index's view of `slot`, checked for nesting, against its engine and its counts.
    fn check_slot(&self, slot: usize) -> Result<Cache, TestCaseError> {
        let s = slot as u32;
        let on = |t| -> BTreeSet<usize> {
            self.ix
                .slot_blocks_on(s, t)
                .into_iter()
                .filter_map(by_hash)
                .collect()
        };
        let view = Cache {
            device: on(Tier::Device),
            host: on(Tier::Host),
        };
        let held: BTreeSet<usize> = self.ix.slot_blocks(s).filter_map(by_hash).collect();
        let union: BTreeSet<usize> = view.device.union(&view.host).copied().collect();
        prop_assert_eq!(&held, &union, "slot {}: held = device + host", slot);
        let st = self.ix.slot_stats(s);
        // A host copy inferred after a resync (the slot then scans): flagged, and only the
        // lookup's equality with the scan below is owed.
        prop_assert!(
            !st.unnested || st.needs_resync,
            "slot {slot}: unnested but not stale"
        );
        for &b in held.iter().filter(|_| !st.unnested) {
            let p = self.parent(b);
            prop_assert!(
                p.is_none_or(|p| held.contains(&p)),
                "slot {slot} holds block {b} but not its parent {p:?}"
            );
            if view.device.contains(&b) {
                prop_assert!(
                    p.is_none_or(|p| view.device.contains(&p)),
                    "slot {slot} holds block {b} on the device but not its parent {p:?}"
                );
            }
        }
        let engine = &self.engines[slot];
        prop_assert!(
            view.device.is_subset(&engine.device),
            "slot {slot}: device blocks its engine lacks"
        );
        prop_assert!(
            view.host.is_subset(&engine.host),
            "slot {slot}: host blocks its engine lacks"
        );
        prop_assert_eq!(
            (st.blocks, st.device_blocks, st.host_blocks),
            (
                held.len() as u64,
                view.device.len() as u64,
                view.host.len() as u64
            ),
            "slot {}'s counts",
            slot
        );
        if st.over_quota {
            prop_assert!(held.is_empty(), "slot {slot} over quota still holds blocks");
        }
        Ok(view)
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let views = (0..SLOTS)
            .map(|s| self.check_slot(s))
            .collect::<Result<Vec<_>, _>>()?;
        prop_assert!(self.ix.len() <= self.ix.max_blocks());
        let off: usize = views
            .iter()
            .map(|v| v.host.difference(&v.device).count())
            .sum();
        prop_assert_eq!(self.ix.off_device_blocks(), off, "blocks off the device");
        let (mut got, mut plain) = (Vec::new(), Vec::new());
        for node in 0..NODES {
            let mut chain = self.forest.chain(node);
            chain.push(hash(NODES + 1)); // a page no engine has
            let depth = |keep: &dyn Fn(usize) -> bool| {
                let on = |h: &&i64| by_hash(**h).is_some_and(keep);
                chain.iter().take_while(on).count() as u32
            };
            let want: Vec<TierMatch> = views
                .iter()
                .enumerate()
                .map(|(s, v)| TierMatch {
                    slot: s as u32,
                    held: depth(&|n| v.holds(n)),
                    device: depth(&|n| v.device.contains(&n)),
                })
                .filter(|m| m.held > 0)
                .collect();
            self.ix.match_tiers_into(&chain, &mut got);
            got.sort_unstable();
            prop_assert_eq!(&got, &want, "depths of the chain to block {}", node);
            self.ix.match_into(&chain, &mut plain);
            plain.sort_unstable();
            let any: Vec<(u32, u32)> = want.iter().map(|m| (m.slot, m.held)).collect();
            prop_assert_eq!(&plain, &any, "match_into gives the any-tier depth");
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn holders_stay_nested_per_tier_and_lookups_match_a_scan(
        picks in proptest::collection::vec(any::<u8>(), NODES),
        max_blocks in 4..24usize,
        quota in 3..16usize,
        steps in proptest::collection::vec(step(), 1..60),
    ) {
        let mut w = World {
            forest: Forest::new(&picks),
            engines: vec![Cache::default(); SLOTS],
            ix: KvIndex::new(max_blocks),
        };
        w.ix.set_slot_quota(quota);
        for s in &steps {
            w.run(s);
            w.check()?;
        }
    }
}
