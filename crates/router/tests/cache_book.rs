//! The cache book under hostile or heavy input, through its public API: a rank that stores more
//! than its quota, a lookup while a huge slot is cleared, a dispatch after a worker's removal, and
//! registrations of one URL that must not leak.

use loadlink_router::Worker;
use loadlink_router::budget::Refusal;
use loadlink_router::cache::{CacheBook, PrefixSettings, View};
use loadlink_router::candidate::Candidates;
use loadlink_wire::kv_events::{BlockStored, KvEvent, KvEventBatch};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Instant;

fn worker(url: &str, ranks: usize) -> Arc<Worker> {
    Arc::new(Worker::new(url.into(), ranks, None, Instant::now()))
}

fn stored(hashes: &[i64]) -> KvEventBatch {
    KvEventBatch {
        ts: 0.0,
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: hashes.to_vec(),
            block_size: 4,
            ..Default::default()
        })],
        attn_dp_rank: None,
    }
}

/// `n` distinct block hashes, none of them small numbers.
fn hashes(from: usize, n: usize) -> Vec<i64> {
    (from..from + n)
        .map(|i| i as i64 * 7919 + 1_000_003)
        .collect()
}

fn completion(text: &str) -> Vec<u8> {
    json!({ "prompt": text }).to_string().into_bytes()
}

fn settings() -> PrefixSettings {
    PrefixSettings {
        page_size: 4,
        ..Default::default()
    }
}

#[test]
fn a_rank_over_its_quota_is_priced_from_the_tree_and_never_refilled() {
    let book = CacheBook::new(10_000).with_rank_quota(100);
    let (w, fine) = (worker("http://w:1", 2), worker("http://fine:1", 1));
    let ws = [w.clone(), fine.clone()];
    let s = book.register(&w, 4, 2);
    let f = book.register(&fine, 4, 1);
    for (_, st) in s.iter().chain(&f) {
        st.set_view(View::Complete); // as the ingest does once a snapshot is loaded
    }
    book.apply(s[0].0, &stored(&hashes(0, 50)));
    book.apply(f[0].0, &stored(&hashes(0, 100)));
    book.apply(s[1].0, &stored(&hashes(1_000, 150)));
    assert_eq!(
        book.rank_blocks("http://w:1", 1),
        Some(vec![]),
        "rank 1 is not indexed"
    );
    assert_eq!(book.rank_blocks("http://w:1", 0).map(|b| b.len()), Some(50));
    assert_eq!(
        book.blocks(),
        100,
        "fine's 100 blocks, w's rank 0 shares them"
    );
    assert_eq!(w.refusals.counts().get(Refusal::IndexQuota), 1);
    assert!(w.refusals.last().unwrap().starts_with("index_quota: "));
    let (kv, _) = book.worker_json(&w);
    assert_eq!(kv["over_quota_ranks"], json!([1]), "{kv}");
    assert_eq!(kv["rank_quota"], json!(100), "{kv}");
    let reason = kv["not_indexed_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("--kv-index-max-blocks-per-rank"), "{kv}");
    assert_eq!(book.worker_json(&fine).0["not_indexed_reason"], json!(null));

    // No resync loop: later batches, a clear and a resync leave the rank empty, counted once.
    for i in 0..20 {
        book.apply(s[1].0, &stored(&hashes(2_000 + i * 10, 10)));
    }
    book.resync(s[1].0, loadlink_router::cache::ResyncReason::Restart, false);
    book.apply(s[1].0, &stored(&hashes(3_000, 10)));
    assert_eq!(book.rank_blocks("http://w:1", 1), Some(vec![]));
    assert_eq!(book.blocks(), 100);
    assert_eq!(w.refusals.counts().get(Refusal::IndexQuota), 1);

    // Priced from the approximate tree: what it was sent counts; `fine` stays on the index only.
    let text = "y".repeat(160); // 40 tokens: 9 full pages of 4 can match
    let l = book
        .lookup(
            &settings(),
            "/v1/completions",
            &completion(&text),
            Candidates::whole(&ws),
            1,
        )
        .unwrap();
    assert_eq!(l.cached, [0, 0]);
    book.record_dispatch(&l, Candidates::whole(&ws), 0, 1);
    book.record_dispatch(&l, Candidates::whole(&ws), 1, 1);
    let again = book
        .lookup(
            &settings(),
            "/v1/completions",
            &completion(&text),
            Candidates::whole(&ws),
            2,
        )
        .unwrap();
    assert_eq!(
        again.cached,
        [36, 0],
        "w from its tree, fine from the index"
    );
}

#[test]
fn a_lookup_completes_while_a_huge_slot_is_cleared() {
    const BIG: usize = 1 << 20;
    let book = CacheBook::new(4 << 20);
    let (big, small) = (worker("http://big:1", 1), worker("http://small:1", 1));
    let b = book.register(&big, 4, 1)[0].0;
    let s = book.register(&small, 4, 1)[0].0;
    for c in 0..BIG / 4096 {
        book.apply(b, &stored(&hashes(c * 4096, 4096)));
    }
    book.apply(s, &stored(&[1, 2, 3]));
    assert_eq!(book.blocks(), BIG + 3);
    let ws = [small.clone(), big.clone()];
    let done = AtomicBool::new(false);
    let mut seen_during_clear = 0;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            book.unregister(&big);
            done.store(true, SeqCst);
        });
        let mut out = Vec::new();
        while !done.load(SeqCst) {
            // A count between "all" and "only small's" proves the clear is under way...
            let before = book.blocks();
            if before <= 3 || before >= BIG + 3 {
                continue;
            }
            book.cached_tokens(Candidates::whole(&ws), &[1, 2, 3], 4, &mut out);
            assert_eq!(out, [12, 0]);
            // ...and still is once the lookup has its answer: it did not wait for the clear.
            if !done.load(SeqCst) && book.blocks() > 3 {
                seen_during_clear += 1;
            }
        }
    });
    assert!(
        seen_during_clear > 0,
        "no lookup completed while the slot was being cleared"
    );
    assert_eq!(book.blocks(), 3, "the clear finished");
}

#[test]
fn a_dispatch_after_removal_does_not_bring_the_worker_back() {
    let book = CacheBook::default();
    let ws = [worker("http://a:1", 1), worker("http://b:1", 1)];
    let body = completion(&"x".repeat(160));
    let l = book
        .lookup(
            &settings(),
            "/v1/completions",
            &body,
            Candidates::whole(&ws),
            1,
        )
        .unwrap();
    book.record_dispatch(&l, Candidates::whole(&ws), 0, 1);
    book.record_dispatch(&l, Candidates::whole(&ws), 1, 1);
    book.unregister(&ws[0]);
    // A request that picked `a` before it was removed records its dispatch afterwards.
    book.record_dispatch(&l, Candidates::whole(&ws), 0, 2);
    let again = book
        .lookup(
            &settings(),
            "/v1/completions",
            &body,
            Candidates::whole(&ws),
            3,
        )
        .unwrap();
    assert_eq!(
        again.cached,
        [0, 36],
        "a's tree stays forgotten, b's is kept"
    );
    assert_eq!(again.sizes, [0, 36]);
    assert_eq!(book.registrations(), (0, 1), "one tree: b's");
}

#[test]
fn registering_one_url_twice_does_not_leak_the_first_registration() {
    let book = CacheBook::new(1_000);
    // Two adds of one URL racing: two `Worker`s, both registered, only one kept by the fleet.
    let (first, second) = (worker("http://a:1", 2), worker("http://a:1", 2));
    let s1 = book.register(&first, 4, 2);
    book.apply(s1[0].0, &stored(&[1, 2]));
    book.apply(s1[1].0, &stored(&[3]));
    let s2 = book.register(&second, 4, 2);
    assert_eq!(book.blocks(), 0, "the first registration's blocks are gone");
    book.apply(s1[0].0, &stored(&[4]));
    assert_eq!(book.blocks(), 0, "and its streams write nowhere");
    book.apply(s2[0].0, &stored(&[1, 2]));
    let mut out = Vec::new();
    book.cached_tokens(
        Candidates::whole(&[first.clone(), second.clone()]),
        &[1, 2],
        4,
        &mut out,
    );
    assert_eq!(out, [0, 8]);
    book.unregister(&second);
    assert_eq!(book.blocks(), 0);
    assert_eq!(
        book.rank_blocks("http://a:1", 0),
        None,
        "nothing left for the URL"
    );
}

#[test]
fn concurrent_registrations_of_one_worker_leave_nothing_behind() {
    let book = CacheBook::new(100_000);
    let w = worker("http://a:1", 1);
    let together = std::sync::Barrier::new(2);
    std::thread::scope(|scope| {
        for t in 0..2 {
            let (book, w, together) = (&book, &w, &together);
            scope.spawn(move || {
                for i in 0..2_000 {
                    together.wait();
                    let s = book.register(w, 4, 1);
                    book.apply(s[0].0, &stored(&hashes(t * 10_000 + i * 4, 4)));
                }
            });
        }
    });
    book.unregister(&w);
    assert_eq!(
        book.blocks(),
        0,
        "a registration replaced mid-race leaked its slot"
    );
}
