//! What a request's body asks for beyond its prompt: the `model` (and adapter) it must reach, the
//! cache namespace it runs in (`lora_path`, `cache_salt`, `extra_key`, as SGLang reads them), and
//! whether its answer streams.
//!
//! The body is read once for all four fields, borrowing its strings; fields of another type are
//! left to the engine to refuse (the router routes on what it can read). A batch's `lora_path` is a
//! list with one entry per prompt: the first entry names the adapter the batch is routed for.

use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;

/// The routing-relevant fields of a request body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    pub model: Option<String>,
    pub lora_path: Option<String>,
    pub cache_salt: Option<String>,
    pub extra_key: Option<String>,
    /// `"stream": true`: the answer streams, so its first bytes mark the end of its prefill.
    pub stream: bool,
}

#[derive(Deserialize)]
struct Fields<'a> {
    #[serde(borrow, default)]
    model: Option<Loose<'a>>,
    #[serde(borrow, default)]
    lora_path: Option<Loose<'a>>,
    #[serde(borrow, default)]
    cache_salt: Option<Loose<'a>>,
    #[serde(borrow, default)]
    extra_key: Option<Loose<'a>>,
    #[serde(default)]
    stream: Option<Value>,
}

/// A string, or anything else (ignored).
#[derive(Deserialize)]
#[serde(untagged)]
enum Loose<'a> {
    Str(#[serde(borrow)] Cow<'a, str>),
    Other(Value),
}

impl Loose<'_> {
    fn string(self) -> Option<String> {
        match self {
            Loose::Str(s) => Some(s.into_owned()),
            // A batch's list: its first string.
            Loose::Other(Value::Array(a)) => a.into_iter().find_map(|v| match v {
                Value::String(s) => Some(s),
                _ => None,
            }),
            Loose::Other(_) => None,
        }
    }
}

impl Asked {
    /// The fields of `body` (none when it is not a JSON object).
    pub fn of(body: &[u8]) -> Self {
        let Ok(f) = serde_json::from_slice::<Fields<'_>>(body) else {
            return Asked::default();
        };
        Asked {
            model: f.model.and_then(Loose::string),
            lora_path: f.lora_path.and_then(Loose::string),
            cache_salt: f.cache_salt.and_then(Loose::string),
            extra_key: f.extra_key.and_then(Loose::string),
            stream: f.stream == Some(Value::Bool(true)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_four_fields_and_ignores_the_rest() {
        let a = Asked::of(
            br#"{"prompt":"x","model":"base:a1","cache_salt":"s","extra_key":"k","n":2}"#,
        );
        assert_eq!(a.model.as_deref(), Some("base:a1"));
        assert_eq!(a.cache_salt.as_deref(), Some("s"));
        assert_eq!(a.extra_key.as_deref(), Some("k"));
        assert_eq!(a.lora_path, None);
        assert!(!a.stream);
        assert!(Asked::of(br#"{"prompt":"x","stream":true}"#).stream);
        assert!(!Asked::of(br#"{"prompt":"x","stream":"yes"}"#).stream);
        let batch = Asked::of(br#"{"text":["a","b"],"lora_path":[null,"a2","a3"]}"#);
        assert_eq!(batch.lora_path.as_deref(), Some("a2"));
        assert_eq!(Asked::of(br#"{"model":7}"#), Asked::default());
        assert_eq!(Asked::of(b"not json"), Asked::default());
        assert_eq!(
            Asked::of(br#"{"model":"caf\u00e9"}"#).model.as_deref(),
            Some("café"),
            "escaped strings are decoded"
        );
    }
}
