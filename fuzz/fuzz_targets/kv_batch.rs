//! The KV-event batch decoder on arbitrary bytes: it must never panic, and whatever it accepts
//! must encode back to bytes that decode to the same batch.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loadlink_wire::kv_events::{decode_kv_batch, kv_batch_bytes};

fuzz_target!(|data: &[u8]| {
    if let Ok(batch) = decode_kv_batch(data) {
        let again = decode_kv_batch(&kv_batch_bytes(&batch)).expect("our own encoding decodes");
        // NaN timestamps compare unequal; compare their bits.
        assert_eq!(again.ts.to_bits(), batch.ts.to_bits());
        assert_eq!((again.events, again.attn_dp_rank), (batch.events, batch.attn_dp_rank));
    }
});
