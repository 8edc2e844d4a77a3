//! The device half of a request's lookup: of the prompt tokens a candidate's index slots hold,
//! how many sit on a host tier only (a hit that must be loaded back before prefill, see
//! [`super::tier`]).
//!
//! Kept beside [`CacheBook::cached_tokens`] rather than in it: a fleet without a host tier (every
//! engine today but SGLang's HiCache) skips it after one counter read, so the common lookup pays
//! nothing for tiers.

use super::approx_slots::key;
use super::book::CacheBook;
use super::tier::TierMatch;
use crate::candidate::Candidates;
use std::cell::RefCell;

thread_local! {
    /// Reused buffers: the tier matches of one lookup, and each slot's host-only depth.
    static SCRATCH: RefCell<(Vec<TierMatch>, Vec<u32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

impl CacheBook {
    /// For each candidate (in order) whose worker pages by `page_size` tokens (`chain` is the
    /// prompt hashed at that size), the tokens of `chain` it holds on a host tier only: its
    /// any-tier depth minus its device depth (a whole worker: of its rank with the deepest
    /// any-tier match, as [`CacheBook::cached_tokens`] picks). The other entries of `out` (sized
    /// to `targets`) are left as they are, so one call per block size fills every candidate.
    /// Returns false, writing nothing, when no slot holds anything off the device.
    pub fn host_cached_tokens_at(
        &self,
        targets: Candidates<'_>,
        chain: &[i64],
        page_size: u64,
        out: &mut [u64],
    ) -> bool {
        let g = self.read();
        if g.index.off_device_blocks() == 0 || chain.is_empty() || out.len() != targets.len() {
            return false;
        }
        SCRATCH.with(|s| {
            let (matches, depth) = &mut *s.borrow_mut();
            g.index.match_tiers_into(chain, matches);
            // Per slot, side by side: its any-tier depth and its host-only depth.
            let top = matches
                .iter()
                .map(|m| m.slot as usize + 1)
                .max()
                .unwrap_or(0);
            depth.clear();
            depth.resize(2 * top, 0);
            for m in matches.iter() {
                depth[2 * m.slot as usize] = m.held;
                depth[2 * m.slot as usize + 1] = m.held - m.device;
            }
            let at = |slot: u32| {
                let i = 2 * slot as usize;
                depth.get(i).map_or((0, 0), |&h| (h, depth[i + 1]))
            };
            for (i, o) in out.iter_mut().enumerate() {
                let c = targets.get(i);
                let e = g.workers.get(&key(&targets.workers()[c.worker as usize]));
                let Some(e) = e.filter(|e| e.block_size == page_size) else {
                    continue;
                };
                let (_, host) = e
                    .of(c.rank)
                    .map(|r| at(r.slot))
                    .max_by_key(|&(held, host)| (held, std::cmp::Reverse(host)))
                    .unwrap_or((0, 0));
                *o = u64::from(host) * page_size;
            }
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::book::Worker;
    use crate::cache::{PrefixSettings, PromptChain};
    use loadlink_wire::kv_events::{BlockRemoved, BlockStored, KvEvent, KvEventBatch};
    use std::sync::Arc;
    use std::time::Instant;

    fn batch(events: Vec<KvEvent>) -> KvEventBatch {
        KvEventBatch {
            ts: 0.0,
            events,
            attn_dp_rank: None,
        }
    }

    fn stored(medium: &str, parent: Option<i64>, h: &[i64]) -> KvEvent {
        KvEvent::Stored(BlockStored {
            block_hashes: h.to_vec(),
            parent_block_hash: parent,
            block_size: 4,
            medium: Some(medium.into()),
            ..Default::default()
        })
    }

    fn removed(medium: &str, h: &[i64]) -> KvEvent {
        KvEvent::Removed(BlockRemoved {
            block_hashes: h.to_vec(),
            medium: Some(medium.into()),
        })
    }

    #[test]
    fn a_lookup_tells_host_tier_tokens_from_device_ones() {
        let book = CacheBook::new(1000);
        let ws: Vec<_> = ["http://dev:1", "http://host:1", "http://cold:1"]
            .iter()
            .map(|u| Arc::new(Worker::new(u.to_string(), 1, None, Instant::now())))
            .collect();
        let settings = PrefixSettings {
            page_size: 4,
            ..Default::default()
        };
        let body = serde_json::json!({ "prompt": "y".repeat(4 * 4 * 6) }).to_string();
        let chain =
            PromptChain::of_request("/v1/completions", body.as_bytes(), &settings.tokenizer)
                .unwrap()
                .chain(4)
                .to_vec();
        let h = &chain[..4];
        let ids: Vec<_> = ws
            .iter()
            .map(|w| {
                let (id, stats) = book.register(w, 4, 1).remove(0);
                stats.set_view(crate::cache::View::Complete);
                id
            })
            .collect();
        let look = || {
            book.lookup(
                &settings,
                "/v1/completions",
                body.as_bytes(),
                Candidates::whole(&ws),
                1,
            )
            .unwrap()
        };
        book.apply(ids[0], &batch(vec![stored("GPU", None, h)]));
        book.apply(ids[1], &batch(vec![stored("GPU", None, h)]));
        let l = look();
        assert_eq!(
            (l.cached.as_slice(), l.host_cached.as_slice()),
            (&[16, 16, 0][..], &[0, 0, 0][..])
        );
        // The second worker's engine demotes its last three pages to the host, leaf first.
        let demoted: Vec<KvEvent> = (1..4)
            .rev()
            .flat_map(|i| {
                [
                    stored("CPU_PINNED", Some(h[i - 1]), &[h[i]]),
                    removed("GPU", &[h[i]]),
                ]
            })
            .collect();
        book.apply(ids[1], &batch(demoted));
        let l = look();
        assert_eq!(l.cached, [16, 16, 0], "a host-tier hit is still a hit");
        assert_eq!(
            l.host_cached,
            [0, 12, 0],
            "three pages of it are on the host only"
        );
        // `/workers` and `/metrics` count blocks per tier.
        let (v, _) = book.worker_json(&ws[1]);
        let want = serde_json::json!({ "device": [1], "host": [3] });
        assert_eq!(v["rank_tier_blocks"], want);
        let mut e = loadlink_wire::prom::Exposition::new();
        book.write_metrics(&mut e, &ws);
        let text = e.finish();
        assert!(
            text.contains("loadlink_kv_index_tier_blocks{tier=\"device\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("loadlink_kv_index_tier_blocks{tier=\"host\"} 3\n"),
            "{text}"
        );
        // Loaded back: the host copies stay, the pages are on the device again.
        book.apply(ids[1], &batch(vec![stored("GPU", Some(h[0]), &h[1..])]));
        assert_eq!(look().host_cached, [0, 0, 0]);
    }
}
