//! A scraped `/metrics` page: the strict parser and the scheduler-gauge reader must never panic
//! on any text, and what the reader accepts must be one snapshot per distinct, non-negative rank
//! in rank order, with counts that are not negative.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loadlink_wire::polled::loads_from_metrics;
use loadlink_wire::prom::parse;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(page) = parse(&text) {
        for f in &page.families {
            assert!(!f.name.is_empty());
        }
    }
    if let Ok((_, snaps)) = loads_from_metrics(&text) {
        assert!(snaps.windows(2).all(|w| w[0].dp_rank < w[1].dp_rank));
        for s in &snaps {
            assert!(s.dp_rank >= 0);
            assert!(s.num_running_reqs >= 0 && s.num_waiting_reqs >= 0);
            assert!(s.token_usage.is_none_or(f64::is_finite));
        }
    }
});
