//! What the KV benches build the same way: an 8k-token prompt's page-hash chain, and a batch that
//! stores some blocks.

use loadlink_wire::kv_events::{BlockStored, KvEvent, KvEventBatch, page_hashes};

/// Blocks of 16 tokens in a prompt's chain (8k tokens).
pub const BLOCKS: usize = 512;

/// The chain of an 8k-token prompt whose tokens are salted with `salt`.
pub fn chain(salt: u32) -> Vec<i64> {
    let tokens: Vec<u32> = (0..(BLOCKS as u32 * 16)).map(|i| i ^ salt).collect();
    page_hashes(&tokens, 16)
}

/// One batch storing `hashes` (pages of 16), from rank `rank`.
pub fn stored_batch(hashes: &[i64], rank: Option<i64>) -> KvEventBatch {
    KvEventBatch {
        ts: 1.0,
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: hashes.to_vec(),
            token_ids: vec![7; hashes.len() * 16],
            block_size: 16,
            ..Default::default()
        })],
        attn_dp_rank: rank,
    }
}
