//! The rank-aware pick: 64 workers × 8 DP ranks (512 candidates), each rank with its own fresh
//! load snapshot and its own KV-event slot holding a different-length prefix of the request's
//! 8k-token chain (512 blocks of 16) plus unrelated blocks. One pick = the index lookup of the
//! precomputed chain for every candidate (`CacheBook::cached_tokens`) + `min_ttft` over them, as
//! the proxy does it (tokenizing and hashing the body is not included: it is per request, not per
//! candidate). Also P2C and least-load over the same candidates, and `cache_aware`.
//!
//! Before timing, a counting global allocator checks that a steady-state pick allocates nothing:
//! the bench panics if one does.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use loadlink_router::cache::CacheBook;
use loadlink_router::candidate::{CandidateList, Candidates};
use loadlink_router::fleet::FleetView;
use loadlink_router::policy::{CacheAware, MinTtft};
use loadlink_router::{LoadSignal, Policy, Worker};
use loadlink_wire::LoadSnapshot;
use loadlink_wire::kv_events::KvEventBatch;

mod common;
use common::{BLOCKS, chain, stored_batch};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Counts allocations, to prove the steady-state pick makes none.
struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const WORKERS: usize = 64;
const RANKS: usize = 8;
fn batch(hashes: &[i64]) -> KvEventBatch {
    stored_batch(hashes, None)
}

/// The fleet, its KV book, and the request's chain; `holders` ranks (spread over the fleet) hold
/// a prefix of the chain, of different lengths.
fn fleet(holders: usize) -> (Vec<Arc<Worker>>, CacheBook, Vec<i64>) {
    let epoch = Instant::now();
    let book = CacheBook::new(1 << 22);
    let prompt = chain(7);
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| {
            let w = Arc::new(Worker::new(format!("http://w{i}"), RANKS, None, epoch));
            let ids = book.register(&w, 16, RANKS as u32);
            for (r, (id, _)) in ids.iter().enumerate() {
                let k = i * RANKS + r;
                w.record(
                    r,
                    0,
                    &LoadSnapshot {
                        num_running_reqs: (k * 7 % 13) as i64,
                        num_waiting_reqs: (k % 5) as i64,
                        num_waiting_uncached_tokens: (k * 131 % 4096) as i64,
                        ..Default::default()
                    },
                );
                let every = WORKERS * RANKS / holders;
                if k.is_multiple_of(every) {
                    let depth = (k * BLOCKS / (WORKERS * RANKS)).max(1);
                    book.apply(*id, &batch(&prompt[..depth]));
                }
                book.apply(*id, &batch(&chain(1000 + k as u32)[..64]));
            }
            w
        })
        .collect();
    (workers, book, prompt)
}

/// One pick as the proxy makes it: the lookup for every candidate, then the policy.
fn pick(
    policy: Policy,
    book: &CacheBook,
    targets: Candidates<'_>,
    prompt: &[i64],
    cached: &mut Vec<u64>,
    seq: u64,
) -> Option<usize> {
    book.cached_tokens(targets, prompt, 16, cached);
    let workers = targets.workers();
    let mut view = FleetView::new(workers, LoadSignal::Backlog, 60_000)
        .with_prefix(prompt.len() as u64 * 16, cached);
    view.targets = targets;
    policy.pick(&view, seq)
}

fn bench(c: &mut Criterion) {
    // Every rank holds some prefix of the request (the worst case for the lookup), and the common
    // case: the request's prefix lives on 16 of the 512 ranks.
    for holders in [WORKERS * RANKS, 16] {
        bench_fleet(c, holders);
    }
}

fn bench_fleet(c: &mut Criterion, holders: usize) {
    let (workers, book, prompt) = fleet(holders);
    let list = CandidateList::of(&workers, loadlink_router::candidate::RankField::Both);
    assert_eq!(list.ranked.len(), WORKERS * RANKS);
    let targets = Candidates::listed(&workers, &list.ranked);
    let mut cached = Vec::with_capacity(list.ranked.len());
    let policies = [
        ("min_ttft", Policy::MinTtft(MinTtft::default())),
        ("cache_aware", Policy::CacheAware(CacheAware::default())),
        ("power_of_two", Policy::PowerOfTwo),
        ("least_load", Policy::LeastLoad),
    ];
    for (name, p) in policies {
        for s in 0..16 {
            pick(p, &book, targets, &prompt, &mut cached, s); // warm the scratch buffers
        }
        let before = ALLOCS.load(Relaxed);
        for s in 0..1000 {
            black_box(pick(p, &book, targets, &prompt, &mut cached, s));
        }
        let allocs = ALLOCS.load(Relaxed) - before;
        assert_eq!(allocs, 0, "{name}: a steady-state pick allocated");
        eprintln!("{name} ({holders} holders): 0 allocations over 1,000 steady-state picks");
    }
    let mut g = c.benchmark_group(format!("rank_pick_64x8_8k_chain_{holders}_holders"));
    // The floor of any per-rank price: reach each candidate's rank and read four of its figures.
    g.bench_function("floor_read_4_figures_per_rank", |b| {
        b.iter(|| {
            let mut sum = 0i64;
            for c in targets.iter() {
                let w = &workers[c.worker as usize];
                if let Some(r) = c.rank.and_then(|r| w.ranks.get(r as usize)) {
                    sum = sum
                        .wrapping_add(r.backlog.load(Relaxed))
                        .wrapping_add(r.running.load(Relaxed))
                        .wrapping_add(r.waiting.load(Relaxed))
                        .wrapping_add(r.token_usage_bits.load(Relaxed) as i64);
                }
            }
            black_box(sum)
        })
    });
    g.bench_function("lookup_only", |b| {
        b.iter(|| book.cached_tokens(targets, black_box(&prompt), 16, &mut cached))
    });
    for (name, p) in policies {
        let mut seq = 0u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                seq += 1;
                pick(p, &book, targets, black_box(&prompt), &mut cached, seq)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
