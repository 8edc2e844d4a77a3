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
//! The lookup takes the index's read lock once and, per tree-priced worker, that worker's tree
//! lock; it allocates the request's chain and two small per-worker vectors, and nothing
//! proportional to the caches.

use super::book::CacheBook;
use super::request::PromptChain;
use super::tokenizer::RouterTokenizer;
use crate::candidate::Candidates;

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
    /// Tokens per page of the chain (the engines' `--page-size`; their KV events say theirs).
    pub page_size: usize,
    pub source: PrefixSource,
    /// Cache sizes are what this router sent each worker (the tree's size, SGLang's meaning),
    /// whatever prices the prefixes; set for `cache_aware`, whose third rule reads sizes. An index
    /// fed by the engines would invert that rule under load: a busy engine's running requests hold
    /// KV that reaches its cache only when they finish, so it looks the emptiest and keeps winning.
    pub sizes_from_sent: bool,
}

/// One request's cached prefix on every candidate (same order as its candidates).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookup {
    pub prompt: PromptChain,
    /// Tokens of this prompt cached on each candidate, on any tier.
    pub cached: Vec<u64>,
    /// Of `cached`, the tokens held on a host tier only (loaded back before prefill); 0 for a
    /// candidate priced from the approximate tree, which knows no tiers.
    pub host_cached: Vec<u64>,
    /// Tokens each candidate's cache holds in all (for `cache_aware`'s smallest-cache choice).
    pub sizes: Vec<u64>,
    /// Whether each candidate was priced from the approximate tree (and so records dispatches).
    approx: Vec<bool>,
    /// Sizes come from the tree for every worker (so every dispatch is recorded).
    sent_sizes: bool,
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
        let prompt = PromptChain::of_request(path, body, &settings.tokenizer, settings.page_size)?;
        let page = settings.page_size as u64;
        let n = targets.len();
        let mut l = Lookup {
            cached: Vec::with_capacity(n),
            host_cached: Vec::with_capacity(n),
            sizes: vec![0; n],
            approx: vec![false; n],
            sent_sizes: false,
            prompt,
        };
        let indexed = self.stream_blocks(targets, &mut l.sizes);
        self.cached_tokens(targets, &l.prompt.chain, page, &mut l.cached);
        let tiered = self.host_cached_tokens(targets, &l.prompt.chain, page, &mut l.host_cached);
        let index_cached = tiered.then(|| l.cached.clone());
        l.sent_sizes = settings.sizes_from_sent;
        for (i, s) in l.sizes.iter_mut().enumerate() {
            *s *= page;
            l.approx[i] = match settings.source {
                PrefixSource::Auto => !indexed[i],
                PrefixSource::KvEvents => false,
                PrefixSource::Approx => true,
            };
        }
        if l.sent_sizes || l.approx.iter().any(|&a| a) {
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
        self.approx
            .peek_each(targets, wanted, &l.prompt.chain, now_ms, &mut trees);
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

    /// The request of `l` went to candidate `i` of `targets` at `now_ms`: its worker's approximate
    /// tree remembers it (in the rank's slot when it was routed to a rank) when the candidate is
    /// priced from it (not when the worker has left the fleet since).
    pub fn record_dispatch(&self, l: &Lookup, targets: Candidates<'_>, i: usize, now_ms: u64) {
        let tree_priced = l.approx.get(i).copied().unwrap_or(false);
        if !(tree_priced || l.sent_sizes) || l.prompt.chain.is_empty() || i >= targets.len() {
            return;
        }
        let c = targets.get(i);
        let w = &targets.workers()[c.worker as usize];
        self.approx.record(w, c.rank, &l.prompt.chain, now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::book::Worker;
    use std::sync::Arc;
    use std::time::Instant;

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
        let l = book
            .lookup(
                &settings,
                "/v1/completions",
                &body(&text),
                Candidates::whole(&ws),
                1,
            )
            .unwrap();
        assert_eq!(
            (l.prompt.prompt_tokens, l.cached.as_slice()),
            (40, &[0, 0][..])
        );
        book.record_dispatch(&l, Candidates::whole(&ws), 1, 1);
        let again = book
            .lookup(
                &settings,
                "/v1/completions",
                &body(&text),
                Candidates::whole(&ws),
                2,
            )
            .unwrap();
        assert_eq!(again.cached, [0, 36], "b holds what it was sent");
        assert_eq!(again.sizes, [0, 36]);
        let kv_only = PrefixSettings {
            source: PrefixSource::KvEvents,
            ..settings
        };
        let blind = book
            .lookup(
                &kv_only,
                "/v1/completions",
                &body(&text),
                Candidates::whole(&ws),
                3,
            )
            .unwrap();
        assert_eq!(blind.cached, [0, 0], "no stream, no KV knowledge");
        let sent = PrefixSettings {
            sizes_from_sent: true,
            ..kv_only
        };
        let l = book
            .lookup(
                &sent,
                "/v1/completions",
                &body(&text),
                Candidates::whole(&ws),
                3,
            )
            .unwrap();
        assert_eq!(
            (l.cached.as_slice(), l.sizes.as_slice()),
            (&[0, 0][..], &[0, 36][..])
        );
        book.record_dispatch(&l, Candidates::whole(&ws), 0, 3);
        let l = book
            .lookup(
                &sent,
                "/v1/completions",
                &body(&text),
                Candidates::whole(&ws),
                3,
            )
            .unwrap();
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
}
