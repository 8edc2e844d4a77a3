//! Serving a KV snapshot of a 200k-token cache at page 16 (12,500 pages), in its two parts: the
//! cut (what the engine does under the scheduler lock: copy every page's hash, parent and tier)
//! and the answer (on the replay thread, no lock: order parent-before-child, gather chains into
//! records, chunk at 4,096 blocks, encode header, chunks and end). Target: ≤ 20 ms together.
//!
//! The cache is a tree, as prompts with a shared system prefix make it: one 100-page prefix and
//! 124 prompts of 100 more pages each.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use loadlink_engine::radix::{PageChain, PrefixCache};
use loadlink_publish::{CacheCut, snapshot_replies};

const PAGE: usize = 16;
const SHARED_PAGES: u32 = 100;
const OWN_PAGES: u32 = 100;
const PROMPTS: u32 = 124;

fn cache() -> PrefixCache {
    let mut c = PrefixCache::new(PAGE, false);
    let shared: Vec<u32> = (0..SHARED_PAGES * PAGE as u32).collect();
    for p in 0..PROMPTS {
        let own = (0..OWN_PAGES * PAGE as u32).map(|t| 1_000_000 + p * 100_000 + t);
        let tokens: Vec<u32> = shared.iter().copied().chain(own).collect();
        c.insert(&tokens, &PageChain::of(&tokens, PAGE));
    }
    c
}

fn bench(c: &mut Criterion) {
    let cache = cache();
    let pages = cache.export_pages();
    assert_eq!(pages.len(), 12_500, "a 200k-token cache at page 16");
    c.bench_function("snapshot_cut_copy_12500_pages", |b| {
        b.iter(|| black_box(&cache).export_pages())
    });
    let cut = CacheCut {
        replica_rank: 0,
        barrier_seq: 1234,
        page_size: PAGE as u32,
        pages,
    };
    c.bench_function("snapshot_order_chunk_encode_12500_pages", |b| {
        b.iter(|| snapshot_replies(black_box(&cut), 1, 1))
    });
    c.bench_function("snapshot_cut_and_answer_12500_pages", |b| {
        b.iter(|| {
            let cut = CacheCut {
                pages: black_box(&cache).export_pages(),
                ..cut.clone()
            };
            snapshot_replies(&cut, 1, 1)
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
