//! What a generation request's prompt is, read the same way by the engine and the router.
//!
//! The engine turns the prompt into the token ids its prefix cache is keyed by; a cache-aware
//! router must arrive at the very same ids to know which cached blocks a request reuses. So the
//! reading of the three request shapes (`/v1/completions`, `/v1/chat/completions`, `/generate`)
//! lives here once, and tokenization is a [`Tokenizer`] the caller chooses: the engine's own
//! deterministic one ([`SimTokenizer`]), or, in the router, a real model's.
//!
//! Errors name the field and the expected form, as the engine answers them in a 400.

use crate::tokenize::{render_chat, tokenize_into};
use serde_json::{Map, Value};
use std::borrow::Cow;

/// Which request shape a body has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptRoute {
    /// `/v1/completions`: `input_ids`, or `prompt` as a string, strings, or token ids.
    Completions,
    /// `/v1/chat/completions`: `messages`.
    Chat,
    /// `/generate`: `input_ids` or `text`.
    Generate,
}

impl PromptRoute {
    /// The shape served at an HTTP path, if it is a generation route.
    pub fn of_path(path: &str) -> Option<Self> {
        match path {
            "/v1/completions" => Some(PromptRoute::Completions),
            "/v1/chat/completions" => Some(PromptRoute::Chat),
            "/generate" => Some(PromptRoute::Generate),
            _ => None,
        }
    }
}

/// One chat message, as the template sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTurn<'a> {
    pub role: &'a str,
    pub content: Cow<'a, str>,
}

/// A request's prompt before tokenization, borrowing from the parsed body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt<'a> {
    /// Token ids, taken as given.
    Ids(Vec<u32>),
    /// Text pieces, tokenized one after the other.
    Text(Vec<&'a str>),
    /// Chat messages, rendered by the chat template.
    Chat(Vec<ChatTurn<'a>>),
}

/// Turns text and chat into token ids.
pub trait Tokenizer {
    /// Appends the ids of `text` to `out`.
    fn encode_into(&self, text: &str, out: &mut Vec<u32>);
    /// The ids of `turns` rendered by the chat template, generation prompt included.
    fn chat(&self, turns: &[ChatTurn<'_>]) -> Vec<u32>;
}

/// The simulated engine's tokenizer and template ([`crate::tokenize`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SimTokenizer;

impl Tokenizer for SimTokenizer {
    fn encode_into(&self, text: &str, out: &mut Vec<u32>) {
        tokenize_into(text, out);
    }
    fn chat(&self, turns: &[ChatTurn<'_>]) -> Vec<u32> {
        render_chat(turns.iter().map(|t| (t.role, t.content.as_ref())))
    }
}

impl Prompt<'_> {
    /// The prompt's token ids under `tok`.
    pub fn token_ids(&self, tok: &impl Tokenizer) -> Vec<u32> {
        match self {
            Prompt::Ids(ids) => ids.clone(),
            Prompt::Text(parts) => {
                let mut out = Vec::new();
                parts.iter().for_each(|p| tok.encode_into(p, &mut out));
                out
            }
            Prompt::Chat(turns) => tok.chat(turns),
        }
    }
}

/// Parses `body` as a JSON object (the error names the body).
pub fn json_object(body: &[u8]) -> Result<Map<String, Value>, String> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err("body: expected a JSON object".into()),
        Err(e) => Err(format!("body: not valid JSON ({e})")),
    }
}

/// The prompt of a request of shape `route` whose body is `m`.
pub fn prompt_of(route: PromptRoute, m: &Map<String, Value>) -> Result<Prompt<'_>, String> {
    match route {
        PromptRoute::Completions => completions_prompt(m),
        PromptRoute::Chat => chat_prompt(m),
        PromptRoute::Generate => generate_prompt(m),
    }
}

fn token_ids(key: &str, v: &Value) -> Result<Vec<u32>, String> {
    let a = v
        .as_array()
        .ok_or_else(|| format!("{key}: expected a list of token ids"))?;
    a.iter()
        .map(|x| x.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| format!("{key}: expected a list of integer token ids from 0 to 4294967295"))
}

fn completions_prompt(m: &Map<String, Value>) -> Result<Prompt<'_>, String> {
    if let Some(ids) = m.get("input_ids") {
        return token_ids("input_ids", ids).map(Prompt::Ids);
    }
    match m.get("prompt") {
        None | Some(Value::Null) => {
            Err("prompt: required (a string, a list of strings, or a list of token ids)".into())
        }
        Some(Value::String(s)) => Ok(Prompt::Text(vec![s])),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) && !a.is_empty() => {
            Ok(Prompt::Text(a.iter().filter_map(Value::as_str).collect()))
        }
        Some(v @ Value::Array(_)) => token_ids("prompt", v).map(Prompt::Ids),
        Some(v) => Err(format!("prompt: expected a string or a list, got {v}")),
    }
}

fn chat_prompt(m: &Map<String, Value>) -> Result<Prompt<'_>, String> {
    let msgs = match m.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err("messages: must not be empty".into()),
        None | Some(Value::Null) => {
            return Err("messages: required (a list of {role, content} objects)".into());
        }
        Some(v) => return Err(format!("messages: expected a list, got {v}")),
    };
    msgs.iter()
        .enumerate()
        .map(|(i, msg)| chat_turn(i, msg))
        .collect::<Result<_, _>>()
        .map(Prompt::Chat)
}

fn chat_turn(i: usize, msg: &Value) -> Result<ChatTurn<'_>, String> {
    let Some(o) = msg.as_object() else {
        return Err(format!(
            "messages[{i}]: expected an object with role and content"
        ));
    };
    let Some(role) = o.get("role").and_then(Value::as_str) else {
        return Err(format!("messages[{i}].role: required string"));
    };
    let content = match o.get("content") {
        Some(Value::String(s)) => Cow::Borrowed(s.as_str()),
        Some(Value::Array(parts)) => Cow::Owned(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
        ),
        None | Some(Value::Null) => Cow::Borrowed(""),
        Some(v) => {
            return Err(format!(
                "messages[{i}].content: expected a string or a list of parts, got {v}"
            ));
        }
    };
    Ok(ChatTurn { role, content })
}

fn generate_prompt(m: &Map<String, Value>) -> Result<Prompt<'_>, String> {
    match (m.get("input_ids"), m.get("text")) {
        (Some(ids), _) if !ids.is_null() => token_ids("input_ids", ids).map(Prompt::Ids),
        (_, Some(Value::String(s))) => Ok(Prompt::Text(vec![s])),
        (_, Some(v)) if !v.is_null() => Err(format!("text: expected a string, got {v}")),
        _ => Err("text or input_ids: one is required".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::tokenize;

    fn ids(route: PromptRoute, body: &str) -> Result<Vec<u32>, String> {
        let m = json_object(body.as_bytes())?;
        Ok(prompt_of(route, &m)?.token_ids(&SimTokenizer))
    }

    #[test]
    fn every_shape_reads_to_the_engine_s_ids() {
        use PromptRoute::*;
        assert_eq!(
            ids(Completions, r#"{"prompt":"abcdefgh"}"#).unwrap(),
            tokenize("abcdefgh")
        );
        assert_eq!(
            ids(Completions, r#"{"prompt":["abcd","efgh"]}"#).unwrap(),
            tokenize("abcdefgh")
        );
        assert_eq!(ids(Completions, r#"{"prompt":[7,8]}"#).unwrap(), [7, 8]);
        assert_eq!(
            ids(Completions, r#"{"prompt":"x","input_ids":[1,2]}"#).unwrap(),
            [1, 2]
        );
        assert_eq!(
            ids(Generate, r#"{"text":"abcd"}"#).unwrap(),
            tokenize("abcd")
        );
        let parts = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"ab"},{"type":"text","text":"cd"}]}]}"#;
        assert_eq!(
            ids(Chat, parts).unwrap(),
            render_chat([("user", "abcd")]),
            "content parts join"
        );
        assert_eq!(PromptRoute::of_path("/generate"), Some(Generate));
        assert_eq!(PromptRoute::of_path("/v1/models"), None);
    }

    #[test]
    fn errors_name_the_field() {
        use PromptRoute::*;
        let e = |r, b: &str| ids(r, b).unwrap_err();
        assert!(e(Chat, r#"{"model":"m"}"#).starts_with("messages: required"));
        assert!(e(Chat, r#"{"messages":[]}"#).starts_with("messages: must not be empty"));
        assert!(e(Chat, r#"{"messages":[{"content":"x"}]}"#).starts_with("messages[0].role"));
        assert!(e(Completions, r#"{"prompt":[4294967296]}"#).contains("4294967295"));
        assert!(e(Completions, r#"{"max_tokens":3}"#).starts_with("prompt: required"));
        assert!(e(Generate, r#"{"text":5}"#).starts_with("text: expected a string"));
        assert!(e(Completions, "[1]").starts_with("body: expected a JSON object"));
        assert!(e(Completions, "not json").starts_with("body: not valid JSON"));
    }
}
