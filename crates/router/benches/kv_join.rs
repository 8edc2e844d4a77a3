//! A router joining a warm fleet: how long until it routes with full knowledge of every cache.
//!
//! * `snapshot_load_200k_tokens_page_16`: one rank's snapshot of a 200k-token cache at page 16
//!   (12,500 blocks in 4 chunks), decoded and loaded into the router's index (the target:
//!   ≤ 20 ms).
//! * `join_64_workers_x_8_ranks_20k_tokens`: 512 real `KvEventPublisher`s (64 workers × 8 DP
//!   ranks, 1,250 blocks each, replay buffers far shorter than their history), then a fresh fleet
//!   (a restarted router) subscribes to all of them: from the first subscription to every rank's
//!   snapshot loaded (the target: ≤ 1 s).

use criterion::{Criterion, criterion_group, criterion_main};
use loadlink_publish::{CacheCut, CutPage, KvEventPublisher, KvPublisherConfig, snapshot_replies};
use loadlink_router::Worker;
use loadlink_router::cache::{CacheBook, View};
use loadlink_router::fleet::{Discovery, Fleet};
use loadlink_wire::descriptor::KvStreamEndpoint;
use loadlink_wire::discovery::KvStreams;
use loadlink_wire::kv_snapshot::{SnapshotReply, decode_reply};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

const WORKERS: usize = 64;
const RANKS: usize = 8;
/// 20k tokens at page 16.
const RANK_BLOCKS: usize = 1_250;

/// A cache of `blocks` pages: chains of 125 pages (a 2k-token prompt each), salted by `salt`.
fn cut(blocks: usize, salt: i64) -> CacheCut {
    let pages = (0..blocks)
        .map(|i| {
            let hash = salt * 1_000_003 + i as i64 * 7_919 + 1;
            let parent = (i % 125 != 0).then(|| hash - 7_919);
            CutPage {
                hash,
                parent,
                medium: None,
            }
        })
        .collect();
    CacheCut {
        replica_rank: 0,
        barrier_seq: 41,
        page_size: 16,
        pages,
    }
}

fn load(c: &mut Criterion) {
    let replies = snapshot_replies(&cut(12_500, 3), 9, 7);
    let epoch = Instant::now();
    c.bench_function("snapshot_load_200k_tokens_page_16", |b| {
        b.iter_batched(
            || {
                let book = CacheBook::default();
                let w = Arc::new(Worker::new("http://w:1".into(), 1, None, epoch));
                let id = book.register(&w, 16, 1)[0].0;
                (book, id, w)
            },
            |(book, id, _w)| {
                for (kind, payload) in &replies {
                    if let Ok(SnapshotReply::Chunk { records, .. }) = decode_reply(kind, payload) {
                        book.load_records(id, records, 16);
                    }
                }
                assert_eq!(book.blocks(), 12_500);
                book
            },
            criterion::BatchSize::PerIteration,
        )
    });
}

/// One worker's publishers (a context of its own: 16 sockets) and its discovery.
struct WorkerPubs {
    _publishers: Vec<KvEventPublisher>,
    streams: KvStreams,
}

fn worker_pubs(w: usize) -> WorkerPubs {
    let base = loadlink_publish::free_port_block(2 * RANKS as u16).expect("free ports");
    let ctx = zmq::Context::new();
    let mut publishers = Vec::new();
    let mut endpoints = Vec::new();
    for r in 0..RANKS {
        let (pub_port, replay_port) = (base + r as u16, base + (RANKS + r) as u16);
        let mut cfg = KvPublisherConfig::new(format!("tcp://127.0.0.1:{pub_port}"));
        cfg.replay_endpoint = Some(format!("tcp://127.0.0.1:{replay_port}"));
        cfg.buffer_steps = 8;
        let p = KvEventPublisher::bind(&ctx, cfg).expect("publisher binds");
        let mut c = cut(RANK_BLOCKS, (w * RANKS + r) as i64);
        c.replica_rank = r as u32;
        c.barrier_seq = 999;
        p.set_snapshot_source(Arc::new(move || Some(c.clone())));
        publishers.push(p);
        endpoints.push(KvStreamEndpoint {
            rank: r as u32,
            endpoint: format!("tcp://127.0.0.1:{pub_port}"),
            replay_endpoint: Some(format!("tcp://127.0.0.1:{replay_port}")),
        });
    }
    WorkerPubs {
        _publishers: publishers,
        streams: KvStreams {
            block_size: 16,
            topic: String::new(),
            endpoints,
            advertised: None,
            host_load_tokens_per_s: None,
        },
    }
}

/// A fresh fleet subscribes to every worker; the time until every rank's snapshot is loaded.
fn join(pubs: &[WorkerPubs]) -> Duration {
    let book = Arc::new(CacheBook::default());
    let fleet = Fleet::with_cache(2, book.clone());
    let t = Instant::now();
    for (w, p) in pubs.iter().enumerate() {
        let d = Discovery {
            models: Err(String::from("not read").into()),
            endpoints: Vec::new(),
            no_load_reason: Some("a bare KV-event publisher".into()),
            kv: Ok(p.streams.clone()),
            poll: None,
            pd: None,
        };
        fleet.add(&format!("http://127.0.0.1:{}", 10_000 + w), d);
    }
    let want = (WORKERS * RANKS) as u64;
    while book.counters.snapshots_loaded.load(Relaxed) < want {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the join never completed"
        );
        std::thread::sleep(Duration::from_micros(500));
    }
    let took = t.elapsed();
    assert_eq!(book.blocks(), WORKERS * RANKS * RANK_BLOCKS);
    let complete = fleet
        .workers()
        .iter()
        .all(|w| matches!(book.worker_json(w).0["views"].as_array(), Some(v) if v.iter().all(|s| s == View::Complete.as_str())));
    assert!(complete, "every rank's view is complete");
    for w in 0..pubs.len() {
        fleet.remove(&format!("http://127.0.0.1:{}", 10_000 + w));
    }
    took
}

fn fleet_join(c: &mut Criterion) {
    let pubs: Vec<WorkerPubs> = (0..WORKERS).map(worker_pubs).collect();
    let mut g = c.benchmark_group("kv_join");
    g.sample_size(10);
    g.bench_function("join_64_workers_x_8_ranks_20k_tokens", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| join(&pubs)).sum())
    });
    g.finish();
}

criterion_group!(benches, load, fleet_join);
criterion_main!(benches);
