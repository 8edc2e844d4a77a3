//! The host tier of one rank's prefix cache: SGLang's HiCache host pool at page granularity.
//!
//! * **Why.** A device cache forgets a session's prefix within minutes of idleness; host memory
//!   is several times larger and a page copied back over PCIe costs a fraction of recomputing it.
//!   SGLang #39108 reports about 15 minutes of device residency against about 2 hours on the host.
//! * **What lands here.** A page evicted from the device is *demoted*: its host copy is kept
//!   (announced as `BlockStored` with medium `CPU_PINNED`) before its device removal is announced.
//!   A page loaded back keeps its host copy (as HiCache does), so a second demotion is free.
//! * **What leaves.** When the pool is full, the least recently used page that can go without
//!   orphaning another: one still on the device (only its copy goes), or a host-only page with no
//!   host child. So the pages of every tier together stay prefix-closed, which is what a router's
//!   index relies on. Each departure is announced as `BlockRemoved(CPU_PINNED)`.
//!
//! Pure: recency is a counter. The device cache ([`crate::radix::PrefixCache`]) owns this pool and
//! says which pages are on the device.

use std::collections::{BTreeSet, HashMap};

/// The medium a host copy is announced with (SGLang's `StorageMedium.CPU`).
pub const HOST_MEDIUM: &str = "CPU_PINNED";

/// Host-to-device load bandwidth a simulated engine assumes unless told (`--hicache-load-rate`),
/// tokens per second: a Llama-3-8B-class model's 128 KiB of KV per token at about 13 GB/s, half
/// of PCIe 4.0 x16 (the router's default for workers that do not advertise a rate is the same).
pub const DEFAULT_LOAD_TOKENS_PER_S: f64 = 100_000.0;

/// The host tier's size and speed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostTierConfig {
    /// Tokens the host pool holds; 0 turns the tier off.
    pub tokens: u64,
    /// Tokens per second loaded back to the device.
    pub load_tokens_per_s: f64,
}

impl Default for HostTierConfig {
    fn default() -> Self {
        HostTierConfig {
            tokens: 0,
            load_tokens_per_s: DEFAULT_LOAD_TOKENS_PER_S,
        }
    }
}

#[derive(Debug, Clone)]
struct HostPage {
    parent: Option<i64>,
    tokens: Box<[u32]>,
    last_access: u64,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct HostTier {
    capacity_pages: usize,
    pages: HashMap<i64, HostPage>,
    /// Every host page by (last access, hash): the order eviction scans.
    lru: BTreeSet<(u64, i64)>,
    /// Host pages per parent hash (the parent may be on the device only).
    children: HashMap<i64, u32>,
    tick: u64,
}

impl HostTier {
    /// A pool of `tokens` tokens of `page_size`-token pages; `None` when that is not one page.
    pub fn new(tokens: u64, page_size: usize) -> Option<Self> {
        let capacity_pages = (tokens / page_size.max(1) as u64) as usize;
        (capacity_pages > 0).then(|| HostTier {
            capacity_pages,
            pages: HashMap::new(),
            lru: BTreeSet::new(),
            children: HashMap::new(),
            tick: 0,
        })
    }

    pub fn len(&self) -> usize {
        self.pages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Every host page as (hash, the parent its store announced), in no order.
    pub fn parents(&self) -> impl Iterator<Item = (i64, Option<i64>)> + '_ {
        self.pages.iter().map(|(&h, p)| (h, p.parent))
    }

    pub fn contains(&self, hash: i64) -> bool {
        self.pages.contains_key(&hash)
    }

    /// The tokens of a host page.
    pub fn tokens(&self, hash: i64) -> Option<&[u32]> {
        self.pages.get(&hash).map(|p| &*p.tokens)
    }

    /// Every host page's hash, in no order.
    pub fn hashes(&self) -> impl Iterator<Item = i64> + '_ {
        self.pages.keys().copied()
    }

    /// Marks `hash` used now.
    pub fn touch(&mut self, hash: i64) {
        self.tick += 1;
        if let Some(p) = self.pages.get_mut(&hash) {
            self.lru.remove(&(p.last_access, hash));
            p.last_access = self.tick;
            self.lru.insert((self.tick, hash));
        }
    }

    /// Keeps a host copy of `hash` (a no-op when it has one), first evicting what the pool must
    /// lose for it into `evicted`, oldest first. `on_device` says which pages have a device copy.
    /// Returns whether a new copy was stored (false when nothing could make room).
    pub fn store(
        &mut self,
        hash: i64,
        parent: Option<i64>,
        tokens: &[u32],
        on_device: impl Fn(i64) -> bool,
        evicted: &mut Vec<i64>,
    ) -> bool {
        if self.pages.contains_key(&hash) {
            self.touch(hash);
            return false;
        }
        while self.pages.len() >= self.capacity_pages {
            match self.victim(&on_device) {
                Some(v) => {
                    self.remove(v);
                    evicted.push(v);
                }
                None => return false,
            }
        }
        self.tick += 1;
        self.pages.insert(
            hash,
            HostPage {
                parent,
                tokens: tokens.into(),
                last_access: self.tick,
            },
        );
        self.lru.insert((self.tick, hash));
        if let Some(p) = parent {
            *self.children.entry(p).or_default() += 1;
        }
        true
    }

    /// The least recently used page that may go: on the device too, or without a host child.
    fn victim(&self, on_device: &impl Fn(i64) -> bool) -> Option<i64> {
        self.lru
            .iter()
            .map(|&(_, h)| h)
            .find(|&h| on_device(h) || !self.children.contains_key(&h))
    }

    /// Drops `hash`'s host copy; returns whether it had one.
    pub fn remove(&mut self, hash: i64) -> bool {
        let Some(p) = self.pages.remove(&hash) else {
            return false;
        };
        self.lru.remove(&(p.last_access, hash));
        if let Some(parent) = p.parent
            && let Some(n) = self.children.get_mut(&parent)
        {
            *n -= 1;
            if *n == 0 {
                self.children.remove(&parent);
            }
        }
        true
    }

    /// Drops every host copy; returns their hashes, children before parents.
    pub fn clear(&mut self) -> Vec<i64> {
        let mut order: Vec<(u64, i64)> = self.lru.iter().copied().collect();
        order.sort_unstable_by_key(|&(_, h)| std::cmp::Reverse(self.depth(h)));
        self.pages.clear();
        self.lru.clear();
        self.children.clear();
        order.into_iter().map(|(_, h)| h).collect()
    }

    /// Host pages above `hash` in its chain (for clearing leaves first).
    fn depth(&self, hash: i64) -> usize {
        let mut d = 0;
        let mut cur = self.pages.get(&hash).and_then(|p| p.parent);
        while let Some(h) = cur {
            d += 1;
            cur = self.pages.get(&h).and_then(|p| p.parent);
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_pool_evicts_the_oldest_page_that_orphans_nothing() {
        let mut t = HostTier::new(3 * 4, 4).unwrap();
        let mut out = Vec::new();
        let none = |_| false;
        assert!(t.store(1, None, &[0; 4], none, &mut out));
        assert!(t.store(2, Some(1), &[0; 4], none, &mut out));
        assert!(t.store(9, None, &[0; 4], none, &mut out));
        // 1 is the oldest but has a host child: 2 goes first, then 1.
        assert!(t.store(3, None, &[0; 4], none, &mut out));
        assert!(t.store(4, None, &[0; 4], none, &mut out));
        assert_eq!(out, [2, 1]);
        // A page still on the device may lose its copy whatever its children.
        let mut t = HostTier::new(2 * 4, 4).unwrap();
        out.clear();
        t.store(1, None, &[0; 4], none, &mut out);
        t.store(2, Some(1), &[0; 4], none, &mut out);
        assert!(t.store(3, None, &[0; 4], |h| h == 1, &mut out));
        assert_eq!(out, [1]);
        assert_eq!(t.clear(), [2, 3]);
        assert!(t.is_empty());
        assert!(HostTier::new(3, 4).is_none(), "less than a page: no tier");
    }
}
