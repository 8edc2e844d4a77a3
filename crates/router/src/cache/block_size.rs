//! Which advertised block sizes the router can hash a request at.
//!
//! A prefix hash only meets the engine's when both sides cut the same pages, so every worker's
//! chain is hashed at the `block_size` its `/server_info` advertises (see `request.rs`). Zero and
//! negative sizes never get this far (discovery refuses the stream and says why). What is left to
//! refuse here is a size no engine pages by: a multi-megatoken page would never produce a hit and
//! only costs hashing, so such a worker is priced from the approximate tree instead, and
//! `/workers` says so.

/// The largest block size matched against the KV index: above any real engine's page (SGLang and
/// vLLM page by 1 to a few thousand tokens), far below a size that could only be a mistake.
pub const MAX_MATCHED_BLOCK_SIZE: u64 = 1 << 16;

/// Why a worker advertising `block_size` cannot be matched, or `None` when it can.
pub fn unmatched_reason(block_size: u64) -> Option<String> {
    match block_size {
        0 => Some("the worker advertises block_size 0: its pages cannot be hashed; priced from the approximate tree".into()),
        b if b > MAX_MATCHED_BLOCK_SIZE => Some(format!(
            "the worker advertises block_size {b}, above the {MAX_MATCHED_BLOCK_SIZE} tokens the router hashes pages at: priced from the approximate tree"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_page_sizes_match_and_absurd_ones_say_why() {
        for b in [1, 16, 64, 2048, MAX_MATCHED_BLOCK_SIZE] {
            assert_eq!(unmatched_reason(b), None, "{b}");
        }
        assert!(unmatched_reason(0).unwrap().contains("block_size 0"));
        let big = unmatched_reason(1 << 40).unwrap();
        assert!(
            big.contains("1099511627776") && big.contains("approximate tree"),
            "{big}"
        );
    }
}
