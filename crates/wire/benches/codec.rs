//! Encode/decode cost of a realistic snapshot (all sections present) and of a LoadStat.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use loadlink_wire::codec::{
    decode_snapshot, decode_snapshot_into, decode_stat, encode_snapshot, encode_stat,
};
use loadlink_wire::snapshot::*;

pub fn realistic() -> LoadSnapshot {
    LoadSnapshot {
        timestamp: Some(1_796_031_644.123),
        dp_rank: 3,
        num_running_reqs: 57,
        num_waiting_reqs: 12,
        num_waiting_uncached_tokens: 18_432,
        num_used_tokens: 301_722,
        num_total_tokens: 322_000,
        num_active_tokens: 322_000,
        num_prealloc_ready_tokens: 0,
        max_total_num_tokens: 524_288,
        max_running_requests: 128,
        token_usage: Some(0.5755),
        gen_throughput: Some(2_143.7),
        cache_hit_rate: Some(0.41),
        utilization: Some(0.87),
        total_prefill_uncached_tokens: 912_337_104,
        total_prefill_busy_us: 7_123_456_789,
        decode_moments: Some(vec![
            10_234.0,
            583_338.0,
            307_020_000.0,
            3.4e7,
            1.75e10,
            583_338.0,
        ]),
        memory: Some(MemoryMetrics {
            weight_gb: 14.2,
            kv_cache_gb: 52.8,
            graph_gb: 1.3,
            token_capacity: 524_288,
        }),
        speculative: Some(SpeculativeMetrics {
            accept_length: 2.71,
            accept_rate: 0.68,
        }),
        lora: Some(LoraMetrics {
            slots_used: 3,
            slots_total: 8,
            utilization: 0.375,
        }),
        disaggregation: Some(DisaggregationMetrics {
            mode: "decode".into(),
            prefill_bootstrap_queue_reqs: 0,
            prefill_inflight_queue_reqs: 0,
            decode_prealloc_queue_reqs: 4,
            decode_transfer_queue_reqs: 2,
            decode_retracted_queue_reqs: 1,
            kv_transfer_speed_gb_s: 21.5,
            kv_transfer_latency_ms: 3.2,
        }),
        queues: Some(QueueMetrics {
            waiting: 12,
            grammar: 1,
            paused: 0,
            retracted: 1,
            prealloc_ready: 4,
        }),
    }
}

fn codec(c: &mut Criterion) {
    let s = realistic();
    let mut buf = Vec::with_capacity(1024);
    encode_snapshot(&s, &mut buf);
    let bytes = buf.clone();
    println!("realistic snapshot: {} bytes", bytes.len());
    c.bench_function("snapshot_encode", |b| {
        b.iter(|| {
            buf.clear();
            encode_snapshot(black_box(&s), &mut buf);
        })
    });
    c.bench_function("snapshot_decode", |b| {
        b.iter(|| decode_snapshot(black_box(&bytes)).unwrap())
    });
    let mut into = LoadSnapshot::default();
    c.bench_function("snapshot_decode_into (allocations reused)", |b| {
        b.iter(|| decode_snapshot_into(black_box(&bytes), &mut into).unwrap())
    });
    let st = LoadStat::from_snapshot(&s, 3);
    let mut sbuf = Vec::with_capacity(64);
    encode_stat(&st, &mut sbuf);
    let sbytes = sbuf.clone();
    c.bench_function("stat_encode", |b| {
        b.iter(|| {
            sbuf.clear();
            encode_stat(black_box(&st), &mut sbuf);
        })
    });
    c.bench_function("stat_decode", |b| {
        b.iter(|| decode_stat(black_box(&sbytes)).unwrap())
    });
}

criterion_group!(benches, codec);
criterion_main!(benches);
