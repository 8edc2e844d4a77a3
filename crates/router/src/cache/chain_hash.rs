//! SGLang's page-hash chain (`loadlink_wire::kv_events::page_hashes`, the reference) computed with
//! the SHA-256 compression function directly, for the request path.
//!
//! At page size 1 (SGLang's default) a request costs one hash per token, so the per-hash overhead
//! of the streaming `Digest` API (a hasher per page, its buffer, two updates, finalisation) is
//! most of the cost: a page's message (the previous page's 32-byte digest and the page's token ids
//! as little-endian u32) is padded here by hand into 64-byte blocks and fed to `sha2`'s
//! `compress256`, which uses the CPU's SHA extensions when it has them. At page size 1 that is
//! exactly one compression per token. The unit test holds it equal to the reference.

use sha2::compress256;
use sha2::digest::generic_array::GenericArray;

/// SHA-256's initial hash value (FIPS 180-4, 5.3.3).
const IV: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// The block hashes of every full `page_size`-token page of `tokens`, chained from `prior` (the
/// root when `None`; a salted namespace's first prior otherwise): the same numbers as
/// `loadlink_wire::kv_namespace::page_hashes_from`.
pub fn page_hashes_from(tokens: &[u32], page_size: usize, prior: Option<[u8; 32]>) -> Vec<i64> {
    let page = page_size.max(1);
    let mut out = Vec::with_capacity(tokens.len() / page);
    let mut buf: Vec<u8> = Vec::with_capacity(32 + 4 * page + 72);
    let mut prior = prior;
    for chunk in tokens.chunks_exact(page) {
        buf.clear();
        if let Some(p) = &prior {
            buf.extend_from_slice(p);
        }
        for t in chunk {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        let bits = (buf.len() as u64) * 8;
        // The message, 0x80, zeros up to 8 bytes short of a block boundary, its length in bits.
        let padded = (buf.len() + 9).div_ceil(64) * 64;
        buf.push(0x80);
        buf.resize(padded - 8, 0);
        buf.extend_from_slice(&bits.to_be_bytes());
        let mut state = IV;
        for block in buf.chunks_exact(64) {
            compress256(
                &mut state,
                std::slice::from_ref(GenericArray::from_slice(block)),
            );
        }
        let mut digest = [0u8; 32];
        for (d, w) in digest.chunks_exact_mut(4).zip(state) {
            d.copy_from_slice(&w.to_be_bytes());
        }
        out.push(((u64::from(state[0]) << 32) | u64::from(state[1])) as i64);
        prior = Some(digest);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page_hashes(t: &[u32], page: usize) -> Vec<i64> {
        page_hashes_from(t, page, None)
    }

    #[test]
    fn equals_the_reference_chain_at_every_size_and_length() {
        let tokens: Vec<u32> = (0..700u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        for page in 1..=70 {
            for len in [0, 1, page - 1, page, page + 1, 3 * page + 2, 700] {
                let t = &tokens[..len.min(700)];
                assert_eq!(
                    page_hashes(t, page),
                    loadlink_wire::kv_events::page_hashes(t, page),
                    "page {page}, {len} tokens"
                );
            }
        }
        assert_eq!(page_hashes(&tokens[..5], 0), page_hashes(&tokens[..5], 1));
        let prior = loadlink_wire::kv_namespace::salt_prior("s");
        for page in [1, 3, 16] {
            assert_eq!(
                page_hashes_from(&tokens, page, Some(prior)),
                loadlink_wire::kv_namespace::page_hashes_from(&tokens, page, Some(&prior)),
                "salted, page {page}"
            );
        }
    }
}
