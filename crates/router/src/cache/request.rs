//! A request as the caches see it: its prompt's token ids, tokenized once, and the block-hash
//! chains of their full pages, hashed once per block size the request is matched at.
//!
//! * **One chain per block size.** A worker's KV events name pages of *its* `block_size`, so a
//!   request is matched against it with the chain hashed at that size (the approximate tree uses
//!   the router's `--page-size`). The chains are computed lazily, only for the sizes the request's
//!   candidates have, and kept here for the life of the request: a fleet of one size hashes once.
//! * **Full pages of all but the last token.** The engine must compute the last prompt token's
//!   logits, so it never reuses it; and SGLang (`RadixKey::page_aligned`) stores, announces and
//!   matches page-aligned keys only, so a shorter last page is never hashed here either.
//! * The chain uses SGLang's page hashes (`loadlink_wire::kv_events::page_hashes`, computed at the
//!   compression function by `chain_hash.rs` for speed), so the same
//!   numbers key the KV index (the engines' announcements) and the approximate tree (what this
//!   router sent). A body that is not a generation request, or that the engine would refuse, has
//!   no chain: it is routed on load alone, and the engine answers the client's mistake itself.

use super::chain_hash::page_hashes_from;
use super::tokenizer::RouterTokenizer;
use loadlink_wire::kv_namespace::{Namespace, namespaced_block_hash};
use loadlink_wire::prompt::{Prompt, PromptRoute, json_object, prompt_of};
use smallvec::SmallVec;

/// The token ids of the request at `path` with `body` under `tok` (a chat request through the
/// model's chat template when it has one), or why it has none the router can price.
pub fn prompt_ids(path: &str, body: &[u8], tok: &RouterTokenizer) -> Result<Vec<u32>, String> {
    let route =
        PromptRoute::of_path(path).ok_or_else(|| format!("{path}: not a generation route"))?;
    let m = json_object(body)?;
    let prompt = prompt_of(route, &m)?;
    if let Prompt::Chat(_) = prompt
        && let Some(ids) = tok.chat_request_ids(body)
    {
        return ids;
    }
    Ok(prompt.token_ids(tok))
}

/// What a cache-aware policy needs to know about one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptChain {
    pub prompt_tokens: u64,
    /// The ids an engine can reuse: the prompt without its last token.
    matchable: Vec<u32>,
    /// Chains already hashed, by block size: the block hashes of the full pages, root first.
    chains: SmallVec<[(u64, Vec<i64>); 2]>,
    /// The request's cache namespace, as its engine hashes it ([`ChainNamespace`]).
    ns: ChainNamespace,
}

/// How a namespace changes a request's chain (`loadlink_wire::kv_namespace`): the chain's first
/// prior (a `cache_salt`) and the seed every hash is re-hashed with (an adapter). Both absent: the
/// shared namespace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChainNamespace {
    pub prior: Option<[u8; 32]>,
    pub seed: Option<[u8; 32]>,
}

impl From<&Namespace> for ChainNamespace {
    fn from(ns: &Namespace) -> Self {
        ChainNamespace {
            prior: ns.prior(),
            seed: ns.event_seed(),
        }
    }
}

impl PromptChain {
    /// The request at `path` with `body` tokenized by `tok`, or `None` when it has no prompt to
    /// price.
    pub fn of_request(path: &str, body: &[u8], tok: &RouterTokenizer) -> Option<Self> {
        prompt_ids(path, body, tok).ok().map(Self::of_ids)
    }

    /// A prompt of token ids `ids`.
    pub fn of_ids(mut ids: Vec<u32>) -> Self {
        let prompt_tokens = ids.len() as u64;
        ids.pop();
        PromptChain {
            prompt_tokens,
            matchable: ids,
            chains: SmallVec::new(),
            ns: ChainNamespace::default(),
        }
    }

    /// The same prompt in namespace `ns` (before any chain is hashed).
    pub fn in_namespace(mut self, ns: ChainNamespace) -> Self {
        self.chains.clear();
        self.ns = ns;
        self
    }

    /// The chain at `block_size` tokens per page, hashed on first use (a size of 0 has none).
    /// A chain already hashed and its block size (the first one hashed), if any.
    pub fn any_chain(&self) -> Option<(u64, &[i64])> {
        self.chains.first().map(|(b, c)| (*b, c.as_slice()))
    }

    pub fn chain(&mut self, block_size: u64) -> &[i64] {
        let at = match self.chains.iter().position(|(b, _)| *b == block_size) {
            Some(i) => i,
            None => {
                let mut chain = match usize::try_from(block_size) {
                    Ok(b) if b > 0 => page_hashes_from(&self.matchable, b, self.ns.prior),
                    _ => Vec::new(),
                };
                if let Some(seed) = &self.ns.seed {
                    chain
                        .iter_mut()
                        .for_each(|h| *h = namespaced_block_hash(*h, Some(seed)));
                }
                self.chains.push((block_size, chain));
                self.chains.len() - 1
            }
        };
        &self.chains[at].1
    }

    /// The chain at `block_size` if it was hashed already.
    pub fn hashed(&self, block_size: u64) -> Option<&[i64]> {
        self.chains
            .iter()
            .find(|(b, _)| *b == block_size)
            .map(|(_, c)| c.as_slice())
    }

    /// Block sizes hashed so far, in the order they were asked for.
    pub fn hashed_sizes(&self) -> impl Iterator<Item = u64> + '_ {
        self.chains.iter().map(|(b, _)| *b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loadlink_wire::kv_events::page_hashes;
    use loadlink_wire::tokenize::tokenize;

    #[test]
    fn chains_are_the_engine_s_page_hashes_at_each_size() {
        let tok = RouterTokenizer::default();
        let text = "a".repeat(4 * 40);
        let body = serde_json::json!({ "prompt": text }).to_string();
        let mut c = PromptChain::of_request("/v1/completions", body.as_bytes(), &tok).unwrap();
        assert_eq!(c.prompt_tokens, 40);
        assert_eq!(c.hashed(16), None, "nothing is hashed until asked");
        let ids = tokenize(&text);
        assert_eq!(c.chain(16), page_hashes(&ids[..39], 16));
        assert_eq!(
            c.chain(16).len(),
            2,
            "only full pages of all but the last token"
        );
        assert_eq!(c.chain(1), page_hashes(&ids[..39], 1));
        assert_eq!(c.chain(1).len(), 39);
        assert_eq!(c.chain(64), &[] as &[i64], "no full page at 64");
        assert_eq!(c.chain(0), &[] as &[i64]);
        assert_eq!(c.hashed_sizes().collect::<Vec<_>>(), [16, 1, 64, 0]);
        c.chain(16);
        assert_eq!(c.hashed_sizes().count(), 4, "a size is hashed once");
        let one = c.chain(1)[0];
        assert_ne!(one, c.chain(16)[0], "sizes never share hashes");
        assert_eq!(PromptChain::of_request("/v1/models", b"{}", &tok), None);
        let lora = Namespace {
            lora: Some(loadlink_wire::kv_namespace::LoraRef::from_path("a", "/a")),
            cache_salt: Some("s".into()),
            ..Default::default()
        };
        let mut n = PromptChain::of_ids(ids.clone()).in_namespace((&lora).into());
        assert_eq!(
            n.chain(16),
            lora.event_hashes(&ids[..39], 16),
            "a namespaced chain is what the engine publishes in that namespace"
        );
        assert_eq!(PromptChain::of_request("/generate", b"{", &tok), None);
    }
}
