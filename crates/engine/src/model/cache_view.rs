//! What the rest of the engine reads of a rank's prefix cache through its scheduler: the KV events
//! to publish, the pages per tier (`/cache_blocks`), the counters, and the cache itself for
//! snapshot cuts. Reads only, beside the scheduling logic in `mod.rs`.

use super::Scheduler;
use crate::radix::{CacheStats, PageChain, PrefixCache};
use loadlink_wire::kv_events::KvEvent;

impl Scheduler {
    /// The KV events since the last call (empty unless built [`Scheduler::with_kv_events`]).
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.cache.take_events()
    }

    /// Every cached page's published hash, sorted, each once (the `/cache_blocks` debug route).
    pub fn cached_blocks(&self) -> Vec<i64> {
        let mut v: Vec<i64> = self.cache.block_hashes().collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The cached pages per tier, each sorted: (on the device, with a host copy).
    pub fn tier_blocks(&self) -> (Vec<i64>, Vec<i64>) {
        let mut device: Vec<i64> = self.cache.device_hashes().collect();
        let mut host: Vec<i64> = self.cache.host_hashes().collect();
        device.sort_unstable();
        device.dedup();
        host.sort_unstable();
        host.dedup();
        (device, host)
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// The rank's prefix cache, read-only (snapshot cuts, debug routes).
    pub fn prefix_cache(&self) -> &PrefixCache {
        &self.cache
    }

    /// Tokens of `chain`'s longest prefix that a queued or running request's prompt shares: pages
    /// the cache does not hold yet but will once that request finishes (a request inserts its
    /// prompt when it finishes). With [`PrefixCache::matched_tokens`] it says how much of a prompt
    /// this rank will have cached, which is what an oracle router knows and a real one does not.
    pub fn queued_match(&self, chain: &PageChain) -> u64 {
        let shared = |r: &super::Req| {
            r.chain
                .hashes
                .iter()
                .zip(&chain.hashes)
                .take_while(|(a, b)| a == b)
                .count()
        };
        let pages = (self.waiting.iter())
            .chain(self.chunked.as_ref())
            .chain(&self.running)
            .map(shared)
            .max()
            .unwrap_or(0);
        pages as u64 * self.cfg.page_size as u64
    }
}
