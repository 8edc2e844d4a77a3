//! The request path's question to the cache book: for this request, how many of its prompt tokens
//! does each worker hold, and how much does each cache hold in all?
//!
//! * Workers with a KV-event stream answer from the index (what their engines announced).
//! * Workers without one answer from the router's approximate tree of what it sent them
//!   ([`super::ApproxTree`], one per worker), which [`CacheBook::record_dispatch`] feeds after each
//!   pick. The trees live in the book, so removing a worker forgets both views at once.
//! * A worker with a rank over its index quota answers from both: the index for its indexed ranks,
//!   the tree for what it was sent, whichever holds more of the prompt.
//! * `--prefix-source` can force one view for every worker (`kv-events`, `approx`), which is how
//!   the evidence compares them on the same fleet.
//!
//! * Each indexed worker is matched with the request's chain at the block size it advertises
//!   (one hash pass and one match per distinct size among the candidates, see `request.rs`); a
//!   worker whose size the router cannot hash at (`block_size.rs`) is priced from the tree.
//!
//! The lookup takes the index's read lock once per distinct block size and, per tree-priced
//! worker, that worker's tree lock; it allocates the request's chains and a few small
//! per-worker vectors, and nothing proportional to the caches.

use super::block_size::unmatched_reason;
use super::book::CacheBook;
use super::request::{ChainNamespace, PromptChain};
use super::tokenizer::RouterTokenizer;
use crate::candidate::Candidates;
use smallvec::SmallVec;

/// Which view prices a worker's cached prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefixSource {
    /// The KV index for workers with a stream, the approximate tree for the rest.
    #[default]
    Auto,
    /// The KV index only (workers without a stream count as cold).
    KvEvents,
    /// The approximate tree only, as SGLang's `cache_aware` router.
    Approx,
}

impl PrefixSource {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(PrefixSource::Auto),
            "kv-events" => Ok(PrefixSource::KvEvents),
            "approx" => Ok(PrefixSource::Approx),
            o => Err(format!(
                "--prefix-source {o:?}: expected auto, kv-events or approx"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PrefixSource::Auto => "auto",
            PrefixSource::KvEvents => "kv-events",
            PrefixSource::Approx => "approx",
        }
    }
}

/// How the router turns requests into cache lookups (part of the router's state).
#[derive(Debug, Default)]
pub struct PrefixSettings {
    pub tokenizer: RouterTokenizer,
    /// Tokens per page of the approximate tree's chains (workers with KV events are matched at
    /// the block size they advertise).
    pub page_size: usize,
    pub source: PrefixSource,
    /// Cache sizes are what this router sent each worker (the tree's size, SGLang's meaning),
    /// whatever prices the prefixes; set for `cache_aware`, whose third rule reads sizes. An index
    /// fed by the engines would invert that rule under load: a busy engine's running requests hold
    /// KV that reaches its cache only when they finish, so it looks the emptiest and keeps winning.
    pub sizes_from_sent: bool,
}

/// One request's cached prefix on every candidate (same order as its candidates).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lookup {
    pub prompt: PromptChain,
    /// Tokens of this prompt cached on each candidate, on any tier.
    pub cached: Vec<u64>,
    /// Of `cached`, the tokens held on a host tier only (loaded back before prefill); 0 for a
    /// candidate priced from the approximate tree, which knows no tiers.
    pub host_cached: Vec<u64>,
    /// Tokens each candidate's cache holds in all (for `cache_aware`'s smallest-cache choice).
    pub sizes: Vec<u64>,
    /// Each candidate's eviction regret, 0–1, from its KV-event streams ([`super::regret`]; 0
    /// for a worker without one).
    pub regret: Vec<f32>,
    /// Whether each candidate was priced from the approximate tree (and so records dispatches).
    approx: Vec<bool>,
    /// Sizes come from the tree for every worker (so every dispatch is recorded).
    sent_sizes: bool,
    /// The approximate tree's page size (the router's `--page-size`).
    tree_page: u64,
}

impl CacheBook {
    /// The request at `path` with `body` as the caches see it, against `targets`; `None` when it
    /// has no prompt to price (not a generation route, or a body the engine will refuse).
    pub fn lookup(
        &self,
        settings: &PrefixSettings,
        path: &str,
        body: &[u8],
        targets: Candidates<'_>,
        now_ms: u64,
    ) -> Option<Lookup> {
        let ns = ChainNamespace::default();
        self.lookup_in(settings, path, body, ns, targets, now_ms)
    }

    /// [`CacheBook::lookup`] for a request in cache namespace `ns` (its adapter and salt): the
    /// index and the approximate tree are matched with the chain the engine hashes in it.
    pub fn lookup_in(
        &self,
        settings: &PrefixSettings,
        path: &str,
        body: &[u8],
        ns: ChainNamespace,
        targets: Candidates<'_>,
        now_ms: u64,
    ) -> Option<Lookup> {
        let prompt = PromptChain::of_request(path, body, &settings.tokenizer)?.in_namespace(ns);
        let page = settings.page_size as u64;
        let n = targets.len();
        let mut l = Lookup {
            cached: vec![0; n],
            host_cached: vec![0; n],
            sizes: vec![0; n],
            regret: Vec::with_capacity(n),
            approx: vec![false; n],
            sent_sizes: settings.sizes_from_sent,
            tree_page: page,
            prompt,
        };
        let mut block_sizes = Vec::with_capacity(n);
        let indexed = self.stream_blocks(targets, &mut l.sizes, &mut block_sizes, &mut l.regret);
        for (i, s) in l.sizes.iter_mut().enumerate() {
            // A size the router does not match says nothing it can use: the tree sizes that worker.
            *s = match unmatched_reason(block_sizes[i]) {
                None => s.saturating_mul(block_sizes[i]),
                Some(_) => 0,
            };
            l.approx[i] = match settings.source {
                PrefixSource::Auto => !indexed[i],
                PrefixSource::KvEvents => false,
                PrefixSource::Approx => true,
            };
        }
        // One chain per block size among the candidates with a stream (a complete view or not:
        // an incomplete one still counts what it knows), hashed before the index's lock is
        // taken, then one match per size.
        for (i, &size) in block_sizes.iter().enumerate() {
            let matchable = indexed[i] || (size > 0 && unmatched_reason(size).is_none());
            if matchable && settings.source != PrefixSource::Approx {
                l.prompt.chain(size);
            }
        }
        let sizes: SmallVec<[u64; 4]> = l.prompt.hashed_sizes().collect();
        let mut tiered = false;
        for size in sizes {
            let chain = l.prompt.hashed(size).unwrap_or_default();
            self.cached_tokens_at(targets, chain, size, &mut l.cached);
            tiered |= self.host_cached_tokens_at(targets, chain, size, &mut l.host_cached);
        }
        let index_cached = tiered.then(|| l.cached.clone());
        if l.sent_sizes || l.approx.iter().any(|&a| a) {
            l.prompt.chain(page);
            let only_tree = settings.source == PrefixSource::Approx;
            self.approx_into(&mut l, targets, page, now_ms, only_tree);
        }
        // Where the tree's answer replaced the index's, no part of it is known to be off-device.
        for (i, before) in index_cached.iter().flatten().enumerate() {
            if l.cached[i] != *before {
                l.host_cached[i] = 0;
            }
        }
        Some(l)
    }

    /// Fills the approximate trees' answers for the workers `l` prices from them (replacing the
    /// index's answer when `only_tree`, else keeping the larger of the two).
    fn approx_into(
        &self,
        l: &mut Lookup,
        targets: Candidates<'_>,
        page: u64,
        now_ms: u64,
        only_tree: bool,
    ) {
        let mut trees = Vec::new();
        let wanted = |i: usize| l.sent_sizes || l.approx[i];
        let chain = l.prompt.hashed(page).unwrap_or_default();
        self.approx
            .peek_each(targets, wanted, chain, now_ms, &mut trees);
        for (i, &(blocks, held)) in trees.iter().enumerate() {
            if !(l.sent_sizes || l.approx[i]) {
                continue;
            }
            let (size, cached) = (blocks * page, u64::from(held) * page);
            if l.sent_sizes || only_tree {
                l.sizes[i] = size;
            } else {
                l.sizes[i] = l.sizes[i].max(size);
            }
            if l.approx[i] {
                l.cached[i] = if only_tree {
                    cached
                } else {
                    l.cached[i].max(cached)
                };
            }
        }
    }

    /// The request of `l` was placed at `now_ms` (once per request, not per retry): the tail-reuse
    /// meter counts its tail ([`super::reuse`]).
    pub fn record_placed(&self, l: &Lookup, now_ms: u64) {
        if let Some((block, chain)) = l.prompt.any_chain() {
            let deepest = l.cached.iter().copied().max().unwrap_or(0);
            self.reuse.record(chain, block, deepest, now_ms);
        }
    }

    /// The request of `l` went to candidate `i` of `targets` at `now_ms`: its worker's approximate
    /// tree remembers it (in the rank's slot when it was routed to a rank) when the candidate is
    /// priced from it (not when the worker has left the fleet since).
    pub fn record_dispatch(&self, l: &Lookup, targets: Candidates<'_>, i: usize, now_ms: u64) {
        let tree_priced = l.approx.get(i).copied().unwrap_or(false);
        let chain = l.prompt.hashed(l.tree_page).unwrap_or_default();
        if !(tree_priced || l.sent_sizes) || chain.is_empty() || i >= targets.len() {
            return;
        }
        let c = targets.get(i);
        let w = &targets.workers()[c.worker as usize];
        self.approx.record(w, c.rank, chain, now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::book::Worker;
    use std::sync::Arc;
    use std::time::Instant;

    /// `book`'s lookup of a completion of `text` against every worker of `ws`, whole.
    fn look(
        book: &CacheBook,
        settings: &PrefixSettings,
        text: &str,
        ws: &[Arc<Worker>],
        now_ms: u64,
    ) -> Lookup {
        book.lookup(
            settings,
            "/v1/completions",
            &body(text),
            Candidates::whole(ws),
            now_ms,
        )
        .unwrap()
    }

    fn body(text: &str) -> Vec<u8> {
        serde_json::json!({ "prompt": text })
            .to_string()
            .into_bytes()
    }

    #[test]
    fn workers_without_streams_learn_from_what_was_sent() {
        let book = CacheBook::default();
        let epoch = Instant::now();
        let ws: Vec<_> = ["http://a", "http://b"]
            .iter()
            .map(|u| Arc::new(Worker::new(u.to_string(), 1, None, epoch)))
            .collect();
        let settings = PrefixSettings {
            page_size: 4,
            ..Default::default()
        };
        let text = "x".repeat(4 * 4 * 10); // 40 tokens: 9 full pages of what is matched
        let l = look(&book, &settings, &text, &ws, 1);
        assert_eq!(
            (l.prompt.prompt_tokens, l.cached.as_slice()),
            (40, &[0, 0][..])
        );
        book.record_dispatch(&l, Candidates::whole(&ws), 1, 1);
        let again = look(&book, &settings, &text, &ws, 2);
        assert_eq!(again.cached, [0, 36], "b holds what it was sent");
        assert_eq!(again.sizes, [0, 36]);
        let kv_only = PrefixSettings {
            source: PrefixSource::KvEvents,
            ..settings
        };
        let blind = look(&book, &kv_only, &text, &ws, 3);
        assert_eq!(blind.cached, [0, 0], "no stream, no KV knowledge");
        let sent = PrefixSettings {
            sizes_from_sent: true,
            ..kv_only
        };
        let l = look(&book, &sent, &text, &ws, 3);
        assert_eq!(
            (l.cached.as_slice(), l.sizes.as_slice()),
            (&[0, 0][..], &[0, 36][..])
        );
        book.record_dispatch(&l, Candidates::whole(&ws), 0, 3);
        let l = look(&book, &sent, &text, &ws, 3);
        assert_eq!(
            l.sizes,
            [36, 36],
            "sizes are what was sent, priced from the index or not"
        );
        assert_eq!(l.cached, [0, 0], "prefixes still come from the index");
        book.unregister(&ws[1]);
        let forgot = book
            .lookup(
                &PrefixSettings {
                    page_size: 4,
                    ..Default::default()
                },
                "/v1/completions",
                &body(&text),
                Candidates::whole(&ws),
                4,
            )
            .unwrap();
        assert_eq!(
            forgot.cached,
            [36, 0],
            "a removed worker's tree is forgotten, the others kept"
        );
        assert_eq!(PrefixSource::parse("kv-events"), Ok(PrefixSource::KvEvents));
        assert!(
            PrefixSource::parse("x")
                .unwrap_err()
                .contains("auto, kv-events or approx")
        );
    }

    #[test]
    fn each_worker_is_matched_at_its_own_block_size() {
        use loadlink_wire::kv_events::{BlockStored, KvEvent, KvEventBatch, page_hashes};
        let book = CacheBook::default();
        let epoch = Instant::now();
        let sizes = [1u64, 16, 64, 1 << 62];
        let ws: Vec<_> = sizes
            .iter()
            .map(|b| Arc::new(Worker::new(format!("http://w{b}"), 1, None, epoch)))
            .collect();
        let text = "y".repeat(4 * 200); // 200 tokens: 199 matchable
        let ids = loadlink_wire::tokenize::tokenize(&text);
        for (w, &b) in ws.iter().zip(&sizes) {
            let (id, stats) = book.register(w, b, 1).remove(0);
            stats.set_view(crate::cache::View::Complete); // as after a snapshot
            let hashes = page_hashes(&ids, if b > 64 { 1 } else { b as usize });
            let stored = KvEvent::Stored(BlockStored {
                block_hashes: hashes,
                block_size: b as i64,
                ..Default::default()
            });
            let batch = KvEventBatch {
                ts: 0.0,
                events: vec![stored],
                attn_dp_rank: None,
            };
            book.apply(id, &batch);
        }
        let settings = PrefixSettings {
            page_size: 16,
            ..Default::default()
        };
        let l = look(&book, &settings, &text, &ws, 1);
        assert_eq!(
            l.cached,
            [199, 192, 192, 0],
            "full pages of the 199 matchable tokens at 1, 16 and 64; the absurd size is not matched"
        );
        assert_eq!(
            l.sizes[..3],
            [200, 192, 192],
            "blocks times each worker's own size"
        );
        assert_eq!(
            l.approx,
            [false, false, false, true],
            "the unmatched size is priced from the tree"
        );
        assert_eq!(
            l.sizes[3], 0,
            "and sized by it (its 200 indexed blocks are not trusted)"
        );
        assert_eq!(
            l.prompt.hashed_sizes().collect::<Vec<_>>(),
            [1, 16, 64],
            "hashed once per size among the candidates, the router's 16 shared with the tree"
        );
        let (v, _) = book.worker_json(&ws[3]);
        let why = v["not_indexed_reason"].as_str().unwrap();
        assert!(why.contains("block_size 4611686018427387904"), "{why}");
        assert!(book.worker_json(&ws[0]).0["not_indexed_reason"].is_null());
    }
}
