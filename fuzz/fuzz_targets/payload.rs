//! The payload decoder must never panic, and whatever it accepts must re-encode and decode to the
//! same value (the encoder is total over decoded values).
#![no_main]
use libfuzzer_sys::fuzz_target;
use loadlink_wire::codec::{decode_payload, snapshot_bytes, stat_bytes};
use loadlink_wire::Payload;

fuzz_target!(|data: &[u8]| {
    match decode_payload(data) {
        Ok(Payload::Snapshot(s)) => {
            let again = loadlink_wire::decode_snapshot(&snapshot_bytes(&s)).expect("re-encoded snapshot decodes");
            assert_eq!(snapshot_bytes(&again), snapshot_bytes(&s));
        }
        Ok(Payload::Stat(s)) => assert_eq!(loadlink_wire::decode_stat(&stat_bytes(&s)).expect("re-encoded stat decodes"), s),
        Err(_) => {}
    }
});
