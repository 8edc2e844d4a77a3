//! Request bodies of the OpenAI-compatible and SGLang-native routes, parsed by hand so every
//! error names the field and the expected form (a 400 a client can act on).
//!
//! Prompts are read by `loadlink_wire::prompt` (shared with the router) and become token ids:
//! `input_ids` (or a token-id `prompt`) are taken as given; text goes
//! through the engine's deterministic tokenizer and chat through its template
//! ([`crate::tokenize`]: one token per 4 characters, 3 template tokens per message plus 2 for the
//! generation prompt). The ids feed the prefix cache. The simulator has no EOS: it generates
//! exactly `max_tokens` (so `ignore_eos` is accepted and changes nothing).

use crate::routed::body_rank;
use loadlink_wire::prompt::{Prompt, PromptRoute, SimTokenizer, json_object, prompt_of};
use serde_json::{Map, Value};
use std::sync::Arc;

/// Which surface the request came in on (decides the response shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Completions,
    Chat,
    Generate,
}

/// A parsed generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    pub route: Route,
    pub model: Option<String>,
    /// The prompt's token ids.
    pub prompt: Arc<[u32]>,
    /// Their count (at least 1: an empty prompt still costs a step).
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    pub stream: bool,
    /// `stream_options.include_usage` (OpenAI) — usage in the last chunk.
    pub include_usage: bool,
    /// The body's DP rank (`routed_dp_rank`, else `data_parallel_rank`), as written; the
    /// header and the range check are applied by the handler ([`crate::routed`]).
    pub routed_dp_rank: Option<i128>,
    /// SGLang's `lora_path`: the adapter to run with, by name (loadlink also takes its path).
    pub lora_path: Option<String>,
    /// The cache namespace fields: `cache_salt` (empty counts as none, as in SGLang) and
    /// `extra_key`.
    pub cache_salt: Option<String>,
    pub extra_key: Option<String>,
    /// Prefill–decode disaggregation's fields (`bootstrap_*`, `rid`).
    pub bootstrap: crate::pd::fields::BootstrapFields,
}

/// The body fields that select an adapter and a cache namespace, on every route.
struct Scope {
    lora_path: Option<String>,
    cache_salt: Option<String>,
    extra_key: Option<String>,
}

fn scope(m: &Map<String, Value>) -> Result<Scope, String> {
    Ok(Scope {
        lora_path: one_string(m, "lora_path")?,
        cache_salt: one_string(m, "cache_salt")?.filter(|s| !s.is_empty()),
        extra_key: one_string(m, "extra_key")?,
    })
}

/// A string field, also taken in SGLang's batch form when the batch is one request: a list of one
/// string (or null).
fn one_string(m: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    let expected = || format!("{key}: expected a string or a list of one string");
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(a)) if a.len() == 1 => match &a[0] {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.clone())),
            _ => Err(expected()),
        },
        Some(_) => Err(expected()),
    }
}

/// Upper bound on `max_tokens` (a simulator guard against absurd values).
pub const MAX_TOKENS_LIMIT: u64 = 1 << 20;

/// The prompt's ids under the engine's own tokenizer (`loadlink_wire::prompt` reads the shapes).
fn prompt_ids(route: PromptRoute, m: &Map<String, Value>) -> Result<Vec<u32>, String> {
    prompt_of(route, m).map(|p: Prompt<'_>| p.token_ids(&SimTokenizer))
}

fn count(ids: &[u32]) -> u64 {
    (ids.len() as u64).max(1)
}

fn uint(m: &Map<String, Value>, key: &str, default: u64) -> Result<u64, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => match v.as_u64() {
            Some(n) if n <= MAX_TOKENS_LIMIT => Ok(n),
            Some(n) => Err(format!(
                "{key}: {n} exceeds the limit of {MAX_TOKENS_LIMIT}"
            )),
            None => Err(format!("{key}: expected a non-negative integer, got {v}")),
        },
    }
}

fn boolean(m: &Map<String, Value>, key: &str) -> Result<bool, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(format!("{key}: expected true or false, got {v}")),
    }
}

fn model(m: &Map<String, Value>) -> Result<Option<String>, String> {
    match m.get("model") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(format!("model: expected a string, got {v}")),
    }
}

fn include_usage(m: &Map<String, Value>) -> bool {
    m.get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// `/v1/completions`: `prompt` (string, list of strings, or token ids) or `input_ids`.
pub fn parse_completions(body: &[u8]) -> Result<GenRequest, String> {
    let m = json_object(body)?;
    boolean(&m, "ignore_eos")?;
    let ids = prompt_ids(PromptRoute::Completions, &m)?;
    let sc = scope(&m)?;
    Ok(GenRequest {
        route: Route::Completions,
        model: model(&m)?,
        prompt_tokens: count(&ids),
        prompt: ids.into(),
        max_tokens: uint(&m, "max_tokens", 16)?,
        stream: boolean(&m, "stream")?,
        include_usage: include_usage(&m),
        routed_dp_rank: body_rank(Route::Completions, &m)?,
        lora_path: sc.lora_path,
        cache_salt: sc.cache_salt,
        extra_key: sc.extra_key,
        bootstrap: crate::pd::fields::parse(&m)?,
    })
}

/// `/v1/chat/completions`: a non-empty `messages` list of `{role, content}`.
pub fn parse_chat(body: &[u8]) -> Result<GenRequest, String> {
    let m = json_object(body)?;
    boolean(&m, "ignore_eos")?;
    let ids = prompt_ids(PromptRoute::Chat, &m)?;
    let max_tokens = match m.get("max_completion_tokens") {
        Some(v) if !v.is_null() => uint(&m, "max_completion_tokens", 128)?,
        _ => uint(&m, "max_tokens", 128)?,
    };
    let sc = scope(&m)?;
    Ok(GenRequest {
        route: Route::Chat,
        model: model(&m)?,
        prompt_tokens: count(&ids),
        prompt: ids.into(),
        max_tokens,
        stream: boolean(&m, "stream")?,
        include_usage: include_usage(&m),
        routed_dp_rank: body_rank(Route::Chat, &m)?,
        lora_path: sc.lora_path,
        cache_salt: sc.cache_salt,
        extra_key: sc.extra_key,
        bootstrap: crate::pd::fields::parse(&m)?,
    })
}

/// `/generate` (SGLang native): `text` or `input_ids`, `sampling_params.max_new_tokens`.
/// `routing_key` (a per-rank waiting-queue order in SGLang, not a DP choice) is not modelled.
pub fn parse_generate(body: &[u8]) -> Result<GenRequest, String> {
    let m = json_object(body)?;
    let ids = prompt_ids(PromptRoute::Generate, &m)?;
    let max_tokens = match m.get("sampling_params") {
        None | Some(Value::Null) => 128,
        Some(Value::Object(sp)) => {
            boolean(sp, "ignore_eos").map_err(|e| format!("sampling_params.{e}"))?;
            uint(sp, "max_new_tokens", 128).map_err(|e| format!("sampling_params.{e}"))?
        }
        Some(v) => return Err(format!("sampling_params: expected an object, got {v}")),
    };
    let sc = scope(&m)?;
    Ok(GenRequest {
        route: Route::Generate,
        model: None,
        prompt_tokens: count(&ids),
        prompt: ids.into(),
        max_tokens,
        stream: boolean(&m, "stream")?,
        include_usage: true,
        routed_dp_rank: body_rank(Route::Generate, &m)?,
        lora_path: sc.lora_path,
        cache_salt: sc.cache_salt,
        extra_key: sc.extra_key,
        bootstrap: crate::pd::fields::parse(&m)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_tokens_and_defaults() {
        let r =
            parse_completions(br#"{"prompt":"abcdefghi","max_tokens":5,"stream":true}"#).unwrap();
        assert_eq!((r.prompt_tokens, r.max_tokens, r.stream), (3, 5, true));
        assert_eq!(
            parse_completions(br#"{"prompt":[1,2,3,4]}"#)
                .unwrap()
                .prompt_tokens,
            4
        );
        assert_eq!(
            parse_completions(br#"{"prompt":"x","input_ids":[1,2]}"#)
                .unwrap()
                .prompt_tokens,
            2
        );
        // <start> <user> abcd <end> <start> <assistant>
        let c = parse_chat(br#"{"messages":[{"role":"user","content":"abcd"}]}"#).unwrap();
        assert_eq!((c.prompt_tokens, c.max_tokens), (6, 128));
        assert!(
            parse_completions(br#"{"prompt":[4294967296]}"#)
                .unwrap_err()
                .contains("4294967295")
        );
        let g = parse_generate(br#"{"text":"abcdefgh","sampling_params":{"max_new_tokens":7}}"#)
            .unwrap();
        assert_eq!((g.prompt_tokens, g.max_tokens), (2, 7));
    }

    #[test]
    fn adapter_and_namespace_fields_on_every_route() {
        let c = parse_completions(
            br#"{"prompt":"x","lora_path":"a","cache_salt":"s","extra_key":["k"]}"#,
        )
        .unwrap();
        let fields = |r: &GenRequest| {
            (
                r.lora_path.clone(),
                r.cache_salt.clone(),
                r.extra_key.clone(),
            )
        };
        let some = |s: &str| Some(s.to_string());
        assert_eq!(fields(&c), (some("a"), some("s"), some("k")));
        let chat = parse_chat(
            br#"{"messages":[{"role":"user","content":"x"}],"lora_path":[null],"cache_salt":""}"#,
        )
        .unwrap();
        assert_eq!(fields(&chat), (None, None, None), "empty salt is none");
        let g = parse_generate(br#"{"text":"x","lora_path":"/p/a","extra_key":""}"#).unwrap();
        assert_eq!(fields(&g), (some("/p/a"), None, some("")));
        let e = parse_generate(br#"{"text":"x","lora_path":["a","b"]}"#).unwrap_err();
        assert!(e.starts_with("lora_path: expected a string"), "{e}");
        let e = parse_chat(br#"{"messages":[{"role":"user","content":"x"}],"cache_salt":7}"#)
            .unwrap_err();
        assert!(e.starts_with("cache_salt: expected a string"), "{e}");
    }

    #[test]
    fn errors_name_the_field() {
        let e = |r: Result<GenRequest, String>| r.unwrap_err();
        assert!(e(parse_chat(br#"{"model":"m"}"#)).starts_with("messages: required"));
        assert!(e(parse_chat(br#"{"messages":[]}"#)).starts_with("messages: must not be empty"));
        assert!(
            e(parse_chat(br#"{"messages":[{"content":"x"}]}"#)).starts_with("messages[0].role")
        );
        assert!(
            e(parse_completions(br#"{"prompt":"x","max_tokens":-1}"#))
                .starts_with("max_tokens: expected a non-negative integer")
        );
        assert!(e(parse_completions(b"not json")).starts_with("body: not valid JSON"));
        assert!(e(parse_completions(br#"[1]"#)).starts_with("body: expected a JSON object"));
        assert!(e(parse_completions(br#"{"max_tokens":3}"#)).starts_with("prompt: required"));
        assert!(
            e(parse_generate(
                br#"{"text":"x","sampling_params":{"max_new_tokens":"9"}}"#
            ))
            .starts_with("sampling_params.max_new_tokens")
        );
        assert!(
            e(parse_completions(br#"{"prompt":"x","stream":"yes"}"#))
                .starts_with("stream: expected true or false")
        );
    }
}
