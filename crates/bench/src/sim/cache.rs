//! One router replica's belief about the engines' caches, as the live router will hold it: a
//! [`KvIndex`] fed by the engines' KV events (delivered `net_delay_s` after they happen, as the
//! snapshots are), or an [`ApproxTree`] of what this replica dispatched. Which one a variant uses
//! is its [`CacheView`]; the policy sees only numbers of tokens through the view.

use loadlink_router::cache::{ApproxTree, KvIndex, Slot};
use loadlink_wire::kv_events::KvEvent;

/// Where a router variant's cached-prefix numbers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheView {
    /// None: the view says 0 cached tokens everywhere (load-only policies).
    #[default]
    Blind,
    /// The router's approximate tree of what it sent (SGLang's `cache_aware`).
    Approx,
    /// The KV index fed by the engines' KV-event streams.
    Index,
}

impl CacheView {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheView::Blind => "blind",
            CacheView::Approx => "approx",
            CacheView::Index => "kv-index",
        }
    }
}

/// An approximate tree forgets blocks unused for this long.
pub const APPROX_TTL_MS: u64 = 120_000;
/// The KV index's bound (distinct blocks over the fleet).
const INDEX_MAX_BLOCKS: usize = 1 << 22;

/// One replica's cache belief.
pub(crate) struct RouterCache {
    view: CacheView,
    page_size: u64,
    index: KvIndex,
    tree: ApproxTree,
    matches: Vec<(Slot, u32)>,
}

impl RouterCache {
    /// `max_pages`: the approximate tree's bound per engine (its KV pool in pages).
    pub(crate) fn new(view: CacheView, page_size: usize, max_pages: usize) -> Self {
        RouterCache {
            view,
            page_size: page_size as u64,
            index: KvIndex::new(INDEX_MAX_BLOCKS),
            tree: ApproxTree::new(max_pages, APPROX_TTL_MS),
            matches: Vec::new(),
        }
    }

    /// KV events of engine `slot` arrive.
    pub(crate) fn apply(&mut self, slot: usize, events: &[KvEvent]) {
        if self.view == CacheView::Index {
            for e in events {
                self.index.apply(slot as Slot, e);
            }
        }
    }

    /// This replica dispatched `chain` to engine `slot` at `now_ms`.
    pub(crate) fn dispatched(&mut self, slot: usize, chain: &[i64], now_ms: u64) {
        if self.view == CacheView::Approx {
            self.tree.record(slot as Slot, chain, now_ms);
        }
    }

    /// Per engine at `now_ms`: this chain's cached tokens into `cached`, and the whole cache
    /// believed there into `sizes` (both resized to `engines`).
    pub(crate) fn lookup(
        &mut self,
        chain: &[i64],
        now_ms: u64,
        engines: usize,
        cached: &mut Vec<u64>,
        sizes: &mut Vec<u64>,
    ) {
        cached.clear();
        cached.resize(engines, 0);
        sizes.clear();
        sizes.resize(engines, 0);
        match self.view {
            CacheView::Blind => return,
            CacheView::Approx => {
                // Blocks past their age go first, also on workers this replica no longer sends to.
                self.tree.expire(now_ms);
                self.tree.match_into(chain, &mut self.matches)
            }
            CacheView::Index => self.index.match_into(chain, &mut self.matches),
        }
        for &(slot, blocks) in &self.matches {
            if let Some(c) = cached.get_mut(slot as usize) {
                *c = u64::from(blocks) * self.page_size;
            }
        }
        for (e, s) in sizes.iter_mut().enumerate() {
            let blocks = match self.view {
                CacheView::Approx => self.tree.slot_stats(e as Slot).blocks,
                _ => self.index.slot_stats(e as Slot).blocks,
            };
            *s = blocks * self.page_size;
        }
    }
}
