//! The SLNS slot-file header and slot reader on arbitrary file contents.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loadlink_wire::shm::{Header, read_slot};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::decode(data) {
        for r in 0..h.dp_size.min(64) as u32 {
            let range = h.slot_range(r).expect("rank below dp_size");
            if let Some(p) = read_slot(&data[range]) {
                let _ = loadlink_wire::decode_payload(p);
            }
        }
    }
    let _ = read_slot(data);
});
