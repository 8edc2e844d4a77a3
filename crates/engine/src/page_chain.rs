//! A token sequence's page hashes as the engine's cache names its pages (SGLang's SHA-256 chain,
//! [`loadlink_wire::kv_events::page_digest`]), extended as the sequence grows: a request hashes its
//! prompt once and only its new full pages as it decodes.
//!
//! A request in a cache namespace ([`Namespace`]: a LoRA adapter, `extra_key`, `cache_salt`) has
//! two names per page, and they differ only in one case:
//!
//! * the **key** the engine's cache files the page under. It must keep every namespace apart, as
//!   SGLang's radix tree keys on `(extra_key ++ lora_id, cache_salt)`: the chain starts from the
//!   salt's prior, and the whole `extra_key` (the adapter's id included) seeds a re-hash;
//! * the **published** hash of its KV events, SGLang's default event format
//!   ([`Namespace::event_hashes`]): the same salted chain, re-hashed only when there is an
//!   adapter. So a request with an `extra_key` and no adapter publishes the plain chain while the
//!   engine keeps its pages apart; only then are the two names different, and only then does the
//!   chain carry the published hashes separately.

use loadlink_wire::kv_events::{block_hash, page_digest};
use loadlink_wire::kv_namespace::{Namespace, namespace_seed, namespaced_block_hash};
use std::sync::Arc;

/// How a namespaced chain re-hashes its pages.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seeds {
    /// Re-hashes the keys (`Some` with an `extra_key` or an adapter).
    key: Option<[u8; 32]>,
    /// Re-hashes the published hashes (`Some` with an adapter: then equal to `key`).
    event: Option<[u8; 32]>,
    ns: Arc<Namespace>,
}

/// The page hashes of a token sequence, with the digest the next page would chain from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageChain {
    /// The cache's keys, one per full page.
    pub hashes: Vec<i64>,
    /// The published hashes where they differ from the keys, else empty.
    events: Vec<i64>,
    last: Option<[u8; 32]>,
    /// Tokens already hashed (a multiple of the page size).
    hashed: usize,
    /// `None`: the plain namespace (keys and published hashes are the plain chain).
    seeds: Option<Box<Seeds>>,
}

impl PageChain {
    /// Hashes every full page of `tokens` not hashed yet (`tokens` must extend what was hashed).
    pub fn extend(&mut self, tokens: &[u32], page_size: usize) {
        let page_size = page_size.max(1);
        while self.hashed + page_size <= tokens.len() {
            let d = page_digest(
                self.last.as_ref(),
                &tokens[self.hashed..self.hashed + page_size],
            );
            let raw = block_hash(&d);
            match self.seeds.as_deref() {
                None => self.hashes.push(raw),
                Some(s) => {
                    self.hashes.push(namespaced_block_hash(raw, s.key.as_ref()));
                    if s.key != s.event {
                        self.events
                            .push(namespaced_block_hash(raw, s.event.as_ref()));
                    }
                }
            }
            self.last = Some(d);
            self.hashed += page_size;
        }
    }

    /// The plain namespace's chain of `tokens`.
    pub fn of(tokens: &[u32], page_size: usize) -> Self {
        let mut c = PageChain::default();
        c.extend(tokens, page_size);
        c
    }

    /// The chain of `tokens` in namespace `ns` (`None`, or a plain one: [`PageChain::of`]).
    pub fn in_namespace(tokens: &[u32], page_size: usize, ns: Option<Arc<Namespace>>) -> Self {
        let mut c = PageChain::default();
        if let Some(ns) = ns.filter(|n| !n.is_plain()) {
            c.last = ns.prior();
            let extra_key = ns.engine_extra_key();
            c.seeds = Some(Box::new(Seeds {
                key: namespace_seed(extra_key.as_deref(), None),
                event: ns.event_seed(),
                ns,
            }));
        }
        c.extend(tokens, page_size);
        c
    }

    /// The hashes KV events publish for these pages (SGLang's default event format).
    pub fn published(&self) -> &[i64] {
        if self.events.is_empty() {
            &self.hashes
        } else {
            &self.events
        }
    }

    /// The namespace, unless plain.
    pub fn namespace(&self) -> Option<&Arc<Namespace>> {
        self.seeds.as_deref().map(|s| &s.ns)
    }
}
