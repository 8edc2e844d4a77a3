//! What the prefix cache publishes about its pages: their published names (namespaced pages are
//! filed under a key that may differ from the hash their events carry, [`crate::page_chain`]) and
//! the read-only views that name pages that way: `/cache_blocks`, snapshot cuts.
//!
//! A plain page's key is its published hash, and nothing is kept for it: the table holds only
//! namespaced pages, from their insert until no tier holds them, so an engine without namespaced
//! traffic pays one `is_empty` check per published hash.

use super::PrefixCache;
use crate::host_tier::{HOST_MEDIUM, HostTier};
use loadlink_publish::CutPage;
use loadlink_wire::kv_events::BlockStored;
use loadlink_wire::kv_namespace::Namespace;
use std::sync::Arc;

/// A namespaced page's published hash and the namespace its `BlockStored` names.
#[derive(Debug, Clone)]
pub(super) struct PageName {
    pub(super) event: i64,
    pub(super) ns: Arc<Namespace>,
}

impl PrefixCache {
    /// The hash events publish for the page filed under `key`.
    pub(super) fn published(&self, key: i64) -> i64 {
        if self.names.is_empty() {
            return key;
        }
        self.names.get(&key).map_or(key, |n| n.event)
    }

    /// Remembers the published name of a new page of namespace `ns` (nothing for a plain one).
    pub(super) fn name(&mut self, key: i64, event: i64, ns: Option<&Arc<Namespace>>) {
        if let Some(ns) = ns {
            let ns = ns.clone();
            self.names.insert(key, PageName { event, ns });
        }
    }

    /// Forgets `key`'s name once neither tier holds it.
    pub(super) fn forget_if_gone(&mut self, key: i64) {
        if !self.names.is_empty() && !self.nodes.contains_key(&key) && !self.on_host(key) {
            self.names.remove(&key);
        }
    }

    /// An empty `BlockStored` of this cache's pages on `medium`, naming namespace `ns`'s adapter
    /// and salt (SGLang's `lora_name`, `cache_salt`).
    pub(super) fn stored_template(&self, ns: Option<&Arc<Namespace>>, medium: &str) -> BlockStored {
        BlockStored {
            block_size: self.page_size as i64,
            medium: Some(medium.into()),
            lora_name: ns.and_then(|n| n.lora.as_ref()).map(|l| l.name.clone()),
            cache_salt: ns.and_then(|n| n.cache_salt.clone()),
            ..Default::default()
        }
    }

    /// Every cached page's published hash on any tier, in no order (the `/cache_blocks` debug
    /// route; two namespaces SGLang's event format does not tell apart may list a hash twice).
    pub fn block_hashes(&self) -> impl Iterator<Item = i64> + '_ {
        let host_only = self.host.iter().flat_map(|h| h.hashes());
        let host_only = host_only.filter(|h| !self.nodes.contains_key(h));
        self.nodes
            .keys()
            .copied()
            .chain(host_only)
            .map(|k| self.published(k))
    }

    /// The device pages' published hashes, in no order.
    pub fn device_hashes(&self) -> impl Iterator<Item = i64> + '_ {
        self.nodes.keys().map(|&k| self.published(k))
    }

    /// The host-tier copies' published hashes (pages may be on the device too), in no order.
    pub fn host_hashes(&self) -> impl Iterator<Item = i64> + '_ {
        self.host
            .iter()
            .flat_map(|h| h.hashes())
            .map(|k| self.published(k))
    }

    /// Whether the page filed under `key` has a host-tier copy.
    pub fn on_host(&self, key: i64) -> bool {
        self.host.as_ref().is_some_and(|h| h.contains(key))
    }

    /// Whether a page is cached under `key` (a plain page's key is its published hash).
    pub fn contains(&self, key: i64) -> bool {
        self.nodes.contains_key(&key)
    }

    /// The tokens of a cached page.
    pub fn page_tokens(&self, key: i64) -> Option<&[u32]> {
        self.nodes.get(&key).map(|n| &*n.tokens)
    }

    /// Every cached page with its parent and tier, by published hashes, for a snapshot cut: one
    /// O(pages) copy, done under the scheduler lock; ordering and encoding happen later, off the
    /// lock. Device pages (`medium: None`), then host-tier copies (`CPU_PINNED`, with the parent
    /// their store named).
    pub fn export_pages(&self) -> Vec<CutPage> {
        let host = self.host.iter().flat_map(HostTier::parents);
        let mut out =
            Vec::with_capacity(self.nodes.len() + self.host.as_ref().map_or(0, HostTier::len));
        out.extend(self.nodes.iter().map(|(&key, n)| CutPage {
            hash: self.published(key),
            parent: n.parent.map(|p| self.published(p)),
            medium: None,
        }));
        // Host copies after the device pages: a host page's parent may be on the device only.
        out.extend(host.map(|(key, parent)| CutPage {
            hash: self.published(key),
            parent: parent.map(|p| self.published(p)),
            medium: Some(HOST_MEDIUM),
        }));
        out
    }
}
