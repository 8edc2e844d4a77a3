//! Property tests (10,000 cases each): payloads and frames round-trip, and no decoder panics on
//! arbitrary or corrupted bytes.

use loadlink_wire::codec::{
    decode_payload, decode_snapshot, decode_snapshot_into, decode_stat, snapshot_bytes, stat_bytes,
};
use loadlink_wire::descriptor::parse_server_info;
use loadlink_wire::frame::{decode_frames, seq_frame};
use loadlink_wire::shm::{Header, read_slot};
use loadlink_wire::snapshot::*;
use proptest::prelude::*;

fn any_int() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(0i64),
        Just(127),
        Just(128),
        Just(65536),
        Just(i64::MAX),
        Just(i64::MIN),
        -40i64..300,
        any::<i64>()
    ]
}

fn any_float() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0f64),
        Just(-0.0),
        any::<f64>().prop_filter("not NaN", |f| !f.is_nan())
    ]
}

fn opt_float() -> impl Strategy<Value = Option<f64>> {
    proptest::option::of(any_float())
}

prop_compose! {
    fn snapshot()(
        ints in proptest::collection::vec(any_int(), 12),
        floats in proptest::collection::vec(opt_float(), 5),
        moments in proptest::option::of(proptest::collection::vec(any_float(), 0..8)),
        mem in proptest::option::of((any_float(), any_float(), any_float(), any_int())),
        spec in proptest::option::of((any_float(), any_float())),
        lora in proptest::option::of((any_int(), any_int(), any_float())),
        dis in proptest::option::of(("[a-z]{0,40}", proptest::collection::vec(any_int(), 5), any_float(), any_float())),
        q in proptest::option::of(proptest::collection::vec(any_int(), 5)),
    ) -> LoadSnapshot {
        LoadSnapshot {
            timestamp: floats[0], dp_rank: ints[0], num_running_reqs: ints[1], num_waiting_reqs: ints[2],
            num_waiting_uncached_tokens: ints[3], num_used_tokens: ints[4], num_total_tokens: ints[5],
            num_active_tokens: ints[6], num_prealloc_ready_tokens: ints[7], max_total_num_tokens: ints[8],
            max_running_requests: ints[9], token_usage: floats[1], gen_throughput: floats[2],
            cache_hit_rate: floats[3], utilization: floats[4], total_prefill_uncached_tokens: ints[10],
            total_prefill_busy_us: ints[11], decode_moments: moments,
            memory: mem.map(|(a, b, c, d)| MemoryMetrics { weight_gb: a, kv_cache_gb: b, graph_gb: c, token_capacity: d }),
            speculative: spec.map(|(a, b)| SpeculativeMetrics { accept_length: a, accept_rate: b }),
            lora: lora.map(|(a, b, c)| LoraMetrics { slots_used: a, slots_total: b, utilization: c }),
            disaggregation: dis.map(|(m, v, a, b)| DisaggregationMetrics {
                mode: m, prefill_bootstrap_queue_reqs: v[0], prefill_inflight_queue_reqs: v[1],
                decode_prealloc_queue_reqs: v[2], decode_transfer_queue_reqs: v[3],
                decode_retracted_queue_reqs: v[4], kv_transfer_speed_gb_s: a, kv_transfer_latency_ms: b,
            }),
            queues: q.map(|v| QueueMetrics { waiting: v[0], grammar: v[1], paused: v[2], retracted: v[3], prealloc_ready: v[4] }),
        }
    }
}

prop_compose! {
    fn stat()(v in proptest::collection::vec(any_int(), 9), rank in proptest::option::of(any_int())) -> LoadStat {
        LoadStat {
            num_running_reqs: v[0], num_waiting_reqs: v[1], num_tokens: v[2], max_total_num_tokens: v[3],
            attn_dp_rank: rank, num_waiting_uncached_tokens: v[4], num_total_tokens: v[5],
            max_running_requests: v[6], total_prefill_uncached_tokens: v[7], total_prefill_busy_us: v[8],
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn snapshot_round_trips_bit_exact(s in snapshot(), mut prev in snapshot()) {
        let b = snapshot_bytes(&s);
        let back = decode_snapshot(&b).unwrap();
        prop_assert_eq!(&snapshot_bytes(&back), &b, "re-encoding gives the same bytes (incl. -0.0 and explicit 0.0)");
        prop_assert_eq!(&back, &s);
        // Decoding into a used snapshot (its allocations reused) leaves nothing of it behind.
        decode_snapshot_into(&b, &mut prev).unwrap();
        prop_assert_eq!(prev, s);
    }

    #[test]
    fn stat_round_trips(s in stat()) {
        prop_assert_eq!(decode_stat(&stat_bytes(&s)).unwrap(), s);
    }

    #[test]
    fn frames_round_trip(seq in 0i64..i64::MAX, topic in proptest::collection::vec(any::<u8>(), 0..8), s in stat()) {
        let payload = stat_bytes(&s);
        let frames = [topic, seq_frame(seq).to_vec(), payload];
        let m = decode_frames(&frames).unwrap();
        prop_assert_eq!(m.seq, seq);
        prop_assert_eq!(m.payload, loadlink_wire::Payload::Stat(s));
    }

    #[test]
    fn decoders_never_panic_on_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_payload(&b);
        let _ = decode_frames(&[b.as_slice(), &b[..b.len().min(8)], &b]);
        let _ = parse_server_info(&b);
        let _ = Header::decode(&b);
        let _ = read_slot(&b);
    }

    #[test]
    fn decoders_never_panic_on_corrupted_payloads(s in snapshot(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6), cut in any::<usize>()) {
        let mut b = snapshot_bytes(&s);
        for (i, v) in flips {
            let n = b.len();
            b[i % n] = v;
        }
        let _ = decode_payload(&b);
        let cut = cut % (b.len() + 1);
        let _ = decode_payload(&b[..cut]);
    }
}
