//! One router replica's belief about the engines' caches, as the live router will hold it: a
//! [`KvIndex`] fed by the engines' KV events (delivered `net_delay_s` after they happen, as the
//! snapshots are), or an [`ApproxTree`] of what this replica dispatched. Which one a variant uses
//! is its [`CacheView`]; the policy sees only numbers of tokens through the view.
//!
//! Both are kept per DP rank (each rank's KV-event stream is its own index slot; each rank routed
//! by name has its own tree slot), and answered per candidate ([`RouterCache::lookup`]). The
//! index also says how much of each hit is on a host tier only (engines with `host_tier`), which
//! `min_ttft` prices at its load-back time, and each slot's eviction regret
//! ([`RouterCache::regret`]), as the live `CacheBook` does.

use super::ranks::Layout;
use loadlink_engine::model::Submit;
use loadlink_router::cache::{ApproxTree, KvIndex, Slot, TailReuse, TierMatch};
use loadlink_router::candidate::{Candidate, Candidates};
use loadlink_router::policy::mix;
use loadlink_wire::kv_events::{KvEvent, page_hashes};

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
    layout: Layout,
    index: KvIndex,
    tree: ApproxTree,
    matches: Vec<(Slot, u32)>,
    tier_matches: Vec<TierMatch>,
    /// Scratch: per slot, the request's matched blocks.
    depth: Vec<u32>,
    /// Scratch: per slot, how many of them are on a host tier only.
    host_depth: Vec<u32>,
    /// Per candidate of the last lookup, its eviction regret (0 unless the view is the index).
    regret: Vec<f32>,
    /// Whether the tails of the prompts this replica placed get reused.
    reuse: TailReuse,
}

impl RouterCache {
    /// `max_pages`: the approximate tree's bound per slot (a rank's KV pool in pages).
    pub(crate) fn new(view: CacheView, page_size: usize, max_pages: usize, layout: Layout) -> Self {
        RouterCache {
            view,
            page_size: page_size as u64,
            layout,
            index: KvIndex::new(INDEX_MAX_BLOCKS),
            tree: ApproxTree::new(max_pages, APPROX_TTL_MS),
            matches: Vec::new(),
            tier_matches: Vec::new(),
            depth: Vec::new(),
            host_depth: Vec::new(),
            regret: Vec::new(),
            reuse: TailReuse::default(),
        }
    }

    /// This replica's meter of reused prompt tails.
    pub(crate) fn reuse(&self) -> &TailReuse {
        &self.reuse
    }

    /// Per candidate of the last [`RouterCache::lookup`], its cache's eviction regret, 0–1 (a
    /// rank's own; a whole engine's most regretful rank; 0 without the KV index).
    pub(crate) fn regret(&self) -> &[f32] {
        &self.regret
    }

    /// The mean eviction regret over every scheduler's slot (0 without the KV index): how much
    /// of what the fleet's pools evict is needed again, as this router's index sees it.
    pub(crate) fn mean_regret(&self) -> f64 {
        let n = self.layout.units();
        let sum: f64 = (0..n).map(|u| self.index.regret(u as Slot)).sum();
        sum / n.max(1) as f64
    }

    /// KV events of scheduler `unit` (one rank of an engine: its own stream) arrive.
    pub(crate) fn apply(&mut self, unit: usize, events: &[KvEvent]) {
        if self.view == CacheView::Index {
            for e in events {
                self.index.apply(unit as Slot, e);
            }
        }
    }

    /// The approximate tree's slot of candidate `c`: its rank's when routed to a rank, else one
    /// for what was sent to the whole engine (as the live router keeps them apart; a one-rank
    /// engine's whole slot is its rank's).
    fn approx_slot(&self, c: Candidate) -> usize {
        match c.rank {
            None if self.layout.ranks > 1 => self.layout.units() + c.worker as usize,
            _ => self.layout.units_of(c).start,
        }
    }

    /// This replica dispatched `chain` to candidate `c` at `now_ms`; `deepest` tokens of it were
    /// cached on some candidate.
    pub(crate) fn dispatched(&mut self, c: Candidate, chain: &[i64], deepest: u64, now_ms: u64) {
        self.reuse.record(chain, self.page_size, deepest, now_ms);
        if self.view == CacheView::Approx {
            let slot = self.approx_slot(c);
            self.tree.record(slot as Slot, chain, now_ms);
        }
    }

    /// Per candidate of `targets` at `now_ms`: this chain's cached tokens into `cached` (on any
    /// tier), the part of them on a host tier only into `host`, and the whole cache believed
    /// there into `sizes` (all resized to the candidates). A rank answers for itself; a whole
    /// engine from the KV index answers with its best rank (the most of the chain, the fullest
    /// cache), as the live `CacheBook` does.
    pub(crate) fn lookup(
        &mut self,
        chain: &[i64],
        now_ms: u64,
        targets: Candidates<'_>,
        cached: &mut Vec<u64>,
        (host, sizes): (&mut Vec<u64>, &mut Vec<u64>),
    ) {
        let n = targets.len();
        cached.clear();
        cached.resize(n, 0);
        host.clear();
        host.resize(n, 0);
        sizes.clear();
        sizes.resize(n, 0);
        self.regret.clear();
        self.regret.resize(n, 0.0);
        match self.view {
            CacheView::Blind => return,
            CacheView::Approx => {
                // Blocks past their age go first, also on workers this replica no longer sends to.
                self.tree.expire(now_ms);
                self.tree.match_into(chain, &mut self.matches)
            }
            CacheView::Index => {
                self.index.match_tiers_into(chain, &mut self.tier_matches);
                let m = self.tier_matches.iter().map(|m| (m.slot, m.held));
                self.matches.clear();
                self.matches.extend(m);
            }
        }
        let slots = self.layout.units() + self.layout.engines;
        self.depth.clear();
        self.depth.resize(slots, 0);
        self.host_depth.clear();
        self.host_depth.resize(slots, 0);
        for &(slot, blocks) in &self.matches {
            if let Some(d) = self.depth.get_mut(slot as usize) {
                *d = blocks;
            }
        }
        if self.view == CacheView::Index {
            for m in &self.tier_matches {
                if let Some(d) = self.host_depth.get_mut(m.slot as usize) {
                    *d = m.held - m.device;
                }
            }
        }
        for (i, c) in targets.iter().enumerate() {
            let (held, off, blocks) = match self.view {
                CacheView::Approx => {
                    let s = self.approx_slot(c);
                    (self.depth[s], 0, self.tree.slot_stats(s as Slot).blocks)
                }
                // The best rank: the most of the chain, and of those the least on the host.
                _ => self.layout.units_of(c).fold((0, 0, 0), |(h, o, b), u| {
                    let st = self.index.slot_stats(u as Slot);
                    let (hu, ou) = (self.depth[u], self.host_depth[u]);
                    let better = hu > h || (hu == h && ou < o);
                    let (h, o) = if better { (hu, ou) } else { (h, o) };
                    (h, o, b.max(st.blocks))
                }),
            };
            if self.view == CacheView::Index {
                let of = |u| self.index.regret(u as Slot) as f32;
                self.regret[i] = self.layout.units_of(c).map(of).fold(0.0, f32::max);
            }
            cached[i] = u64::from(held) * self.page_size;
            host[i] = u64::from(off) * self.page_size;
            sizes[i] = blocks * self.page_size;
        }
    }
}

/// The chain a request's prompt is looked up and recorded by: full pages of all but the prompt's
/// last token (what the engine will match).
pub(super) fn chain(submit: &Submit, cfg: &super::SimConfig, i: usize) -> Vec<i64> {
    let page = cfg.engines.first().map_or(16, |m| m.page_size);
    match (&submit.prompt, cfg.cache) {
        (Some(p), CacheView::Approx | CacheView::Index) if !p.is_empty() => {
            page_hashes(&p[..p.len() - 1], page)
        }
        // A prompt known only by its length is unique text: SGLang's tree still records it (its
        // smallest-tree choice then balances the text sent), so the approximate tree records a
        // chain no other request shares.
        (None, CacheView::Approx) => (0..submit.prompt_tokens / page as u64)
            .map(|k| mix(i as u64 ^ (k << 40) ^ 0x5e55_1011) as i64)
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loadlink_router::Worker;
    use loadlink_router::candidate::CandidateList;
    use loadlink_wire::kv_events::BlockStored;
    use std::sync::Arc;
    use std::time::Instant;

    /// Two engines of 4 ranks: the ranked candidates and the whole ones.
    fn fleet() -> (Vec<Arc<Worker>>, Vec<Candidate>) {
        let epoch = Instant::now();
        let ws: Vec<_> = (0..2)
            .map(|e| Arc::new(Worker::new(format!("sim://engine{e}"), 4, None, epoch)))
            .collect();
        let ranked = CandidateList::of(&ws, loadlink_router::candidate::RankField::Both).ranked;
        (ws, ranked)
    }

    fn stored(hashes: &[i64]) -> KvEvent {
        KvEvent::Stored(BlockStored {
            block_hashes: hashes.to_vec(),
            block_size: 16,
            ..Default::default()
        })
    }

    #[test]
    fn a_rank_answers_for_its_own_stream_and_a_whole_engine_for_its_best_rank() {
        let (ws, ranked) = fleet();
        let mut c = RouterCache::new(CacheView::Index, 16, 1000, Layout::new(2, 4));
        c.apply(5, &[stored(&[1, 2, 3])]); // engine 1, rank 1
        c.apply(6, &[stored(&[1, 9, 8, 7])]); // engine 1, rank 2: more blocks, less of the chain
        let (mut cached, mut host, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
        c.lookup(
            &[1, 2, 3, 4],
            0,
            Candidates::listed(&ws, &ranked),
            &mut cached,
            (&mut host, &mut sizes),
        );
        assert_eq!(cached, [0, 0, 0, 0, 0, 48, 16, 0]);
        assert_eq!(sizes, [0, 0, 0, 0, 0, 48, 64, 0]);
        c.lookup(
            &[1, 2, 3, 4],
            0,
            Candidates::whole(&ws),
            &mut cached,
            (&mut host, &mut sizes),
        );
        assert_eq!((cached, sizes), (vec![0, 48], vec![0, 64]));
    }

    #[test]
    fn the_index_view_carries_each_ranks_eviction_regret_and_a_whole_engine_its_worst() {
        use loadlink_wire::kv_events::BlockRemoved;
        let (ws, ranked) = fleet();
        let mut c = RouterCache::new(CacheView::Index, 16, 1000, Layout::new(2, 4));
        let removed = KvEvent::Removed(BlockRemoved {
            block_hashes: vec![2],
            medium: None,
        });
        // Engine 1, rank 1 evicts block 2 and needs it again; rank 2 evicts it for good.
        c.apply(5, &[stored(&[1, 2]), removed.clone(), stored(&[1, 2])]);
        c.apply(6, &[stored(&[1, 2]), removed]);
        let (mut cached, mut host, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
        let mut look = |c: &mut RouterCache, targets| {
            c.lookup(&[1, 2], 0, targets, &mut cached, (&mut host, &mut sizes));
            c.regret().to_vec()
        };
        let per_rank = look(&mut c, Candidates::listed(&ws, &ranked));
        assert_eq!(per_rank, [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
        assert_eq!(look(&mut c, Candidates::whole(&ws)), [0.0, 1.0]);
        // The fleet's mean over its 8 schedulers: one regrets everything, the rest nothing.
        assert_eq!(c.mean_regret(), 1.0 / 8.0);
        let mut blind = RouterCache::new(CacheView::Approx, 16, 1000, Layout::new(2, 4));
        blind.apply(5, &[stored(&[1, 2])]);
        assert_eq!(look(&mut blind, Candidates::whole(&ws)), [0.0, 0.0]);
        assert_eq!(blind.mean_regret(), 0.0);
    }

    #[test]
    fn the_approximate_tree_keeps_what_was_routed_to_a_rank_apart_from_what_went_to_the_engine() {
        let (ws, ranked) = fleet();
        let mut c = RouterCache::new(CacheView::Approx, 16, 1000, Layout::new(2, 4));
        c.dispatched(ranked[3], &[1, 2], 0, 0);
        c.dispatched(
            Candidate {
                worker: 1,
                rank: None,
            },
            &[1],
            0,
            0,
        );
        let (mut cached, mut host, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
        c.lookup(
            &[1, 2, 3],
            1,
            Candidates::listed(&ws, &ranked),
            &mut cached,
            (&mut host, &mut sizes),
        );
        assert_eq!(cached, [0, 0, 0, 32, 0, 0, 0, 0]);
        c.lookup(
            &[1, 2, 3],
            1,
            Candidates::whole(&ws),
            &mut cached,
            (&mut host, &mut sizes),
        );
        assert_eq!((cached, sizes), (vec![0, 16], vec![0, 16]));
    }
}
