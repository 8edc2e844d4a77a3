//! A token sequence's page hashes as the engine's cache names its pages (SGLang's SHA-256 chain,
//! [`loadlink_wire::kv_events::page_digest`]), extended as the sequence grows: a request hashes its
//! prompt once and only its new full pages as it decodes.

use loadlink_wire::kv_events::{block_hash, page_digest};

/// The page hashes of a token sequence, with the digest the next page would chain from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageChain {
    pub hashes: Vec<i64>,
    last: Option<[u8; 32]>,
    /// Tokens already hashed (a multiple of the page size).
    hashed: usize,
}

impl PageChain {
    /// Hashes every full page of `tokens` not hashed yet (`tokens` must extend what was hashed).
    pub fn extend(&mut self, tokens: &[u32], page_size: usize) {
        let page_size = page_size.max(1);
        while self.hashed + page_size <= tokens.len() {
            let d = page_digest(
                self.last.as_ref(),
                &tokens[self.hashed..self.hashed + page_size],
            );
            self.hashes.push(block_hash(&d));
            self.last = Some(d);
            self.hashed += page_size;
        }
    }

    pub fn of(tokens: &[u32], page_size: usize) -> Self {
        let mut c = PageChain::default();
        c.extend(tokens, page_size);
        c
    }
}
