//! The three-frame decoder, fed frames cut from arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let n = data.first().copied().unwrap_or(0) as usize % 5;
    let rest = data.get(1..).unwrap_or_default();
    let cut = rest.len() / 3;
    let parts = [&rest[..cut.min(8)], &rest[cut.min(8)..cut.min(8) + cut.min(9)], &rest[cut.min(8) + cut.min(9)..], b"", b"x"];
    let _ = loadlink_wire::frame::decode_frames(&parts[..n]);
});
