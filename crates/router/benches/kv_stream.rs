//! The KV index as the router runs it: the request path's `CacheBook::cached_tokens` (an 8k-token
//! prompt against 64 workers, through the lock and the worker → slot map), and the ingest end to
//! end — a real `KvEventPublisher` holding 10,000 batches of 16 blocks, a fleet subscribing to it,
//! and the time until the initial replay has put all 160,000 blocks in the index (the time to
//! resync a rank, and block events per second through decode + apply).

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use loadlink_publish::free_port_block;
use loadlink_publish::kv_publisher::{KvEventPublisher, KvPublisherConfig};
use loadlink_router::Worker;
use loadlink_router::cache::CacheBook;
use loadlink_router::candidate::Candidates;
use loadlink_router::fleet::{Discovery, Fleet};
use loadlink_wire::kv_events::KvEventBatch;

mod common;
use common::{BLOCKS, chain, stored_batch};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WORKERS: usize = 64;

fn batch(hashes: &[i64]) -> KvEventBatch {
    stored_batch(hashes, Some(0))
}

fn request_path(c: &mut Criterion) {
    let book = CacheBook::new(1 << 22);
    let epoch = Instant::now();
    let prompt = chain(7);
    let workers: Vec<Arc<Worker>> = (0..WORKERS)
        .map(|w| {
            let worker = Arc::new(Worker::new(format!("http://w{w}:1"), 1, None, epoch));
            let (slot, _) = book.register(&worker, 16, 1)[0].clone();
            let depth = (w * BLOCKS / WORKERS).max(1);
            book.apply(slot, &batch(&prompt[..depth]));
            book.apply(slot, &batch(&chain(1000 + w as u32)));
            worker
        })
        .collect();
    let mut out = Vec::with_capacity(WORKERS);
    c.bench_function("cache_book_cached_tokens_8k_prompt_64_workers", |b| {
        b.iter(|| {
            book.cached_tokens(
                Candidates::whole(&workers),
                black_box(&prompt),
                16,
                &mut out,
            );
            out[WORKERS - 1]
        })
    });
}

/// Hands `batches` batches of 16 fresh blocks (numbered from `from`) to `publisher`.
fn publish(publisher: &KvEventPublisher, from: usize, batches: usize) {
    let hashes: Vec<i64> = (from * 16..(from + batches) * 16)
        .map(|i| i as i64 * 7919 + 1)
        .collect();
    for h in hashes.chunks(16) {
        while !publisher.publish(batch(h)) {
            std::thread::yield_now();
        }
    }
}

fn published(publisher: &KvEventPublisher) -> u64 {
    publisher
        .stats()
        .published
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// A publisher with a replay buffer of `batches`, and a fleet subscribed to it (not yet joined).
fn rank(batches: usize) -> (KvEventPublisher, Arc<CacheBook>, Fleet, Discovery) {
    let base = free_port_block(2).expect("free ports");
    let ctx = zmq::Context::new();
    let mut cfg = KvPublisherConfig::new(format!("tcp://127.0.0.1:{base}"));
    cfg.replay_endpoint = Some(format!("tcp://127.0.0.1:{}", base + 1));
    cfg.buffer_steps = batches;
    let publisher = KvEventPublisher::bind(&ctx, cfg).expect("publisher binds");
    let (book, fleet, d) = loadlink_testkit::bare_kv_fleet(base, 16);
    (publisher, book, fleet, d)
}

fn wait_blocks(book: &CacheBook, n: usize) {
    while book.blocks() < n {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// One initial sync of a rank whose publisher buffers `batches` batches of 16 blocks: from the
/// subscription to every block in the index.
fn initial_sync(batches: usize) -> Duration {
    let (publisher, book, fleet, d) = rank(batches);
    publish(&publisher, 0, batches);
    while published(&publisher) < batches as u64 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let t = Instant::now();
    fleet.add("http://127.0.0.1:1", d);
    wait_blocks(&book, batches * 16);
    let took = t.elapsed();
    fleet.remove("http://127.0.0.1:1");
    took
}

/// Live ingest: a joined subscriber, then `batches` batches published as fast as the publisher
/// goes; from the first hand-over to every block in the index.
fn live(batches: usize) -> Duration {
    let (publisher, book, fleet, d) = rank(batches + 1);
    fleet.add("http://127.0.0.1:1", d);
    let mut probes = 0;
    while book.blocks() == 0 {
        publish(&publisher, probes, 1);
        probes += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_blocks(&book, probes * 16);
    let t = Instant::now();
    publish(&publisher, probes, batches);
    wait_blocks(&book, (probes + batches) * 16);
    let took = t.elapsed();
    fleet.remove("http://127.0.0.1:1");
    took
}

fn ingest(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv_ingest");
    g.sample_size(10);
    for batches in [1_000, 10_000] {
        g.throughput(Throughput::Elements((batches * 16) as u64));
        g.bench_function(
            format!("initial_sync_{batches}_batches_of_16_blocks"),
            |b| b.iter_custom(|iters| (0..iters).map(|_| initial_sync(batches)).sum()),
        );
    }
    g.throughput(Throughput::Elements(10_000 * 16));
    g.bench_function("live_10000_batches_of_16_blocks", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| live(10_000)).sum())
    });
    g.finish();
}

criterion_group!(benches, request_path, ingest);
criterion_main!(benches);
