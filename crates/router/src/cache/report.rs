//! What the [`CacheBook`] shows an operator: the `kv_events` object of each worker in
//! `/workers`, and the `loadlink_kv_*` families of `/metrics`. Its own module so the book stays
//! about keeping the index, and the page formats stay in one place.

use super::approx_slots::key;
use super::book::CacheBook;
use super::stream::{EVENT_TYPES, ResyncReason, View};
use super::tier::Tier;
use crate::book::Worker;
use loadlink_wire::prom::{Exposition, LabelSet, LabelWriter, MetricType};
use serde_json::{Value, json};
use std::sync::atomic::Ordering::Relaxed;

/// `{type="stored|removed|cleared"}` (`type` is a keyword, so not through `label_set!`).
struct TypeLabels(&'static str);

impl LabelSet for TypeLabels {
    fn write_labels(&self, w: &mut LabelWriter<'_>) {
        w.label("type", self.0);
    }
}

loadlink_wire::label_set! {
    /// `{reason="restart|gap_not_covered|replay_failed|no_replay"}`.
    struct ReasonLabels { reason: &'static str }
}

loadlink_wire::label_set! {
    /// `{tier="device|host"}`.
    struct TierLabels { tier: &'static str }
}

loadlink_wire::label_set! {
    /// `{worker="URL"}`.
    struct WorkerLabels<'a> { worker: &'a str }
}

loadlink_wire::label_set! {
    /// `{worker="URL",rank="R"}`, as the router's other per-rank families.
    struct RankLabels<'a> { worker: &'a str, rank: u32 }
}

loadlink_wire::label_set! {
    /// `{view="complete"}`.
    struct ViewLabels<'a> { view: &'a str }
}

/// Why a worker's ranks are priced from the index and the tree together, from their views.
fn incomplete_reason(views: &[&'static str]) -> Option<String> {
    let off: Vec<String> = views
        .iter()
        .enumerate()
        .filter(|(_, v)| **v != View::Complete.as_str())
        .map(|(r, v)| format!("rank {r}: {v}"))
        .collect();
    (!off.is_empty()).then(|| {
        format!(
            "cache view incomplete ({}): priced from the index and the approximate tree together",
            off.join(", ")
        )
    })
}

impl CacheBook {
    /// `worker`'s `kv_events` object for `/workers`: `{blocks, gaps, replays, resyncs,
    /// needs_resync, last_seq: [per rank], rank_blocks: [per rank], block_size, rank_quota, over_quota_ranks: [ranks],
    /// not_indexed_reason, rank_tier_blocks: {device: [per rank], host: [per rank]},
    /// orphaned_blocks}` (the reason is null while every rank is indexed), or `null` (and the
    /// reason as the second value) when it has no KV-event stream.
    pub fn worker_json(&self, worker: &Worker) -> (Value, Option<String>) {
        let g = self.read();
        let Some(e) = g.workers.get(&key(worker)) else {
            let why = g.no_stream.get(&worker.url).cloned();
            return (Value::Null, why.or_else(|| Some("not subscribed".into())));
        };
        let (mut blocks, mut gaps, mut replays, mut resyncs, mut stale) = (0, 0, 0, 0, false);
        let (mut last, mut over, mut per_rank) = (Vec::new(), Vec::new(), Vec::new());
        let (mut views, mut epochs, mut snapshots) = (Vec::new(), Vec::new(), 0);
        let (mut device, mut host, mut orphaned) = (Vec::new(), Vec::new(), 0);
        let mut regret = Vec::new();
        for r in &e.ranks {
            let (st, s) = (g.index.slot_stats(r.slot), &r.stats);
            per_rank.push(st.blocks);
            regret.push(g.index.regret(r.slot));
            device.push(st.device_blocks);
            host.push(st.host_blocks);
            orphaned += st.orphaned_blocks;
            let view = s.view();
            stale |= !view.is_complete();
            views.push(view.as_str());
            let epoch = s.epoch.load(Relaxed);
            epochs.push((epoch > 0).then_some(epoch));
            snapshots += s.snapshots.load(Relaxed);
            if st.over_quota {
                over.push(s.rank);
            }
            blocks += st.blocks;
            stale |= st.needs_resync;
            gaps += s.gaps.load(Relaxed);
            replays += s.replays.load(Relaxed);
            resyncs += s.resyncs.load(Relaxed);
            let seq = s.last_seq.load(Relaxed);
            last.push(if seq < 0 { Value::Null } else { json!(seq) });
        }
        let quota = g.index.slot_quota();
        let reason = if !over.is_empty() {
            Some(format!(
                "rank(s) {over:?} stored more than {quota} blocks (--kv-index-max-blocks-per-rank): not indexed, priced from the approximate tree"
            ))
        } else {
            super::block_size::unmatched_reason(e.block_size).or_else(|| incomplete_reason(&views))
        };
        let v = json!({
            "blocks": blocks, "gaps": gaps, "replays": replays, "resyncs": resyncs,
            "needs_resync": stale, "last_seq": last, "rank_blocks": per_rank, "block_size": e.block_size,
            "rank_quota": quota, "over_quota_ranks": over, "not_indexed_reason": reason,
            "views": views, "epochs": epochs, "snapshots": snapshots,
            "rank_tier_blocks": { "device": device, "host": host }, "orphaned_blocks": orphaned,
            "eviction_regret": regret.iter().copied().fold(0.0, f64::max),
            "rank_eviction_regret": regret,
        });
        (v, None)
    }

    /// The `loadlink_kv_*` families, with per-worker blocks for `workers`.
    pub fn write_metrics(&self, e: &mut Exposition, workers: &[std::sync::Arc<Worker>]) {
        let c = &self.counters;
        let (len, max, dropped, tiers) = {
            let g = self.read();
            (
                g.index.len(),
                g.index.max_blocks(),
                g.index.dropped_blocks(),
                Tier::ALL.map(|t| (t, g.index.tier_blocks(t))),
            )
        };
        let gauges = [
            (
                "loadlink_kv_index_blocks",
                "Distinct KV blocks in the router's index",
                len as u64,
            ),
            (
                "loadlink_kv_index_max_blocks",
                "The index's bound (--kv-index-max-blocks)",
                max as u64,
            ),
            (
                "loadlink_kv_streams",
                "KV-event streams (worker ranks) held by the ingest threads",
                c.streams.load(Relaxed),
            ),
        ];
        for (name, help, v) in gauges {
            e.single(name, MetricType::Gauge, help, v);
        }
        let mut f = e.family(
            "loadlink_kv_index_tier_blocks",
            MetricType::Gauge,
            "Blocks the index holds per storage tier, summed over worker ranks (host: CPU_PINNED, DISK, EXTERNAL)",
        );
        for (t, n) in tiers {
            f.sample(&TierLabels { tier: t.as_str() }, n);
        }
        let counters = self.counter_rows(dropped);
        for (name, help, v) in counters {
            e.single(name, MetricType::Counter, help, v);
        }
        let mut f = e.family(
            "loadlink_kv_events_total",
            MetricType::Counter,
            "KV events applied to the index, by type",
        );
        for (t, n) in EVENT_TYPES.iter().zip(&c.events) {
            f.sample(&TypeLabels(t), n.load(Relaxed));
        }
        let mut f = e.family(
            "loadlink_kv_block_events_total",
            MetricType::Counter,
            "Block hashes carried by applied stored and removed events",
        );
        for (t, n) in EVENT_TYPES.iter().zip(&c.block_events) {
            f.sample(&TypeLabels(t), n.load(Relaxed));
        }
        let mut f = e.family(
            "loadlink_kv_resyncs_total",
            MetricType::Counter,
            "KV-index slots cleared and rebuilt, by reason",
        );
        for r in ResyncReason::ALL {
            let n = c.resyncs[r as usize].load(Relaxed);
            f.sample(&ReasonLabels { reason: r.as_str() }, n);
        }
        self.write_worker_blocks(e, workers);
    }

    /// The plain `loadlink_kv_*` counters: (name, help, value).
    fn counter_rows(&self, dropped: u64) -> [(&'static str, &'static str, u64); 15] {
        let c = &self.counters;
        [
            (
                "loadlink_kv_snapshots_requested_total",
                "Snapshots asked of engines' replay sockets (join, uncovered gap, restart, new epoch)",
                c.snapshots_requested.load(Relaxed),
            ),
            (
                "loadlink_kv_snapshots_loaded_total",
                "Snapshots loaded whole into the index",
                c.snapshots_loaded.load(Relaxed),
            ),
            (
                "loadlink_kv_snapshots_failed_total",
                "Snapshots that failed (error, timeout, malformed, or an engine without snapshots); the rank fell back to a replay",
                c.snapshots_failed.load(Relaxed),
            ),
            (
                "loadlink_kv_snapshot_blocks_total",
                "Blocks loaded from snapshots",
                c.snapshot_blocks.load(Relaxed),
            ),
            (
                "loadlink_kv_fenced_total",
                "KV batches dropped because they came from an older engine lifetime (epoch) than the rank follows",
                c.fenced.load(Relaxed),
            ),
            (
                "loadlink_kv_index_dropped_blocks_total",
                "Blocks refused at the index bound (their ranks need a resync)",
                dropped,
            ),
            (
                "loadlink_tail_reuse_refused_total",
                "Prompt tails and prefixes the tail-reuse meter could not count (its slot held another in use); uncounted ones price as before the meter",
                self.reuse.refused(),
            ),
            (
                "loadlink_kv_batches_total",
                "KV-event batches applied",
                c.batches.load(Relaxed),
            ),
            (
                "loadlink_kv_gaps_total",
                "Seq gaps detected on KV-event streams",
                c.gaps.load(Relaxed),
            ),
            (
                "loadlink_kv_replays_requested_total",
                "Replays requested from an engine's replay socket",
                c.replays_requested.load(Relaxed),
            ),
            (
                "loadlink_kv_replays_succeeded_total",
                "Replays that covered what was missing",
                c.replays_succeeded.load(Relaxed),
            ),
            (
                "loadlink_kv_replays_failed_total",
                "Replays that timed out or no longer held what was missing",
                c.replays_failed.load(Relaxed),
            ),
            (
                "loadlink_kv_replays_cut_short_total",
                "Replays that went silent before their end (the engine shed at its send HWM), continued from there",
                c.replays_cut_short.load(Relaxed),
            ),
            (
                "loadlink_kv_duplicates_total",
                "Live batches skipped because a replay had applied them already",
                c.duplicates.load(Relaxed),
            ),
            (
                "loadlink_kv_decode_errors_total",
                "KV-event messages dropped as malformed",
                c.decode_errors.load(Relaxed),
            ),
        ]
    }

    fn write_worker_blocks(&self, e: &mut Exposition, workers: &[std::sync::Arc<Worker>]) {
        let g = self.read();
        let mut rows = Vec::with_capacity(workers.len());
        let mut ranks = Vec::new();
        let mut views = [0u64; View::ALL.len()];
        for w in workers {
            if let Some(entry) = g.workers.get(&key(w)) {
                let stats = entry.ranks.iter().map(|r| g.index.slot_stats(r.slot));
                let (blocks, mut stale) =
                    stats.fold((0, false), |(b, st), x| (b + x.blocks, st | x.needs_resync));
                for r in &entry.ranks {
                    let v = r.stats.view();
                    stale |= !v.is_complete();
                    views[v as usize] += 1;
                }
                rows.push((&w.url, blocks, stale));
                for r in &entry.ranks {
                    let st = g.index.slot_stats(r.slot);
                    ranks.push((&w.url, r.stats.rank, st.blocks, g.index.regret(r.slot)));
                }
            }
        }
        drop(g);
        let mut f = e.family(
            "loadlink_rank_kv_blocks",
            MetricType::Gauge,
            "Blocks the index holds for one DP rank of a worker",
        );
        for (url, rank, blocks, _) in &ranks {
            f.sample(
                &RankLabels {
                    worker: url,
                    rank: *rank,
                },
                *blocks,
            );
        }
        let mut f = e.family(
            "loadlink_rank_eviction_regret",
            MetricType::Gauge,
            "Share of the rank's device evictions stored again within one pool turnover (KV events)",
        );
        for (url, rank, _, regret) in &ranks {
            let labels = RankLabels {
                worker: url,
                rank: *rank,
            };
            f.sample(&labels, loadlink_wire::prom::Number::Float(*regret));
        }
        let mut f = e.family(
            "loadlink_worker_kv_blocks",
            MetricType::Gauge,
            "Blocks the index holds for a worker (summed over its ranks)",
        );
        for (url, blocks, _) in &rows {
            f.sample(&WorkerLabels { worker: url }, *blocks);
        }
        let mut f = e.family(
            "loadlink_kv_rank_views",
            MetricType::Gauge,
            "Worker ranks with a KV-event stream, by how complete the index's view of their cache is (only complete ranks are priced from the index alone)",
        );
        for v in View::ALL {
            f.sample(&ViewLabels { view: v.as_str() }, views[v as usize]);
        }
        let mut f = e.family(
            "loadlink_worker_kv_needs_resync",
            MetricType::Gauge,
            "1 while a worker's cache view is known to be incomplete (a rank not complete, or blocks dropped at the bound)",
        );
        for (url, _, stale) in &rows {
            f.sample(&WorkerLabels { worker: url }, u64::from(*stale));
        }
    }
}
