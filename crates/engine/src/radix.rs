//! The prefix cache of one rank: SGLang's `RadixCache` behaviour at page granularity, with the
//! KV-event stream as a consequence of its inserts and evictions.
//!
//! * **Pages.** The cache holds whole pages of `page_size` tokens. A page is identified by the
//!   SHA-256 chain SGLang uses for its event hashes (`loadlink_wire::kv_events::page_digest`), so
//!   the id of a page already names its whole prefix: one map from block hash to node is the tree,
//!   and the ids a `BlockStored` announces are the ids a router looks up.
//! * **Match.** A request's longest cached prefix is the run of its page hashes found in the map;
//!   those tokens skip prefill.
//! * **Locks.** A running request locks the path it matched (a reference count on every node up
//!   to the root), so eviction never takes pages in use.
//! * **Insert.** A finished request inserts its prompt and output (full pages only); new pages are
//!   announced in one `BlockStored` whose hashes chain parent → child.
//! * **Evict.** When the pool needs room, unlocked leaves go, least recently used first, each one
//!   announced in a `BlockRemoved`; a parent whose last child went becomes a leaf in turn.
//! * **Host tier** (`--hicache-size`, [`crate::host_tier`]): an evicted page is demoted to the
//!   host pool first (its `BlockStored(CPU_PINNED)` precedes its device `BlockRemoved`). A request
//!   whose prefix continues on the host has those pages loaded back before it is admitted
//!   ([`PrefixCache::load_back`], a device `BlockStored` under the device parent), and pays the
//!   copy time in its prefill instead of recomputing them.
//!
//! * **Namespaces** (a LoRA adapter, `extra_key`, `cache_salt`; [`crate::page_chain`]): pages are
//!   keyed by a hash that keeps namespaces apart; a namespaced page's published hash and its
//!   `lora_name`/`cache_salt` are kept beside it (`radix_names.rs`) while any tier holds it, and
//!   every event, `/cache_blocks` and snapshot cut names pages by their published hashes.
//!
//! Pure: no clock (recency is a counter), no I/O. The owner drains [`PrefixCache::take_events`].

use crate::host_tier::{HOST_MEDIUM, HostTier};
pub use crate::page_chain::PageChain;
use loadlink_wire::kv_events::{BlockRemoved, BlockStored, KvEvent};
use radix_names::PageName;
use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Clone)]
struct Node {
    parent: Option<i64>,
    tokens: Box<[u32]>,
    children: u32,
    lock: u32,
    last_access: u64,
}

/// A lock on a matched path; give it back with [`PrefixCache::unlock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathLock {
    /// The deepest locked page, `None` when nothing matched.
    leaf: Option<i64>,
}

/// Counters for the published hit rate and for tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub cached_tokens: u64,
    /// Tokens of pages no running request holds (SGLang's `evictable_size`).
    pub evictable_tokens: u64,
    pub pages_stored: u64,
    pub pages_removed: u64,
    /// Tokens of the host tier's pages (0 without one).
    pub host_tokens: u64,
    /// Tokens loaded back from the host tier since start.
    pub loaded_back_tokens: u64,
}

#[derive(Debug, Clone)]
pub struct PrefixCache {
    page_size: usize,
    nodes: HashMap<i64, Node>,
    /// Unlocked leaves by (last access, hash): the eviction order.
    evictable: BTreeSet<(u64, i64)>,
    tick: u64,
    /// Pages no running request holds (leaves or not): evictable, sooner or later.
    unlocked_pages: u64,
    pages_stored: u64,
    pages_removed: u64,
    events: Vec<KvEvent>,
    /// Whether events are recorded (off when nobody publishes them).
    record: bool,
    /// Where evicted pages are demoted to, when the engine has a host tier.
    host: Option<HostTier>,
    loaded_back_pages: u64,
    /// Published names of namespaced pages, by key (empty while every page is plain).
    names: HashMap<i64, PageName>,
}

impl PrefixCache {
    pub fn new(page_size: usize, record_events: bool) -> Self {
        PrefixCache {
            page_size: page_size.max(1),
            nodes: HashMap::new(),
            evictable: BTreeSet::new(),
            tick: 0,
            unlocked_pages: 0,
            pages_stored: 0,
            pages_removed: 0,
            events: Vec::new(),
            record: record_events,
            host: None,
            loaded_back_pages: 0,
            names: HashMap::new(),
        }
    }

    /// The cache with a host tier of `tokens` tokens (none when that is less than a page).
    pub fn with_host_tier(mut self, tokens: u64) -> Self {
        self.host = HostTier::new(tokens, self.page_size);
        self
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn stats(&self) -> CacheStats {
        let p = self.page_size as u64;
        CacheStats {
            cached_tokens: self.nodes.len() as u64 * p,
            evictable_tokens: self.unlocked_pages * p,
            pages_stored: self.pages_stored,
            pages_removed: self.pages_removed,
            host_tokens: self.host.as_ref().map_or(0, |h| h.len() as u64) * p,
            loaded_back_tokens: self.loaded_back_pages * p,
        }
    }

    /// Tokens of the longest cached prefix of a request with these page hashes (no side effects).
    pub fn matched_tokens(&self, chain: &PageChain) -> u64 {
        self.matched_pages(chain) as u64 * self.page_size as u64
    }

    fn matched_pages(&self, chain: &PageChain) -> usize {
        chain
            .hashes
            .iter()
            .take_while(|h| self.nodes.contains_key(h))
            .count()
    }

    fn is_leaf_unlocked(n: &Node) -> bool {
        n.children == 0 && n.lock == 0
    }

    /// Moves `hash` to "used now" in the recency order.
    fn touch(&mut self, hash: i64) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(n) = self.nodes.get_mut(&hash) {
            if Self::is_leaf_unlocked(n) {
                self.evictable.remove(&(n.last_access, hash));
                self.evictable.insert((tick, hash));
            }
            n.last_access = tick;
        }
    }

    /// Locks the longest cached prefix of `chain` for a request about to run; returns the lock and
    /// the matched tokens (they skip prefill).
    pub fn lock(&mut self, chain: &PageChain) -> (PathLock, u64) {
        let pages = self.matched_pages(chain);
        let Some(&leaf) = pages.checked_sub(1).and_then(|i| chain.hashes.get(i)) else {
            return (PathLock::default(), 0);
        };
        for &h in &chain.hashes[..pages] {
            self.touch(h);
        }
        self.add_lock(leaf, 1);
        (
            PathLock { leaf: Some(leaf) },
            (pages * self.page_size) as u64,
        )
    }

    pub fn unlock(&mut self, lock: PathLock) {
        if let Some(leaf) = lock.leaf {
            self.add_lock(leaf, -1);
        }
    }

    /// Adds `delta` to the lock count of `from` and every ancestor, keeping the evictable set true.
    fn add_lock(&mut self, from: i64, delta: i32) {
        let mut cur = Some(from);
        while let Some(h) = cur {
            let Some(n) = self.nodes.get_mut(&h) else {
                return;
            };
            let was = Self::is_leaf_unlocked(n);
            let was_unlocked = n.lock == 0;
            n.lock = n.lock.saturating_add_signed(delta);
            let now = Self::is_leaf_unlocked(n);
            match (was_unlocked, n.lock == 0) {
                (true, false) => self.unlocked_pages -= 1,
                (false, true) => self.unlocked_pages += 1,
                _ => {}
            }
            let (key, parent) = ((n.last_access, h), n.parent);
            self.set_evictable(key, was, now);
            cur = parent;
        }
    }

    fn set_evictable(&mut self, key: (u64, i64), was: bool, now: bool) {
        match (was, now) {
            (false, true) => {
                self.evictable.insert(key);
            }
            (true, false) => {
                self.evictable.remove(&key);
            }
            _ => {}
        }
    }

    /// Inserts the full pages of `tokens` (hashed in `chain`); returns how many tokens were new to
    /// the cache (the rest were cached already, or are a partial last page, and are freed).
    pub fn insert(&mut self, tokens: &[u32], chain: &PageChain) -> u64 {
        let p = self.page_size;
        let published = chain.published();
        let ns = chain.namespace();
        let mut parent: Option<i64> = None;
        let mut stored = self.stored_template(ns, "GPU");
        let mut new_pages = 0u64;
        for (i, &h) in chain.hashes.iter().enumerate() {
            let page = &tokens[i * p..(i + 1) * p];
            if self.nodes.contains_key(&h) {
                self.touch(h);
            } else {
                self.add_node(h, parent, page);
                self.name(h, published[i], ns);
                let parent_pub = i.checked_sub(1).map(|j| published[j]);
                if stored.block_hashes.is_empty() {
                    stored.parent_block_hash = parent_pub;
                } else if stored.block_hashes.last() != parent_pub.as_ref() {
                    self.flush_stored(&mut stored);
                    stored.parent_block_hash = parent_pub;
                }
                stored.block_hashes.push(published[i]);
                stored.token_ids.extend(page.iter().map(|&t| i64::from(t)));
                new_pages += 1;
            }
            parent = Some(h);
        }
        self.flush_stored(&mut stored);
        self.pages_stored += new_pages;
        new_pages * p as u64
    }

    /// A new unlocked leaf `h` under `parent` (which must be cached, or `None`).
    fn add_node(&mut self, h: i64, parent: Option<i64>, page: &[u32]) {
        if let Some(ph) = parent {
            self.adopt_child(ph);
        }
        self.tick += 1;
        self.nodes.insert(
            h,
            Node {
                parent,
                tokens: page.into(),
                children: 0,
                lock: 0,
                last_access: self.tick,
            },
        );
        self.set_evictable((self.tick, h), false, true);
        self.unlocked_pages += 1;
    }

    /// Tokens of `chain` held on the host tier right after its cached (device) prefix: what
    /// [`PrefixCache::load_back`] would bring back. Marks them used.
    pub fn host_continuation(&mut self, chain: &PageChain) -> u64 {
        let from = self.matched_pages(chain);
        let Some(host) = self.host.as_mut() else {
            return 0;
        };
        let mut n = 0;
        for &h in &chain.hashes[from..] {
            if !host.contains(h) {
                break;
            }
            host.touch(h);
            n += 1;
        }
        n * self.page_size as u64
    }

    /// Copies the host pages continuing `chain`'s cached prefix back to the device, at most
    /// `max_tokens` of them (the room the pool has), announced as one device `BlockStored` under
    /// the device parent; their host copies stay. Returns the tokens loaded.
    pub fn load_back(&mut self, chain: &PageChain, max_tokens: u64) -> u64 {
        let from = self.matched_pages(chain);
        let Some(host) = self.host.take() else {
            return 0;
        };
        let max_pages = (max_tokens / self.page_size as u64) as usize;
        let published = chain.published();
        let mut parent = from.checked_sub(1).map(|i| chain.hashes[i]);
        let mut stored = self.stored_template(chain.namespace(), "GPU");
        stored.parent_block_hash = from.checked_sub(1).map(|i| published[i]);
        for (i, &h) in chain.hashes.iter().enumerate().skip(from).take(max_pages) {
            let Some(page) = host.tokens(h) else {
                break;
            };
            self.add_node(h, parent, page);
            stored.block_hashes.push(published[i]);
            stored.token_ids.extend(page.iter().map(|&t| i64::from(t)));
            parent = Some(h);
        }
        self.host = Some(host);
        let n = stored.block_hashes.len() as u64;
        self.pages_stored += n;
        self.loaded_back_pages += n;
        self.flush_stored(&mut stored);
        n * self.page_size as u64
    }

    /// Keeps a host copy of the device page `h` about to be evicted, announcing the host
    /// evictions that made room and then the copy (before the page's device removal).
    fn demote(&mut self, h: i64, n: &Node) {
        let Some(host) = self.host.as_mut() else {
            return;
        };
        let nodes = &self.nodes;
        let mut evicted = Vec::new();
        let on_device = |x: i64| nodes.contains_key(&x);
        let stored = host.store(h, n.parent, &n.tokens, on_device, &mut evicted);
        let gone: Vec<i64> = evicted.iter().map(|&k| self.published(k)).collect();
        for &k in &evicted {
            self.forget_if_gone(k);
        }
        if !self.record {
            return;
        }
        if !gone.is_empty() {
            self.events.push(KvEvent::Removed(BlockRemoved {
                block_hashes: gone,
                medium: Some(HOST_MEDIUM.into()),
            }));
        }
        if stored {
            let mut s = self.stored_template(self.names.get(&h).map(|n| &n.ns), HOST_MEDIUM);
            s.block_hashes = vec![self.published(h)];
            s.parent_block_hash = n.parent.map(|p| self.published(p));
            s.token_ids = n.tokens.iter().map(|&t| i64::from(t)).collect();
            self.events.push(KvEvent::Stored(s));
        }
    }

    /// `parent` gains a child: it stops being a leaf.
    fn adopt_child(&mut self, parent: i64) {
        if let Some(n) = self.nodes.get_mut(&parent) {
            let was = Self::is_leaf_unlocked(n);
            n.children += 1;
            let key = (n.last_access, parent);
            self.set_evictable(key, was, false);
        }
    }

    fn flush_stored(&mut self, stored: &mut BlockStored) {
        if stored.block_hashes.is_empty() {
            return;
        }
        let next = BlockStored {
            block_size: stored.block_size,
            medium: stored.medium.clone(),
            lora_name: stored.lora_name.clone(),
            cache_salt: stored.cache_salt.clone(),
            ..Default::default()
        };
        let done = std::mem::replace(stored, next);
        if self.record {
            self.events.push(KvEvent::Stored(done));
        }
    }

    /// Evicts unlocked leaves, least recently used first, until `tokens` are freed or nothing
    /// evictable is left; returns the tokens freed.
    pub fn evict(&mut self, tokens: u64) -> u64 {
        self.evict_to(tokens, true)
    }

    /// [`PrefixCache::evict`], demoting each page to the host tier when `demote` (and there is
    /// one).
    fn evict_to(&mut self, tokens: u64, demote: bool) -> u64 {
        let mut freed = 0u64;
        let mut removed = Vec::new();
        while freed < tokens {
            let Some((_, h)) = self.evictable.pop_first() else {
                break;
            };
            let Some(n) = self.nodes.remove(&h) else {
                continue;
            };
            if demote {
                self.demote(h, &n);
            }
            self.unlocked_pages -= 1;
            removed.push(self.published(h));
            self.forget_if_gone(h);
            freed += self.page_size as u64;
            if let Some(ph) = n.parent
                && let Some(p) = self.nodes.get_mut(&ph)
            {
                p.children -= 1;
                let now = Self::is_leaf_unlocked(p);
                let key = (p.last_access, ph);
                self.set_evictable(key, false, now);
            }
        }
        self.pages_removed += removed.len() as u64;
        if self.record && !removed.is_empty() {
            self.events.push(KvEvent::Removed(BlockRemoved {
                block_hashes: removed,
                medium: Some("GPU".into()),
            }));
        }
        freed
    }

    /// Drops every unlocked page; locked ones stay (they are in use). Announced as
    /// `AllBlocksCleared` when the cache ends up empty, else as the pages removed.
    pub fn flush(&mut self) {
        self.evict_to(u64::MAX, false);
        let host_gone = self.host.as_mut().map(HostTier::clear).unwrap_or_default();
        let host_gone: Vec<i64> = host_gone.into_iter().map(|k| self.published(k)).collect();
        self.names
            .retain(|k, _| self.nodes.contains_key(k) || self.host.iter().any(|h| h.contains(*k)));
        if !host_gone.is_empty() && self.record {
            self.events.push(KvEvent::Removed(BlockRemoved {
                block_hashes: host_gone,
                medium: Some(HOST_MEDIUM.into()),
            }));
        }
        if self.nodes.is_empty() && self.record {
            self.events.retain(|e| !matches!(e, KvEvent::Removed(_)));
            self.events.push(KvEvent::AllCleared);
        }
    }

    /// The events since the last call, in order.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }
}

#[path = "radix_names.rs"]
mod radix_names;
#[cfg(test)]
#[path = "radix_tests.rs"]
mod tests;
