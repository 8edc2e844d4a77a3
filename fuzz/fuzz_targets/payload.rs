//! The payload decoder must never panic, and whatever it accepts must re-encode and decode to the
//! same value (the encoder is total over decoded values). Decoding into a used snapshot (its
//! allocations reused) must agree with a fresh decode, on success and on failure.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loadlink_wire::codec::{decode_payload, decode_snapshot_into, snapshot_bytes, stat_bytes};
use loadlink_wire::{LoadSnapshot, Payload};

fuzz_target!(|data: &[u8]| {
    match decode_payload(data) {
        Ok(Payload::Snapshot(s)) => {
            let again = loadlink_wire::decode_snapshot(&snapshot_bytes(&s)).expect("re-encoded snapshot decodes");
            assert_eq!(snapshot_bytes(&again), snapshot_bytes(&s));
        }
        Ok(Payload::Stat(s)) => assert_eq!(loadlink_wire::decode_stat(&stat_bytes(&s)).expect("re-encoded stat decodes"), s),
        Err(_) => {}
    }
    // A used snapshot with both heap fields set, then the same bytes decoded into it.
    let mut used = LoadSnapshot {
        decode_moments: Some(vec![1.0, 2.0, 3.0]),
        num_running_reqs: 99,
        ..Default::default()
    };
    used.disaggregation = Some(loadlink_wire::snapshot::DisaggregationMetrics {
        mode: "prefill".into(),
        ..Default::default()
    });
    let fresh = loadlink_wire::decode_snapshot(data);
    let into = decode_snapshot_into(data, &mut used);
    assert_eq!(fresh.is_ok(), into.is_ok());
    if let Ok(fresh) = fresh {
        // Compared as bytes: the encoding is bit-exact, and NaN != NaN under PartialEq.
        assert_eq!(snapshot_bytes(&fresh), snapshot_bytes(&used));
    }
});
