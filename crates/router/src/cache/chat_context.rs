//! What a chat template is rendered with, built from the request body the way the engine builds
//! it: SGLang 0.5.23's `serving_chat.py` (`_apply_jinja_template`) turns the request into
//! dicts, and transformers' `apply_chat_template` hands them to the template. Every difference
//! is text the engine renders and the router would not, so each step is kept here, named:
//!
//! * **Messages** are the request's, as SGLang's pydantic models dump them: a user message keeps
//!   `role` and `content`; the others `role, content, tool_call_id, name, phase,
//!   reasoning_content, tool_calls, tools, prefix` in that order; keys the models do not know are
//!   dropped, and so are top-level nulls. A null content is `""`. Tool calls are dumped as
//!   `{id, index, type, function: {name, arguments}}` (nulls kept at that depth) with `arguments`
//!   decoded from its JSON string. A last assistant message becomes a user message (SGLang's
//!   rule without `continue_final_message`).
//! * **Content parts**: templates that loop over `message.content` ("openai" format, as SGLang's
//!   detector decides) get the text parts as `{type, text}` (the content key moved last); the
//!   others get the text parts joined by a space. A tool message's text parts are joined too. A
//!   part that is not text (an image) makes the engine add media tokens the router cannot know,
//!   so such a request gets no cache key.
//! * **Tools** (unless `tool_choice` is `"none"`; only the named one for a named choice) are
//!   `{type, function, defer_loading}` with the function's keys in the client's order,
//!   `description` and `parameters` added as null when absent, `strict` and `defer_loading`
//!   dropped when null. When the render fails with them, it is retried with the bare functions,
//!   as SGLang retries for templates that expect those.
//! * **Keyword arguments**: `reasoning_effort` when given, then `chat_template_kwargs`;
//!   `add_generation_prompt` true; `tools` and `documents` present (null when absent), and the
//!   tokenizer's named special tokens (added by the caller).
//!
//! A request this module cannot reproduce (`continue_final_message`, media parts, a keyword that
//! collides with the template's own arguments) is `Err(reason)`: the router routes it without a
//! cache key rather than guess.

use minijinja::value::{Value, ValueKind};

/// The request's side of a render: everything but the tokenizer's special tokens.
#[derive(Debug)]
pub struct ChatRequest {
    pub messages: Value,
    /// `None`: no tools (the template sees `tools` as null).
    pub tools: Option<Vec<Value>>,
    /// `reasoning_effort` and `chat_template_kwargs`, in that order (later wins).
    pub kwargs: Vec<(String, Value)>,
}

/// Whether a template reads content as a list of parts (SGLang's "openai") or as a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    String,
    Parts,
}

impl ContentFormat {
    /// SGLang's detection (`detect_jinja_template_content_format`): a template naming media, or
    /// looping over `message.content` (also `msg`/`m`), takes parts; any other takes strings.
    pub fn of_template(source: &str) -> Self {
        if ["image", "audio", "video", "vision"]
            .iter()
            .any(|k| source.contains(k))
        {
            return ContentFormat::Parts;
        }
        let loops_over_content = source.match_indices("for ").any(|(i, _)| {
            let rest = &source[i + 4..];
            let Some(at) = rest.find(" in ") else {
                return false;
            };
            let iter = rest[at + 4..].trim_start();
            let end = iter.find(['%', '|', ')']).unwrap_or(iter.len());
            let iter: String = iter[..end].chars().filter(|c| !c.is_whitespace()).collect();
            ["message", "msg", "m"].iter().any(|v| {
                iter == format!("{v}.content")
                    || iter == format!("{v}['content']")
                    || iter == format!("{v}[\"content\"]")
            })
        });
        if loops_over_content {
            ContentFormat::Parts
        } else {
            ContentFormat::String
        }
    }
}

const GENERIC_KEYS: [&str; 9] = [
    "role",
    "content",
    "tool_call_id",
    "name",
    "phase",
    "reasoning_content",
    "tool_calls",
    "tools",
    "prefix",
];

/// Names the template is called with; a `chat_template_kwargs` entry of one of these is a
/// Python `TypeError` in the engine.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

fn field(v: &Value, key: &str) -> Value {
    v.get_attr(key).unwrap_or(Value::UNDEFINED)
}

fn absent(v: &Value) -> bool {
    v.is_none() || v.is_undefined()
}

/// The chat request `body` (a JSON object) as the template is handed it.
pub fn chat_request(body: &[u8], format: ContentFormat) -> Result<ChatRequest, String> {
    let req: Value =
        serde_json::from_slice(body).map_err(|e| format!("body: not valid JSON ({e})"))?;
    if field(&req, "continue_final_message").is_true() {
        return Err("continue_final_message: the engine appends the prefix's own ids".into());
    }
    let raw = field(&req, "messages");
    if raw.kind() != ValueKind::Seq {
        return Err("messages: expected a list".into());
    }
    let mut messages = raw
        .try_iter()
        .map_err(|e| e.to_string())?
        .enumerate()
        .map(|(i, m)| message(i, &m, format))
        .collect::<Result<Vec<Value>, String>>()?;
    if let Some(last) = messages.last_mut() {
        let content = field(last, "content");
        if field(last, "role").as_str() == Some("assistant") && content.as_str().is_some() {
            *last = Value::from_iter([("role", Value::from("user")), ("content", content)]);
        }
    }
    let tools = request_tools(&req)?;
    let mut kwargs = Vec::new();
    let effort = field(&req, "reasoning_effort");
    if !absent(&effort) {
        kwargs.push(("reasoning_effort".to_string(), effort));
    }
    let extra = field(&req, "chat_template_kwargs");
    if extra.kind() == ValueKind::Map {
        for k in extra.try_iter().map_err(|e| e.to_string())? {
            let name = k.as_str().unwrap_or_default().to_string();
            if RESERVED.contains(&name.as_str()) {
                return Err(format!(
                    "chat_template_kwargs.{name}: collides with the template's own argument"
                ));
            }
            kwargs.push((name, extra.get_item(&k).unwrap_or_default()));
        }
    }
    Ok(ChatRequest {
        messages: Value::from(messages),
        tools,
        kwargs,
    })
}

fn message(i: usize, m: &Value, format: ContentFormat) -> Result<Value, String> {
    if m.kind() != ValueKind::Map {
        return Err(format!("messages[{i}]: expected an object"));
    }
    let role = field(m, "role")
        .as_str()
        .map(str::to_lowercase)
        .ok_or_else(|| format!("messages[{i}].role: expected a string"))?;
    let keys: &[&str] = if role == "user" {
        &GENERIC_KEYS[..2]
    } else {
        &GENERIC_KEYS
    };
    let raw_content = field(m, "content");
    let (content, parts) = match raw_content.kind() {
        ValueKind::None | ValueKind::Undefined => (Value::from(""), false),
        ValueKind::String => (raw_content, false),
        ValueKind::Seq => (content_parts(i, &role, &raw_content, format)?, true),
        _ => {
            return Err(format!(
                "messages[{i}].content: expected a string or a list"
            ));
        }
    };
    let mut out: Vec<(&str, Value)> = Vec::with_capacity(keys.len());
    for &k in keys {
        let v = match k {
            "role" => Value::from(role.as_str()),
            "content" => content.clone(),
            "tool_calls" => tool_calls(i, &field(m, k))?,
            "tools" => match field(m, k) {
                t if absent(&t) => t,
                t => Value::from(tools_of(&t, &format!("messages[{i}].tools"))?),
            },
            _ => field(m, k),
        };
        if !absent(&v) {
            out.push((k, v));
        }
    }
    if parts && format == ContentFormat::Parts && content.kind() == ValueKind::Seq {
        // SGLang rebuilds a parts message with its content last.
        if let Some(at) = out.iter().position(|(k, _)| *k == "content") {
            let c = out.remove(at);
            out.push(c);
        }
    }
    Ok(Value::from_iter(out))
}

fn content_parts(
    i: usize,
    role: &str,
    parts: &Value,
    format: ContentFormat,
) -> Result<Value, String> {
    let mut texts = Vec::new();
    for (j, p) in parts.try_iter().map_err(|e| e.to_string())?.enumerate() {
        let kind = field(&p, "type");
        match kind.as_str() {
            Some("text" | "input_text") => match field(&p, "text").as_str() {
                Some(t) => texts.push(t.to_string()),
                None => {
                    return Err(format!(
                        "messages[{i}].content[{j}].text: expected a string"
                    ));
                }
            },
            _ => {
                return Err(format!(
                    "messages[{i}].content[{j}]: a {kind} part adds tokens only the engine knows"
                ));
            }
        }
    }
    if format == ContentFormat::String || role == "tool" {
        return Ok(Value::from(texts.join(" ")));
    }
    Ok(Value::from_iter(texts.into_iter().map(|t| {
        Value::from_iter([("type", Value::from("text")), ("text", Value::from(t))])
    })))
}

fn tool_calls(i: usize, calls: &Value) -> Result<Value, String> {
    if absent(calls) {
        return Ok(calls.clone());
    }
    let what = format!("messages[{i}].tool_calls");
    let items = calls
        .try_iter()
        .map_err(|_| format!("{what}: expected a list"))?;
    let mut out = Vec::new();
    for (j, c) in items.enumerate() {
        let f = field(&c, "function");
        if f.kind() != ValueKind::Map {
            return Err(format!("{what}[{j}].function: expected an object"));
        }
        let args = field(&f, "arguments");
        let args = match args.as_str() {
            Some(s) => {
                let parsed: Value = serde_json::from_str(s)
                    .map_err(|_| format!("{what}[{j}].function.arguments: expected JSON"))?;
                if parsed.kind() != ValueKind::Map {
                    return Err(format!(
                        "{what}[{j}].function.arguments: expected a JSON object"
                    ));
                }
                parsed
            }
            None if args.is_undefined() => Value::from(()),
            None => args,
        };
        let none_if_absent = |v: Value| if v.is_undefined() { Value::from(()) } else { v };
        let kind = field(&c, "type");
        out.push(Value::from_iter([
            ("id", none_if_absent(field(&c, "id"))),
            ("index", none_if_absent(field(&c, "index"))),
            (
                "type",
                if absent(&kind) {
                    Value::from("function")
                } else {
                    kind
                },
            ),
            (
                "function",
                Value::from_iter([
                    ("name", none_if_absent(field(&f, "name"))),
                    ("arguments", args),
                ]),
            ),
        ]));
    }
    Ok(Value::from(out))
}

/// The request's tools as the template gets them, or `None`.
fn request_tools(req: &Value) -> Result<Option<Vec<Value>>, String> {
    let tools = field(req, "tools");
    if absent(&tools) {
        return Ok(None);
    }
    let choice = field(req, "tool_choice");
    if choice.as_str() == Some("none") {
        return Ok(None);
    }
    let mut all = tools_of(&tools, "tools")?;
    if all.is_empty() {
        return Ok(None);
    }
    if choice.kind() == ValueKind::Map {
        let name = field(&field(&choice, "function"), "name");
        all.retain(|t| field(&field(t, "function"), "name") == name);
        if all.is_empty() {
            return Ok(None);
        }
    }
    Ok(Some(all))
}

const FUNCTION_KEYS: [&str; 5] = [
    "description",
    "name",
    "parameters",
    "strict",
    "defer_loading",
];

fn tools_of(tools: &Value, what: &str) -> Result<Vec<Value>, String> {
    let items = tools
        .try_iter()
        .map_err(|_| format!("{what}: expected a list"))?;
    items
        .enumerate()
        .map(|(j, t)| {
            let f = field(&t, "function");
            if f.kind() != ValueKind::Map || field(&f, "name").as_str().is_none() {
                return Err(format!(
                    "{what}[{j}].function: expected an object with a name"
                ));
            }
            let kind = field(&t, "type");
            let defer = field(&t, "defer_loading");
            let mut fdefer = field(&f, "defer_loading");
            if absent(&fdefer) && !absent(&defer) {
                fdefer = defer.clone();
            }
            let get = |k: &str| match k {
                "defer_loading" => fdefer.clone(),
                _ => field(&f, k),
            };
            let droppable =
                |k: &str, v: &Value| matches!(k, "strict" | "defer_loading") && absent(v);
            let mut keys: Vec<&str> = f
                .try_iter()
                .map_err(|e| e.to_string())?
                .filter_map(|k| {
                    FUNCTION_KEYS
                        .iter()
                        .copied()
                        .find(|n| Some(*n) == k.as_str())
                })
                .collect();
            for k in FUNCTION_KEYS {
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
            let function: Value = keys
                .into_iter()
                .filter_map(|k| {
                    let v = get(k);
                    (!droppable(k, &v))
                        .then(|| (k, if v.is_undefined() { Value::from(()) } else { v }))
                })
                .collect();
            Ok(Value::from_iter([
                (
                    "type",
                    if absent(&kind) {
                        Value::from("function")
                    } else {
                        kind
                    },
                ),
                ("function", function),
                (
                    "defer_loading",
                    if defer.is_undefined() {
                        Value::from(())
                    } else {
                        defer
                    },
                ),
            ]))
        })
        .collect()
}

/// The tools as bare functions: SGLang's retry for templates that want them so.
pub fn bare_functions(tools: &[Value]) -> Vec<Value> {
    tools
        .iter()
        .map(|t| match field(t, "function") {
            f if f.kind() == ValueKind::Map => f,
            _ => t.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(v: &Value) -> String {
        super::super::py_json::dumps(v, &Default::default()).unwrap()
    }

    #[test]
    fn messages_and_tools_as_sglang_hands_them_to_the_template() {
        let body = br#"{"model": "m", "messages": [
            {"role": "System", "content": "S", "name": null, "extra": 1},
            {"role": "user", "name": "ann", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]},
            {"role": "assistant", "content": "last"}],
          "tools": [{"type": "function", "function": {"parameters": {"type": "object"}, "name": "f", "strict": null}}],
          "reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": false}}"#;
        let r = chat_request(body, ContentFormat::String).unwrap();
        assert_eq!(
            json(&r.messages),
            r#"[{"role": "system", "content": "S"}, {"role": "user", "content": "a b"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "index": null, "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}, {"role": "tool", "content": "r1 r2", "tool_call_id": "c1"}, {"role": "user", "content": "last"}]"#
        );
        assert_eq!(
            json(&Value::from(r.tools.clone().unwrap())),
            r#"[{"type": "function", "function": {"parameters": {"type": "object"}, "name": "f", "description": null}, "defer_loading": null}]"#
        );
        assert_eq!(
            json(&Value::from(bare_functions(&r.tools.unwrap()))),
            r#"[{"parameters": {"type": "object"}, "name": "f", "description": null}]"#
        );
        let kw: Vec<_> = r.kwargs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            kw,
            ["reasoning_effort=low", "enable_thinking=False"],
            "as Python prints them"
        );

        let parts = chat_request(body, ContentFormat::Parts).unwrap();
        let user = parts.messages.get_item(&Value::from(1)).unwrap();
        assert_eq!(
            json(&user),
            r#"{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}"#
        );
    }

    #[test]
    fn what_cannot_be_reproduced_has_no_key() {
        let image = br#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}"#;
        assert!(
            chat_request(image, ContentFormat::Parts)
                .unwrap_err()
                .contains("image_url")
        );
        let cont =
            br#"{"messages": [{"role": "user", "content": "a"}], "continue_final_message": true}"#;
        assert!(chat_request(cont, ContentFormat::String).is_err());
        let clash = br#"{"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"tools": []}}"#;
        assert!(
            chat_request(clash, ContentFormat::String)
                .unwrap_err()
                .contains("chat_template_kwargs.tools")
        );
        let none = br#"{"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"}"#;
        assert!(
            chat_request(none, ContentFormat::String)
                .unwrap()
                .tools
                .is_none()
        );
    }

    #[test]
    fn content_format_as_sglang_detects_it() {
        assert_eq!(
            ContentFormat::of_template("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ContentFormat::String
        );
        assert_eq!(
            ContentFormat::of_template(
                "{%- for c in message['content'] %}{{ c.text }}{% endfor %}"
            ),
            ContentFormat::Parts
        );
        assert_eq!(
            ContentFormat::of_template("{% for part in m.content | default([]) %}{% endfor %}"),
            ContentFormat::Parts
        );
        assert_eq!(ContentFormat::of_template("<image>"), ContentFormat::Parts);
    }
}
