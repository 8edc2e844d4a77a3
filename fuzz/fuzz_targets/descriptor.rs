//! `/server_info` parsing and load-endpoint derivation on arbitrary bodies and worker hosts.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(d)) = loadlink_wire::descriptor::parse_server_info(data) {
        let host = std::str::from_utf8(&data[..data.len().min(16)]).unwrap_or("h");
        for ep in d.load_endpoints(host) {
            assert!(ep.endpoint.starts_with("tcp://"));
        }
    }
});
