//! Hot paths of the router: a policy pick over the live LoadBook, one load message from raw
//! frames to an updated book entry, and the ingest's drain of a real libzmq SUB (inproc, so the
//! figure is the receive path without TCP): one message, and a backlog of 16 decoded once.

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

/// `drain_rank` on an inproc SUB holding `backlog` queued messages (refilled outside the timing).
fn drain(c: &mut Criterion) {
    use loadlink_router::ingest::drain::{Scratch, drain_rank};
    use loadlink_router::ingest::stats::IngestStats;
    let ctx = zmq::Context::new();
    let p = ctx.socket(zmq::PUB).unwrap();
    p.set_sndhwm(100_000).unwrap();
    p.bind("inproc://drain-bench").unwrap();
    let sub = loadlink_router::subscribe::open(&ctx, "inproc://drain-bench", b"").unwrap();
    let payload = snapshot_bytes(&LoadSnapshot {
        num_running_reqs: 5,
        timestamp: Some(1.0),
        ..Default::default()
    });
    let send = |seq: i64| {
        let sf = seq_frame(seq);
        p.send_multipart([&b""[..], &sf, &payload], 0).unwrap();
    };
    // Join: the subscription reaches the PUB when it next processes commands.
    while !sub.get_events().unwrap().contains(zmq::POLLIN) {
        send(0);
    }
    let w = Worker::new("http://w".into(), 1, None, Instant::now());
    let (stats, mut scratch) = (IngestStats::default(), Scratch::default());
    drain_rank(&sub, &w, 0, &mut scratch, &stats);
    let mut seq = 1i64;
    for backlog in [1usize, 16] {
        c.bench_function(&format!("drain_inproc_backlog_{backlog}"), |b| {
            b.iter_batched(
                || {
                    for _ in 0..backlog {
                        seq += 1;
                        send(seq);
                    }
                },
                |()| drain_rank(&sub, &w, 0, &mut scratch, &stats),
                criterion::BatchSize::SmallInput,
            )
        });
    }
}

criterion_group!(benches, picks, ingest, drain);
criterion_main!(benches);
