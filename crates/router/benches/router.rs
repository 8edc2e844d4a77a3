//! Hot paths of the router: a policy pick over the live LoadBook, and one load message from raw
//! frames to an updated book entry.

use criterion::{BenchmarkId, Criterion, black_box, criterion_group, criterion_main};
use loadlink_router::fleet::FleetView;
use loadlink_router::{LoadSignal, Policy, Worker};
use loadlink_wire::codec::snapshot_bytes;
use loadlink_wire::frame::{decode_frames, seq_frame};
use loadlink_wire::{LoadSnapshot, Payload};
use std::sync::Arc;
use std::time::Instant;

fn fleet(n: usize) -> Vec<Arc<Worker>> {
    let epoch = Instant::now();
    (0..n)
        .map(|i| {
            let w = Arc::new(Worker::new(format!("http://w{i}"), 2, None, epoch));
            for r in 0..2 {
                w.record(
                    r,
                    0,
                    &LoadSnapshot {
                        num_running_reqs: (i * 7 % 13) as i64,
                        num_waiting_reqs: (i % 5) as i64,
                        ..Default::default()
                    },
                );
            }
            w
        })
        .collect()
}

fn picks(c: &mut Criterion) {
    let mut g = c.benchmark_group("pick");
    for n in [8usize, 64, 1024] {
        let ws = fleet(n);
        let view = FleetView::new(&ws, LoadSignal::Engine, 60_000);
        let mut seq = 0u64;
        g.bench_with_input(BenchmarkId::new("power_of_two", n), &n, |b, _| {
            b.iter(|| {
                seq += 1;
                Policy::PowerOfTwo.pick(black_box(&view), seq)
            })
        });
        g.bench_with_input(BenchmarkId::new("least_load", n), &n, |b, _| {
            b.iter(|| {
                seq += 1;
                Policy::LeastLoad.pick(black_box(&view), seq)
            })
        });
    }
    g.finish();
}

fn ingest(c: &mut Criterion) {
    let w = Worker::new("http://w".into(), 1, None, Instant::now());
    let snap = LoadSnapshot {
        timestamp: Some(1.0),
        num_running_reqs: 57,
        num_waiting_reqs: 12,
        num_used_tokens: 300_000,
        num_total_tokens: 320_000,
        max_total_num_tokens: 524_288,
        token_usage: Some(0.57),
        gen_throughput: Some(2000.0),
        cache_hit_rate: Some(0.4),
        utilization: Some(0.9),
        ..Default::default()
    };
    let payload = snapshot_bytes(&snap);
    let mut seq = 0i64;
    c.bench_function("frame_decode_and_book_update", |b| {
        b.iter(|| {
            seq += 1;
            let sf = seq_frame(seq);
            let frames: [&[u8]; 3] = [b"", &sf, &payload];
            let m = decode_frames(black_box(&frames)).unwrap();
            if let Payload::Snapshot(s) = &m.payload {
                w.record(0, m.seq, s);
            }
        })
    });
}

criterion_group!(benches, picks, ingest);
criterion_main!(benches);
