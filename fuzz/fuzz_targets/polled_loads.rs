//! The `/v1/loads` reader (a polled worker's JSON page) must never panic, and what it accepts
//! must be something the router can store: ranks that are not negative, sorted, one snapshot each.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loadlink_wire::polled::loads_from_json;

fuzz_target!(|data: &[u8]| {
    if let Ok(snaps) = loads_from_json(data) {
        assert!(!snaps.is_empty());
        assert!(snaps.iter().all(|s| s.dp_rank >= 0));
        assert!(snaps.windows(2).all(|w| w[0].dp_rank <= w[1].dp_rank));
    }
});
