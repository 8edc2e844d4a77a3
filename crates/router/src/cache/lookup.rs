//! The request path's question to the cache book: for this request, how many of its prompt tokens
//! does each worker hold, and how much does each cache hold in all?
//!
//! * Workers with a KV-event stream answer from the index (what their engines announced).
//! * Workers without one answer from the router's approximate tree of what it sent them
//!   ([`ApproxTree`]), which [`CacheBook::record_dispatch`] feeds after each pick. The tree lives in
//!   the book, so removing a worker forgets both views at once.
//! * `--prefix-source` can force one view for every worker (`kv-events`, `approx`), which is how
//!   the evidence compares them on the same fleet.
//!
//! The lookup takes the index's read lock once and the tree's lock once; it allocates the
//! request's chain and two small per-worker vectors, and nothing proportional to the caches.

use super::approx::ApproxTree;
use super::index::Slot;
use super::request::PromptChain;
use super::stream::{CacheBook, key};
use super::tokenizer::RouterTokenizer;
use crate::book::Worker;
use std::collections::HashMap;
use std::sync::Arc;

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

/// One request's cached prefix on every worker (same order as the worker list).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookup {
    pub prompt: PromptChain,
    /// Tokens of this prompt cached on each worker.
    pub cached: Vec<u64>,
    /// Tokens each worker's cache holds in all (for `cache_aware`'s smallest-cache choice).
    pub sizes: Vec<u64>,
    /// Whether each worker was priced from the approximate tree (and so records dispatches).
    approx: Vec<bool>,
    /// Sizes come from the tree for every worker (so every dispatch is recorded).
    sent_sizes: bool,
}

/// The approximate tree and which slot each worker has in it.
#[derive(Debug)]
pub(crate) struct ApproxSlots {
    pub(crate) tree: ApproxTree,
    slots: HashMap<usize, Slot>,
    free: Vec<Slot>,
    next: Slot,
    matches: Vec<(Slot, u32)>,
}

/// The approximate tree's bound per worker (blocks) and age.
pub const APPROX_MAX_BLOCKS: usize = 1 << 20;
pub const APPROX_TTL_MS: u64 = 120_000;

impl Default for ApproxSlots {
    fn default() -> Self {
        ApproxSlots {
            tree: ApproxTree::new(APPROX_MAX_BLOCKS, APPROX_TTL_MS),
            slots: HashMap::new(),
            free: Vec::new(),
            next: 0,
            matches: Vec::new(),
        }
    }
}

impl ApproxSlots {
    fn slot_of(&mut self, w: &Worker) -> Slot {
        let (free, next) = (&mut self.free, &mut self.next);
        *self.slots.entry(key(w)).or_insert_with(|| {
            free.pop().unwrap_or_else(|| {
                *next += 1;
                *next - 1
            })
        })
    }

    /// Forgets `w`'s slot (the worker left).
    pub(crate) fn forget(&mut self, w: &Worker) {
        if let Some(s) = self.slots.remove(&key(w)) {
            self.tree.clear_slot(s);
            self.free.push(s);
        }
    }
}

impl CacheBook {
    /// The request at `path` with `body` as the caches see it, against `workers`; `None` when it
    /// has no prompt to price (not a generation route, or a body the engine will refuse).
    pub fn lookup(
        &self,
        settings: &PrefixSettings,
        path: &str,
        body: &[u8],
        workers: &[Arc<Worker>],
        now_ms: u64,
    ) -> Option<Lookup> {
        let prompt = PromptChain::of_request(path, body, &settings.tokenizer, settings.page_size)?;
        let page = settings.page_size as u64;
        let mut l = Lookup {
            cached: Vec::with_capacity(workers.len()),
            sizes: vec![0; workers.len()],
            approx: vec![false; workers.len()],
            sent_sizes: false,
            prompt,
        };
        let has_stream = self.stream_blocks(workers, &mut l.sizes);
        self.cached_tokens(workers, &l.prompt.chain, page, &mut l.cached);
        l.sent_sizes = settings.sizes_from_sent;
        for (i, s) in l.sizes.iter_mut().enumerate() {
            *s *= page;
            l.approx[i] = match settings.source {
                PrefixSource::Auto => !has_stream[i],
                PrefixSource::KvEvents => false,
                PrefixSource::Approx => true,
            };
        }
        if l.sent_sizes || l.approx.iter().any(|&a| a) {
            self.approx_into(&mut l, workers, page, now_ms);
        }
        Some(l)
    }

    /// Fills the approximate tree's answers for the workers `l` prices from it.
    fn approx_into(&self, l: &mut Lookup, workers: &[Arc<Worker>], page: u64, now_ms: u64) {
        let mut a = self.approx_lock();
        a.tree.expire(now_ms);
        let mut matches = std::mem::take(&mut a.matches);
        a.tree.match_into(&l.prompt.chain, &mut matches);
        for (i, w) in workers.iter().enumerate() {
            let slot = a.slots.get(&key(w)).copied();
            if l.sent_sizes || l.approx[i] {
                l.sizes[i] = slot.map_or(0, |s| a.tree.slot_stats(s).blocks) * page;
            }
            if l.approx[i] {
                let held =
                    slot.and_then(|s| matches.iter().find(|(m, _)| *m == s).map(|(_, b)| *b));
                l.cached[i] = u64::from(held.unwrap_or(0)) * page;
            }
        }
        a.matches = matches;
    }

    /// The request of `l` went to `workers[i]` at `now_ms`: the approximate tree remembers it when
    /// that worker is priced from the tree.
    pub fn record_dispatch(&self, l: &Lookup, workers: &[Arc<Worker>], i: usize, now_ms: u64) {
        let tree_priced = l.approx.get(i).copied().unwrap_or(false);
        if !(tree_priced || l.sent_sizes) || l.prompt.chain.is_empty() {
            return;
        }
        let mut a = self.approx_lock();
        let slot = a.slot_of(&workers[i]);
        a.tree.record(slot, &l.prompt.chain, now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
            .lookup(&settings, "/v1/completions", &body(&text), &ws, 1)
            .unwrap();
        assert_eq!(
            (l.prompt.prompt_tokens, l.cached.as_slice()),
            (40, &[0, 0][..])
        );
        book.record_dispatch(&l, &ws, 1, 1);
        let again = book
            .lookup(&settings, "/v1/completions", &body(&text), &ws, 2)
            .unwrap();
        assert_eq!(again.cached, [0, 36], "b holds what it was sent");
        assert_eq!(again.sizes, [0, 36]);
        let kv_only = PrefixSettings {
            source: PrefixSource::KvEvents,
            ..settings
        };
        let blind = book
            .lookup(&kv_only, "/v1/completions", &body(&text), &ws, 3)
            .unwrap();
        assert_eq!(blind.cached, [0, 0], "no stream, no KV knowledge");
        let sent = PrefixSettings {
            sizes_from_sent: true,
            ..kv_only
        };
        let l = book
            .lookup(&sent, "/v1/completions", &body(&text), &ws, 3)
            .unwrap();
        assert_eq!(
            (l.cached.as_slice(), l.sizes.as_slice()),
            (&[0, 0][..], &[0, 36][..])
        );
        book.record_dispatch(&l, &ws, 0, 3);
        let l = book
            .lookup(&sent, "/v1/completions", &body(&text), &ws, 3)
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
                &ws,
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
