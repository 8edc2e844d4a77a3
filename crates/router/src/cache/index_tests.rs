//! Unit tests of [`super::KvIndex`] (the nesting property test is `tests/kv_index_nesting.rs`).

use super::*;
use crate::cache::regret::Regret;
use loadlink_wire::kv_events::{BlockRemoved, BlockStored};

fn stored(hashes: &[i64]) -> KvEvent {
    KvEvent::Stored(BlockStored {
        block_hashes: hashes.to_vec(),
        block_size: 16,
        ..Default::default()
    })
}

fn chained(parent: Option<i64>, hashes: &[i64]) -> KvEvent {
    KvEvent::Stored(BlockStored {
        parent_block_hash: parent,
        block_hashes: hashes.to_vec(),
        block_size: 16,
        ..Default::default()
    })
}

fn removed(hashes: &[i64]) -> KvEvent {
    KvEvent::Removed(BlockRemoved {
        block_hashes: hashes.to_vec(),
        medium: None,
    })
}

#[test]
fn longest_prefix_per_slot() {
    let mut ix = KvIndex::new(1000);
    ix.apply(0, &stored(&[1, 2, 3, 4]));
    ix.apply(1, &stored(&[1, 2]));
    ix.apply(2, &stored(&[9]));
    let mut out = Vec::new();
    ix.match_into(&[1, 2, 3, 5, 6], &mut out);
    out.sort();
    assert_eq!(out, vec![(0, 3), (1, 2)]);
    ix.match_into(&[7, 1], &mut out);
    assert!(out.is_empty(), "a chain's first block is its root");
    ix.apply(0, &removed(&[4, 3]));
    ix.match_into(&[1, 2, 3], &mut out);
    out.sort();
    assert_eq!(out, vec![(0, 2), (1, 2)]);
    assert_eq!(ix.slot_stats(0).blocks, 2);
}

#[test]
fn clear_forgets_one_slot_only_and_the_bound_is_counted() {
    let mut ix = KvIndex::new(3);
    ix.apply(0, &stored(&[1, 2]));
    ix.apply(1, &stored(&[1, 3]));
    assert_eq!(ix.len(), 3);
    ix.apply(1, &stored(&[4]));
    assert_eq!(ix.dropped_blocks(), 1);
    assert!(ix.slot_stats(1).needs_resync);
    ix.apply(0, &KvEvent::AllCleared);
    assert_eq!(ix.len(), 2);
    let mut out = Vec::new();
    ix.match_into(&[1, 3], &mut out);
    assert_eq!(out, vec![(1, 2)]);
    assert_eq!(ix.slot_stats(0).blocks, 0);
}

#[test]
fn a_store_under_a_parent_the_slot_lacks_is_skipped_and_counted() {
    let mut ix = KvIndex::new(4);
    ix.apply(0, &stored(&[1, 2]));
    ix.apply(1, &stored(&[7, 8, 9])); // 9 is dropped at the bound
    ix.apply(1, &chained(Some(9), &[10, 11]));
    ix.apply(0, &chained(Some(5), &[6]));
    assert_eq!(ix.dropped_blocks(), 1);
    assert_eq!(
        ix.slot_stats(1).orphaned_blocks,
        2,
        "10 and 11 hang below 9"
    );
    assert_eq!(ix.slot_stats(0).orphaned_blocks, 1, "5 was never announced");
    ix.apply(0, &chained(Some(2), &[3]));
    assert_eq!(ix.dropped_blocks(), 2);
    let mut out = Vec::new();
    ix.match_into(&[7, 8, 9, 10, 11], &mut out);
    assert_eq!(out, vec![(1, 2)], "nothing below the dropped block");
}

fn on(medium: &str, parent: Option<i64>, hashes: &[i64]) -> KvEvent {
    KvEvent::Stored(BlockStored {
        parent_block_hash: parent,
        block_hashes: hashes.to_vec(),
        medium: Some(medium.into()),
        ..Default::default()
    })
}

fn off(medium: &str, hashes: &[i64]) -> KvEvent {
    KvEvent::Removed(BlockRemoved {
        block_hashes: hashes.to_vec(),
        medium: Some(medium.into()),
    })
}

#[test]
fn demoted_blocks_match_on_the_host_tier_until_loaded_back_or_evicted() {
    let mut ix = KvIndex::new(1000);
    ix.apply(0, &stored(&[1, 2, 3, 4]));
    // HiCache demotes the device leaves 4 then 3: host copy first, then the device removal.
    for h in [4, 3] {
        ix.apply(0, &on("CPU_PINNED", Some(h - 1), &[h]));
        ix.apply(0, &off("GPU", &[h]));
    }
    let mut out = Vec::new();
    ix.match_tiers_into(&[1, 2, 3, 4, 5], &mut out);
    let m = |held, device| TierMatch {
        slot: 0,
        held,
        device,
    };
    assert_eq!(out, vec![m(4, 2)], "4 blocks on any tier, 2 on the device");
    let st = ix.slot_stats(0);
    assert_eq!((st.blocks, st.device_blocks, st.host_blocks), (4, 2, 2));
    // A device store below a host-only parent is refused: device blocks stay nested.
    ix.apply(0, &on("GPU", Some(4), &[5]));
    assert_eq!(ix.slot_stats(0).orphaned_blocks, 1);
    // Load-back of 3 (its host copy stays), then the host copy of 4 is evicted.
    ix.apply(0, &on("GPU", Some(2), &[3]));
    ix.apply(0, &off("CPU_PINNED", &[4]));
    ix.match_tiers_into(&[1, 2, 3, 4], &mut out);
    assert_eq!(out, vec![m(3, 3)]);
    assert_eq!(ix.slot_blocks_on(0, Tier::Host), vec![3]);
    // DISK counts as the host tier; a device removal of a block with a host copy keeps it.
    ix.apply(0, &on("DISK", Some(3), &[6]));
    ix.apply(0, &off("GPU", &[3]));
    ix.match_tiers_into(&[1, 2, 3, 6], &mut out);
    assert_eq!(out, vec![m(4, 2)]);
    ix.apply(0, &KvEvent::AllCleared);
    let st = ix.slot_stats(0);
    assert_eq!((st.blocks, st.host_blocks, st.clears), (0, 0, 1));
    assert!(ix.is_empty());
}

#[test]
fn a_detached_slot_reads_empty_at_once_and_restores_survive_the_unlinking() {
    let mut ix = KvIndex::new(1000);
    ix.apply(0, &stored(&[1, 2, 3]));
    ix.apply(1, &stored(&[1, 2]));
    ix.detach_slot(0);
    let mut out = Vec::new();
    ix.match_into(&[1, 2, 3], &mut out);
    assert_eq!(out, vec![(1, 2)], "slot 0 is empty before any unlinking");
    assert_eq!((ix.len(), ix.pending_unlinks()), (3, 3));
    ix.apply(0, &stored(&[1, 4])); // stored again before its old entries are unlinked
    let mut spent = Vec::new();
    assert!(ix.unlink_step(2, &mut spent), "bounded: one entry left");
    assert!(!ix.unlink_step(2, &mut spent));
    assert_eq!(spent.len(), 1);
    out.clear();
    ix.match_into(&[1, 4], &mut out);
    out.sort();
    assert_eq!(out, vec![(0, 2), (1, 1)]);
    ix.match_into(&[1, 2, 3], &mut out);
    out.sort();
    assert_eq!(out, vec![(0, 1), (1, 2)]);
    assert_eq!(ix.len(), 3, "block 3 unlinked; 1, 2 and 4 still held");
    assert_eq!(ix.slot_stats(0).blocks, 2);
}

#[test]
fn a_slot_over_its_quota_is_cleared_once_and_then_ignored() {
    let mut ix = KvIndex::new(1000);
    ix.set_slot_quota(3);
    ix.apply(0, &stored(&[1, 2, 3]));
    assert!(ix.take_over_quota().is_empty());
    ix.apply(1, &stored(&[1]));
    ix.apply(0, &stored(&[4, 5]));
    assert_eq!(ix.take_over_quota(), vec![0]);
    let st = ix.slot_stats(0);
    assert!(st.over_quota && st.blocks == 0 && st.clears == 1);
    ix.apply(0, &stored(&[6]));
    ix.apply(0, &KvEvent::AllCleared);
    ix.apply(0, &stored(&[7, 8]));
    assert!(ix.take_over_quota().is_empty(), "counted once");
    let mut spent = Vec::new();
    while ix.unlink_step(1, &mut spent) {}
    assert_eq!(
        (ix.len(), ix.slot_stats(0).blocks),
        (1, 0),
        "only slot 1's block"
    );
    ix.release_slot(0);
    ix.apply(0, &stored(&[9]));
    assert_eq!(ix.slot_stats(0).blocks, 1, "a released slot starts afresh");
}

#[test]
fn a_device_removal_after_a_resync_infers_the_host_copy_its_host_children_prove() {
    let mut ix = KvIndex::new(1000);
    ix.apply(0, &on("CPU_PINNED", None, &[1])); // a host copy of 1 ...
    ix.detach_slot(0); // ... forgotten by a resync
    ix.apply(0, &on("GPU", None, &[1])); // 1 loaded back: the view sees a device block
    ix.apply(0, &on("CPU_PINNED", Some(1), &[2])); // a host-only child of 1
    assert!(!ix.slot_stats(0).unnested);
    ix.apply(0, &off("GPU", &[1])); // demoted: the engine announces no new host copy
    let mut out = Vec::new();
    ix.match_tiers_into(&[1, 2], &mut out);
    let m = TierMatch {
        slot: 0,
        held: 2,
        device: 0,
    };
    assert_eq!(out, vec![m], "1 stays, on the host, above its child");
    let st = ix.slot_stats(0);
    assert!(st.unnested && st.needs_resync);
    assert_eq!((st.blocks, st.host_blocks), (2, 2));
    // Without a host-only child, a device removal of a block with no known host copy drops it.
    ix.apply(1, &on("GPU", None, &[7, 8]));
    ix.apply(1, &off("GPU", &[8]));
    assert_eq!(ix.slot_stats(1).blocks, 1);
    assert!(!ix.slot_stats(1).unnested);
}

#[test]
fn an_evicted_block_stored_again_is_a_regretted_eviction_and_unique_stores_are_not() {
    let mut ix = KvIndex::new(1000);
    ix.apply(0, &stored(&[1, 2, 3, 4]));
    assert_eq!(ix.regret(0), 0.0, "no eviction yet");
    ix.apply(0, &removed(&[4]));
    ix.apply(0, &chained(Some(3), &[5])); // a new block where 4 was: nobody regrets 4 yet
    assert_eq!(ix.regret(0), 0.0);
    ix.apply(0, &chained(Some(3), &[4])); // 4 is back: its eviction cost a recompute
    assert_eq!(ix.regret(0), 1.0);
    ix.apply(0, &removed(&[4]));
    // Both counts decay by 1 − 1/bound per eviction; bound: the 5 blocks held at the peak.
    let keep = 1.0 - 1.0 / 5.0;
    assert_eq!(ix.regret_tracker(0).map(Regret::bound), Some(5));
    assert!(
        (ix.regret(0) - keep / (keep + 1.0)).abs() < 1e-12,
        "{}",
        ix.regret(0)
    );
    ix.apply(0, &chained(Some(3), &[4]));
    ix.apply(0, &chained(Some(3), &[4])); // held already: not a second restore
    assert!((ix.regret(0) - 1.0).abs() < 1e-12, "{}", ix.regret(0));
    // Slot 1 only ever evicts what nobody stores again.
    ix.apply(1, &stored(&[10, 11]));
    for h in 12..40 {
        ix.apply(1, &removed(&[h - 1]));
        ix.apply(1, &chained(Some(10), &[h]));
    }
    assert_eq!(
        (ix.regret(1), ix.regret(2)),
        (0.0, 0.0),
        "unique, and never seen"
    );
}

#[test]
fn regret_remembers_one_pool_turnover_and_a_cleared_slot_starts_again() {
    let mut ix = KvIndex::new(1000);
    ix.apply(0, &stored(&[1, 2, 3, 4])); // peak: 4 blocks
    ix.apply(0, &removed(&[4, 3, 2, 1]));
    ix.apply(0, &stored(&[5]));
    ix.apply(0, &removed(&[5])); // the fifth eviction pushes the first (4) out
    let t = ix.regret_tracker(0).unwrap();
    assert_eq!((t.bound(), t.remembered()), (4, 4));
    ix.apply(0, &stored(&[1, 2, 3, 4])); // 1, 2, 3 within the turnover; 4 beyond it
    let keep: f64 = 0.75;
    let evicted: f64 = (0..5).map(|k| keep.powi(k)).sum();
    assert!(
        (ix.regret(0) - 3.0 / evicted).abs() < 1e-12,
        "{}",
        ix.regret(0)
    );
    // Removals of blocks the slot does not hold are not evictions of its pool.
    ix.apply(0, &removed(&[77]));
    assert!((ix.regret(0) - 3.0 / evicted).abs() < 1e-12);
    ix.apply(0, &removed(&[4]));
    ix.apply(0, &KvEvent::AllCleared);
    let t = ix.regret_tracker(0).unwrap();
    assert_eq!((ix.regret(0), t.bound(), t.remembered()), (0.0, 0, 0));
    ix.apply(0, &stored(&[1, 2, 3, 4])); // 4 was evicted before the clear: forgotten
    assert_eq!(ix.regret(0), 0.0);
}
