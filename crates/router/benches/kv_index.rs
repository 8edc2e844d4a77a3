//! The KV index's two hot paths: ingesting block events, and the longest-prefix match of an
//! 8k-token prompt (512 blocks of 16) against 64 workers; and the approximate tree's two: recording
//! a dispatched 8k-token chain, and the same match. Then the request path's worst wait while a
//! worker's 1 Mi-block slot is cleared on another thread (its removal, or a restart): the clear
//! must not hold the book's lock for O(blocks).

use criterion::{BatchSize, Criterion, Throughput, black_box, criterion_group, criterion_main};
use loadlink_router::Worker;
use loadlink_router::cache::{ApproxTree, CacheBook, KvIndex};
use loadlink_router::candidate::Candidates;
use loadlink_wire::kv_events::{BlockRemoved, BlockStored, KvEvent, KvEventBatch, page_hashes};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

const BLOCKS: usize = 512;
const WORKERS: u32 = 64;

fn chain(salt: u32) -> Vec<i64> {
    let tokens: Vec<u32> = (0..(BLOCKS as u32 * 16)).map(|i| i ^ salt).collect();
    page_hashes(&tokens, 16)
}

fn stored(hashes: &[i64]) -> KvEvent {
    KvEvent::Stored(BlockStored {
        block_hashes: hashes.to_vec(),
        block_size: 16,
        ..Default::default()
    })
}

fn bench(c: &mut Criterion) {
    // Ingest: one worker's stream of 64-block stores and removals, 1,024 block events per batch.
    let hashes = chain(1);
    let events: Vec<KvEvent> = hashes
        .chunks(64)
        .map(stored)
        .chain(hashes.chunks(64).map(|h| {
            KvEvent::Removed(BlockRemoved {
                block_hashes: h.to_vec(),
                medium: None,
            })
        }))
        .collect();
    let mut g = c.benchmark_group("kv_index_ingest");
    g.throughput(Throughput::Elements(2 * BLOCKS as u64));
    g.bench_function("store_then_remove_512_blocks", |b| {
        b.iter_batched_ref(
            || KvIndex::new(1 << 20),
            |ix| {
                for e in &events {
                    ix.apply(3, e);
                }
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();

    // Match: every worker holds a different-length prefix of the prompt's chain, plus its own
    // unrelated blocks.
    let prompt = chain(7);
    let mut ix = KvIndex::new(1 << 22);
    for w in 0..WORKERS {
        let depth = (w as usize * BLOCKS / WORKERS as usize).max(1);
        ix.apply(w, &stored(&prompt[..depth]));
        ix.apply(w, &stored(&chain(1000 + w)));
    }
    let mut out = Vec::with_capacity(WORKERS as usize);
    c.bench_function("kv_index_match_8k_prompt_64_workers", |b| {
        b.iter(|| {
            ix.match_into(black_box(&prompt), &mut out);
            out.len()
        })
    });

    // The approximate tree, built the same way: every worker was sent a different-length prefix of
    // the prompt's chain and one unrelated chain.
    let mut tree = ApproxTree::new(1 << 20, u64::MAX);
    for w in 0..WORKERS {
        let depth = (w as usize * BLOCKS / WORKERS as usize).max(1);
        tree.record(w, &prompt[..depth], 1);
        tree.record(w, &chain(1000 + w), 1);
    }
    c.bench_function("approx_match_8k_prompt_64_workers", |b| {
        b.iter(|| {
            tree.match_into(black_box(&prompt), &mut out);
            out.len()
        })
    });
    // Record: the steady state of a router re-sending a known 8k-token chain (every block
    // restamped), the common case for multi-turn sessions and shared system prompts.
    let mut now = 2;
    c.bench_function("approx_record_8k_chain", |b| {
        b.iter(|| {
            now += 1;
            tree.record(5, black_box(&prompt), now);
        })
    });
    // The tail-reuse meter, per request: the policy's question and the record after the pick
    // (a group's prefix of 128 pages cached, each request a new tail).
    let meter = loadlink_router::cache::TailReuse::default();
    let mut chain = prompt[..129].to_vec();
    let mut k = 0u64;
    c.bench_function("tail_reuse_expects_and_record", |b| {
        b.iter(|| {
            k += 1;
            chain[128] = loadlink_router::policy::mix(k) as i64;
            let yes = meter.expects_reuse(black_box(&chain), 16, 128 * 16, k);
            meter.record(&chain, 16, 128 * 16, k);
            yes
        })
    });
}

/// Blocks of the slot cleared while lookups run.
const HUGE: usize = 1 << 20;

/// One round: fills a worker's slot with [`HUGE`] blocks, removes the worker on another thread,
/// and returns the 99th percentile of the lookups (8k-token prompt, 64 other workers) made
/// meanwhile. (The maximum is dominated by the lookup thread being descheduled on a loaded
/// machine; a lookup that waits for a whole clear shows in the 99th percentile as well, since
/// few lookups complete then.)
fn p99_lookup_during_clear(book: &CacheBook, workers: &[Arc<Worker>], prompt: &[i64]) -> Duration {
    let big = Arc::new(Worker::new("http://big:1".into(), 1, None, Instant::now()));
    let id = book.register(&big, 16, 1)[0].0;
    let hashes: Vec<i64> = (0..HUGE as i64).map(|i| i * 7919 + 1_000_003).collect();
    for h in hashes.chunks(4096) {
        book.apply(id, &batch(h));
    }
    let done = AtomicBool::new(false);
    let mut times: Vec<Duration> = Vec::new();
    let mut out = Vec::with_capacity(workers.len());
    std::thread::scope(|s| {
        s.spawn(|| {
            book.unregister(&big);
            done.store(true, SeqCst);
        });
        while !done.load(SeqCst) {
            let t = Instant::now();
            book.cached_tokens(Candidates::whole(workers), black_box(prompt), 16, &mut out);
            times.push(t.elapsed());
        }
    });
    times.sort();
    times
        .get(times.len() * 99 / 100)
        .copied()
        .unwrap_or_default()
}

fn batch(hashes: &[i64]) -> KvEventBatch {
    KvEventBatch {
        ts: 1.0,
        events: vec![stored(hashes)],
        attn_dp_rank: Some(0),
    }
}

fn clear(c: &mut Criterion) {
    let book = CacheBook::new(1 << 22);
    let prompt = chain(7);
    let workers: Vec<Arc<Worker>> = (0..WORKERS)
        .map(|w| {
            let worker = Arc::new(Worker::new(
                format!("http://w{w}:1"),
                1,
                None,
                Instant::now(),
            ));
            let id = book.register(&worker, 16, 1)[0].0;
            let depth = (w as usize * BLOCKS / WORKERS as usize).max(1);
            book.apply(id, &batch(&prompt[..depth]));
            worker
        })
        .collect();
    let mut g = c.benchmark_group("kv_index_clear");
    g.sample_size(10);
    // Reported "time" is the 99th-percentile lookup of one round, averaged over rounds.
    g.bench_function("p99_lookup_while_1m_block_slot_is_cleared", |b| {
        b.iter_custom(|rounds| {
            (0..rounds)
                .map(|_| p99_lookup_during_clear(&book, &workers, &prompt))
                .sum()
        })
    });
    g.finish();
}

criterion_group!(benches, bench, clear);
criterion_main!(benches);
