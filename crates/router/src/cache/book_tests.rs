//! Unit tests of [`super::CacheBook`]: registration, matching per worker and rank, removal, resync.

use super::*;
use crate::candidate::Candidate;
use loadlink_wire::kv_events::{BlockRemoved, BlockStored};
use std::time::Instant;

fn worker(url: &str) -> Arc<Worker> {
    Arc::new(Worker::new(url.into(), 1, None, Instant::now()))
}

fn batch(events: Vec<KvEvent>) -> KvEventBatch {
    KvEventBatch {
        ts: 0.0,
        events,
        attn_dp_rank: None,
    }
}

fn stored(h: &[i64]) -> KvEvent {
    KvEvent::Stored(BlockStored {
        block_hashes: h.to_vec(),
        block_size: 4,
        ..Default::default()
    })
}

#[test]
fn cached_tokens_per_worker_in_order_max_over_ranks() {
    let book = CacheBook::new(100);
    let (a, b, c) = (
        worker("http://a:1"),
        worker("http://b:1"),
        worker("http://c:1"),
    );
    let sa = book.register(&a, 4, 2);
    let sb = book.register(&b, 4, 1);
    book.apply(sa[0].0, &batch(vec![stored(&[1, 2])]));
    book.apply(sa[1].0, &batch(vec![stored(&[1, 2, 3])]));
    book.apply(sb[0].0, &batch(vec![stored(&[1])]));
    let mut out = Vec::new();
    let ws = [c.clone(), b.clone(), a.clone()];
    book.cached_tokens(Candidates::whole(&ws), &[1, 2, 3, 4], 4, &mut out);
    assert_eq!(out, [0, 4, 12]);
    let ranked = [
        Candidate {
            worker: 2,
            rank: Some(0),
        },
        Candidate {
            worker: 2,
            rank: Some(1),
        },
        Candidate {
            worker: 1,
            rank: None,
        },
    ];
    book.cached_tokens(Candidates::listed(&ws, &ranked), &[1, 2, 3, 4], 4, &mut out);
    assert_eq!(
        out,
        [8, 12, 4],
        "a rank candidate holds what its rank holds"
    );
    let removed = KvEvent::Removed(BlockRemoved {
        block_hashes: vec![3],
        medium: None,
    });
    book.apply(sa[1].0, &batch(vec![removed]));
    book.cached_tokens(
        Candidates::whole(std::slice::from_ref(&a)),
        &[1, 2, 3, 4],
        4,
        &mut out,
    );
    assert_eq!(out, [8]);
    assert_eq!(book.counters.events[1].load(Relaxed), 1);
    book.cached_tokens(
        Candidates::whole(&[a.clone(), b.clone()]),
        &[9],
        4,
        &mut out,
    );
    assert_eq!(out, [0, 0], "no holder of the root: nothing cached");
}

#[test]
fn removing_a_worker_clears_its_slots_and_retires_its_stream_ids() {
    let book = CacheBook::new(100);
    let (a, b) = (worker("http://a:1"), worker("http://b:1"));
    let sa = book.register(&a, 4, 1);
    book.apply(sa[0].0, &batch(vec![stored(&[1, 2])]));
    assert_eq!(book.blocks(), 2);
    book.unregister(&a);
    assert_eq!(book.blocks(), 0);
    let sb = book.register(&b, 4, 1);
    assert_ne!(sb[0].0, sa[0].0, "a stream id is never given out twice");
    book.apply(sa[0].0, &batch(vec![stored(&[1, 2])]));
    assert_eq!(
        book.blocks(),
        0,
        "a removed stream's late batch lands nowhere"
    );
    let mut out = Vec::new();
    book.cached_tokens(Candidates::whole(&[a, b]), &[1, 2], 4, &mut out);
    assert_eq!(out, [0, 0]);
    assert_eq!(book.rank_blocks("http://b:1", 0), Some(vec![]));
    assert_eq!(book.rank_blocks("http://a:1", 0), None);
    assert_eq!(book.read().next_slot, 1, "the index slot itself is reused");
}

#[test]
fn resync_clears_and_may_mark_stale() {
    let book = CacheBook::new(100);
    let a = worker("http://a:1");
    let s = book.register(&a, 4, 1)[0].0;
    book.apply(s, &batch(vec![stored(&[1, 2])]));
    book.resync(s, ResyncReason::GapNotCovered, true);
    assert_eq!(book.blocks(), 0);
    let slot = book.read().streams[&s];
    assert!(book.read().index.slot_stats(slot).needs_resync);
    assert_eq!(
        book.counters.resyncs[ResyncReason::GapNotCovered as usize].load(Relaxed),
        1
    );
}

#[test]
fn eviction_regret_reaches_the_lookup_and_the_view_per_rank_and_whole() {
    use crate::policy::View;
    let book = CacheBook::new(100);
    let (a, b) = (worker("http://a:1"), worker("http://b:1"));
    let sa = book.register(&a, 4, 2);
    book.register(&b, 4, 1);
    let removed = |h: &[i64]| {
        KvEvent::Removed(BlockRemoved {
            block_hashes: h.to_vec(),
            medium: None,
        })
    };
    // Rank 1 of a evicts block 2 and stores it again: every eviction of its pool regretted.
    book.apply(sa[0].0, &batch(vec![stored(&[1, 2]), removed(&[2])]));
    book.apply(sa[1].0, &batch(vec![stored(&[1, 2]), removed(&[2])]));
    book.apply(sa[1].0, &batch(vec![stored(&[1, 2])]));
    let ws = [a.clone(), b.clone()];
    let ranked = [
        Candidate {
            worker: 0,
            rank: Some(0),
        },
        Candidate {
            worker: 0,
            rank: Some(1),
        },
        Candidate {
            worker: 0,
            rank: None,
        },
        Candidate {
            worker: 1,
            rank: None,
        },
    ];
    let settings = crate::cache::PrefixSettings {
        page_size: 4,
        ..Default::default()
    };
    let body = br#"{"prompt": "some prompt text"}"#;
    let targets = Candidates::listed(&ws, &ranked);
    let l = book
        .lookup(&settings, "/v1/completions", body, targets, 1)
        .expect("a prompt");
    assert_eq!(
        l.regret,
        [0.0, 1.0, 1.0, 0.0],
        "a whole worker: its most regretful rank"
    );
    let view = crate::fleet_view::FleetView::new(&ws, crate::book::LoadSignal::Backlog, 3000)
        .with_candidates(&ranked)
        .with_lookup(&l);
    let seen: Vec<f64> = (0..4).map(|i| view.eviction_regret(i)).collect();
    assert_eq!(seen, [0.0, 1.0, 1.0, 0.0]);
}
