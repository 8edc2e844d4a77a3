//! A request as the caches see it: its prompt's token count and the block-hash chain of its full
//! pages, computed once per request and matched against every worker.
//!
//! The chain uses SGLang's page hashes (`loadlink_wire::kv_events::page_hashes`), so the same
//! numbers key the KV index (the engines' announcements) and the approximate tree (what this
//! router sent). A body that is not a generation request, or that the engine would refuse, has no
//! chain: it is routed on load alone, and the engine answers the client's mistake itself.

use super::tokenizer::RouterTokenizer;
use loadlink_wire::kv_events::page_hashes;
use loadlink_wire::prompt::{PromptRoute, json_object, prompt_of};

/// What a cache-aware policy needs to know about one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptChain {
    pub prompt_tokens: u64,
    /// Block hashes of the prompt's full pages, root first.
    pub chain: Vec<i64>,
}

impl PromptChain {
    /// The chain of the request at `path` with `body`, or `None` when it has no prompt to price.
    pub fn of_request(
        path: &str,
        body: &[u8],
        tok: &RouterTokenizer,
        page_size: usize,
    ) -> Option<Self> {
        let route = PromptRoute::of_path(path)?;
        let m = json_object(body).ok()?;
        let ids = prompt_of(route, &m).ok()?.token_ids(tok);
        // The engine matches all but the prompt's last token (its logits must be computed), so
        // only the full pages of that part can ever be a hit.
        let matchable = &ids[..ids.len().saturating_sub(1)];
        Some(PromptChain {
            prompt_tokens: ids.len() as u64,
            chain: page_hashes(matchable, page_size),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loadlink_wire::tokenize::tokenize;

    #[test]
    fn chains_are_the_engine_s_page_hashes() {
        let tok = RouterTokenizer::default();
        let text = "a".repeat(4 * 40);
        let body = serde_json::json!({ "prompt": text }).to_string();
        let c = PromptChain::of_request("/v1/completions", body.as_bytes(), &tok, 16).unwrap();
        assert_eq!(c.prompt_tokens, 40);
        assert_eq!(c.chain, page_hashes(&tokenize(&text)[..39], 16));
        assert_eq!(
            c.chain.len(),
            2,
            "only full pages of all but the last token"
        );
        assert_eq!(PromptChain::of_request("/v1/models", b"{}", &tok, 16), None);
        assert_eq!(PromptChain::of_request("/generate", b"{", &tok, 16), None);
    }
}
