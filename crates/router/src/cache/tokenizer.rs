//! The router's tokenizer: the one that turns a request into the token ids the engine's cache is
//! keyed by, so that its block hashes are the ones the engine announces.
//!
//! * Without `--tokenizer`: the simulated engine's deterministic tokenizer and template
//!   (`loadlink_wire::prompt::SimTokenizer`), exact for `loadlink engine`.
//! * With `--tokenizer PATH` (a Hugging Face `tokenizer.json`, or the directory holding it): text is
//!   encoded with the model's special tokens as the engine's tokenizer does. A chat request is
//!   rendered by the model's chat template (`chat_template.jinja` beside it, else the
//!   `chat_template` of `tokenizer_config.json`, as transformers loads them) in an environment set
//!   up as transformers sets up its own (`chat_env.rs`), with the context SGLang builds from the
//!   request (`chat_context.rs`: messages, tools, keyword arguments) and the tokenizer's named
//!   special tokens, then encoded without adding special tokens again, as `apply_chat_template`
//!   does. A request whose render fails or passes its bounds gets no ids: it is routed without a
//!   cache key and counted ([`RouterTokenizer::unkeyed_chats`]). A model without a template falls
//!   back to `role: content` lines: self-consistent (the approximate tree still matches), but not
//!   the engine's ids.
//!
//! A tokenizer that cannot be loaded is a startup error naming the file and what was wrong.

use super::chat_context::{ChatRequest, ContentFormat, bare_functions, chat_request};
use super::chat_env::{chat_environment, render_bounded};
use loadlink_wire::prompt::{ChatTurn, SimTokenizer, Tokenizer};
use minijinja::Environment;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The tokenizer the router prices requests with.
pub enum RouterTokenizer {
    Sim(SimTokenizer),
    Hf(Box<HfTokenizer>),
}

impl Default for RouterTokenizer {
    fn default() -> Self {
        RouterTokenizer::Sim(SimTokenizer)
    }
}

impl std::fmt::Debug for RouterTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe().as_str())
    }
}

impl RouterTokenizer {
    /// `None`: the simulated engine's; `Some(path)`: a Hugging Face tokenizer.
    pub fn load(path: Option<&Path>) -> Result<Self, String> {
        match path {
            None => Ok(Self::default()),
            Some(p) => HfTokenizer::load(p).map(|t| RouterTokenizer::Hf(Box::new(t))),
        }
    }

    /// The ids of the chat request `body` rendered by the model's chat template, when the
    /// tokenizer has one (`None`: the request's messages are read the usual way). `Err` names why
    /// the request has no ids the router can trust; it is counted.
    pub fn chat_request_ids(&self, body: &[u8]) -> Option<Result<Vec<u32>, String>> {
        match self {
            RouterTokenizer::Hf(h) if h.chat.is_some() => Some(h.chat_request_ids(body)),
            _ => None,
        }
    }

    /// Chat requests routed without a cache key because their template render failed or passed
    /// its bounds.
    pub fn unkeyed_chats(&self) -> u64 {
        match self {
            RouterTokenizer::Hf(h) => h.unkeyed.load(Relaxed),
            RouterTokenizer::Sim(_) => 0,
        }
    }

    /// One line for logs and `/workers`.
    pub fn describe(&self) -> String {
        match self {
            RouterTokenizer::Sim(_) => "loadlink engine's deterministic tokenizer".into(),
            RouterTokenizer::Hf(h) => format!(
                "{} ({})",
                h.path.display(),
                if h.chat.is_some() {
                    "with its chat template"
                } else {
                    "no chat template: chat prompts are approximate"
                }
            ),
        }
    }
}

impl Tokenizer for RouterTokenizer {
    fn encode_into(&self, text: &str, out: &mut Vec<u32>) {
        match self {
            RouterTokenizer::Sim(s) => s.encode_into(text, out),
            RouterTokenizer::Hf(h) => h.encode_into(text, true, out),
        }
    }
    fn chat(&self, turns: &[ChatTurn<'_>]) -> Vec<u32> {
        match self {
            RouterTokenizer::Sim(s) => s.chat(turns),
            RouterTokenizer::Hf(h) => h.chat(turns),
        }
    }
}

/// A Hugging Face tokenizer with its chat template.
pub struct HfTokenizer {
    path: PathBuf,
    tok: tokenizers::Tokenizer,
    chat: Option<ChatTemplate>,
    unkeyed: AtomicU64,
}

/// The named special tokens transformers passes every template (`special_tokens_map`).
const SPECIAL_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

struct ChatTemplate {
    env: Environment<'static>,
    /// Whether a `tool_use` template exists (transformers renders requests with tools with it).
    tool_use: bool,
    format: ContentFormat,
    /// The special tokens set in `tokenizer_config.json`, by name.
    specials: Vec<(&'static str, String)>,
}

impl HfTokenizer {
    /// Loads `path` (`tokenizer.json`, or a directory with one) and the chat template of the
    /// `tokenizer_config.json` beside it, if any.
    pub fn load(path: &Path) -> Result<Self, String> {
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        let tok = tokenizers::Tokenizer::from_file(&file).map_err(|e| {
            format!(
                "--tokenizer {}: expected a Hugging Face tokenizer.json: {e}",
                file.display()
            )
        })?;
        let config = file.with_file_name("tokenizer_config.json");
        let jinja = file.with_file_name("chat_template.jinja");
        let own_file = match std::fs::read_to_string(&jinja) {
            Ok(source) => Some(source),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("{}: {e}", jinja.display())),
        };
        let chat = match std::fs::read(&config) {
            Ok(body) => ChatTemplate::from_config(&config, &body, own_file)?,
            Err(_) => ChatTemplate::from_config(&config, b"{}", own_file)?,
        };
        Ok(HfTokenizer {
            path: file,
            tok,
            chat,
            unkeyed: AtomicU64::new(0),
        })
    }

    fn chat_request_ids(&self, body: &[u8]) -> Result<Vec<u32>, String> {
        let t = self.chat.as_ref().ok_or("no chat template")?;
        let rendered = chat_request(body, t.format).and_then(|r| t.render_request(&r));
        match rendered {
            Ok(text) => {
                let mut out = Vec::new();
                self.encode_into(&text, false, &mut out);
                Ok(out)
            }
            Err(e) => {
                self.unkeyed.fetch_add(1, Relaxed);
                tracing::debug!(reason = %e, "chat request routed without a cache key");
                Err(e)
            }
        }
    }

    fn encode_into(&self, text: &str, special: bool, out: &mut Vec<u32>) {
        // Encoding only fails on a truncation/padding misconfiguration, never on text; an empty
        // answer then prices the request as uncached, which is safe.
        if let Ok(enc) = self.tok.encode(text, special) {
            out.extend_from_slice(enc.get_ids());
        }
    }

    fn chat(&self, turns: &[ChatTurn<'_>]) -> Vec<u32> {
        let mut out = Vec::new();
        let rendered = self.chat.as_ref().and_then(|t| t.render(turns));
        match rendered {
            Some(text) => self.encode_into(&text, false, &mut out),
            None => {
                let text: String = turns
                    .iter()
                    .map(|t| format!("{}: {}\n", t.role, t.content))
                    .collect();
                self.encode_into(&text, true, &mut out);
            }
        }
        out
    }
}

/// A special token as `tokenizer_config.json` writes it: a string or `{"content": ...}`; `None`
/// when unset (transformers leaves unset tokens out of the template's arguments).
fn special_token(config: &Value, key: &str) -> Option<String> {
    match config.get(key) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

impl ChatTemplate {
    /// The chat template of `config` (the body of `tokenizer_config.json` at `path`), or of
    /// `own_file` (`chat_template.jinja`), which takes priority as in transformers.
    fn from_config(
        path: &Path,
        body: &[u8],
        own_file: Option<String>,
    ) -> Result<Option<Self>, String> {
        let bad = |what: String| format!("{}: {what}", path.display());
        let config: Value =
            serde_json::from_slice(body).map_err(|e| bad(format!("not valid JSON ({e})")))?;
        let templates: Vec<(String, String)> = match (own_file, config.get("chat_template")) {
            (Some(source), _) => vec![("default".into(), source)],
            (None, None | Some(Value::Null)) => return Ok(None),
            (None, Some(Value::String(s))) => vec![("default".into(), s.clone())],
            // The list form: named templates; "default" renders chat, "tool_use" chat with tools.
            (None, Some(Value::Array(list))) => list
                .iter()
                .filter_map(|t| {
                    let name = t.get("name")?.as_str()?;
                    Some((name.to_string(), t.get("template")?.as_str()?.to_string()))
                })
                .collect(),
            (None, Some(v)) => {
                return Err(bad(format!("chat_template: expected a string, got {v}")));
            }
        };
        if !templates.iter().any(|(n, _)| n == "default") {
            return Err(bad(
                "chat_template: a list without a \"default\" entry".into()
            ));
        }
        let format = ContentFormat::of_template(
            templates
                .iter()
                .find(|(n, _)| n == "default")
                .map_or("", |(_, s)| s.as_str()),
        );
        let tool_use = templates.iter().any(|(n, _)| n == "tool_use");
        let env = chat_environment(templates)
            .map_err(|e| bad(format!("chat_template does not compile: {e}")))?;
        let specials = SPECIAL_TOKENS
            .iter()
            .filter_map(|k| special_token(&config, k).map(|v| (*k, v)))
            .collect();
        Ok(Some(ChatTemplate {
            env,
            tool_use,
            format,
            specials,
        }))
    }

    /// `turns` rendered with nothing but roles and contents; `None` when the template refuses.
    fn render(&self, turns: &[ChatTurn<'_>]) -> Option<String> {
        let messages: Vec<minijinja::Value> = turns
            .iter()
            .map(|t| {
                minijinja::Value::from_iter([
                    ("role", minijinja::Value::from(t.role)),
                    ("content", minijinja::Value::from(t.content.as_ref())),
                ])
            })
            .collect();
        let r = ChatRequest {
            messages: minijinja::Value::from(messages),
            tools: None,
            kwargs: Vec::new(),
        };
        self.render_request(&r).ok()
    }

    /// The prompt `r` renders to, as `apply_chat_template(messages, tools=…,
    /// add_generation_prompt=True, **kwargs)` renders it (retried with bare functions as tools
    /// when the template fails on the wrapped ones, as SGLang retries).
    fn render_request(&self, r: &ChatRequest) -> Result<String, String> {
        let name = if r.tools.is_some() && self.tool_use {
            "tool_use"
        } else {
            "default"
        };
        let first = self.render_with(name, r, r.tools.clone());
        match (&first, &r.tools) {
            (Err(_), Some(tools)) => self
                .render_with(name, r, Some(bare_functions(tools)))
                .map_err(|e| format!("the chat template failed: {e}")),
            _ => first.map_err(|e| format!("the chat template failed: {e}")),
        }
    }

    fn render_with(
        &self,
        name: &str,
        r: &ChatRequest,
        tools: Option<Vec<minijinja::Value>>,
    ) -> Result<String, minijinja::Error> {
        use minijinja::Value as V;
        let mut ctx: Vec<(String, V)> = Vec::with_capacity(8 + r.kwargs.len());
        // transformers: `template_kwargs = {**special_tokens_map, **kwargs}`, then
        // `render(messages=…, tools=…, documents=…, add_generation_prompt=…, **template_kwargs)`.
        for (k, v) in &self.specials {
            ctx.push((k.to_string(), V::from(v.as_str())));
        }
        for (k, v) in &r.kwargs {
            ctx.retain(|(n, _)| n != k);
            ctx.push((k.clone(), v.clone()));
        }
        ctx.push(("messages".into(), r.messages.clone()));
        ctx.push(("tools".into(), tools.map_or(V::from(()), V::from)));
        ctx.push(("documents".into(), V::from(())));
        ctx.push(("add_generation_prompt".into(), V::from(true)));
        render_bounded(&self.env, name, V::from_iter(ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;

    /// A word-level tokenizer over a small vocabulary, saved as a real `tokenizer.json`.
    fn saved_tokenizer(dir: &Path) -> PathBuf {
        let vocab = [
            "<unk>",
            "<s>",
            "hello",
            "world",
            "user",
            "assistant",
            ":",
            "|",
        ]
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), i as u32))
        .collect();
        let model = WordLevel::builder()
            .vocab(vocab)
            .unk_token("<unk>".into())
            .build()
            .unwrap();
        let mut tok = tokenizers::Tokenizer::new(model);
        tok.with_pre_tokenizer(Some(Whitespace {}));
        tok.add_special_tokens(&[tokenizers::AddedToken::from("<s>", true)]);
        let path = dir.join("tokenizer.json");
        tok.save(&path, false).unwrap();
        path
    }

    fn turn<'a>(role: &'a str, content: &'a str) -> ChatTurn<'a> {
        ChatTurn {
            role,
            content: Cow::Borrowed(content),
        }
    }

    #[test]
    fn a_hugging_face_tokenizer_and_its_chat_template() {
        let dir = tempfile::tempdir().unwrap();
        let path = saved_tokenizer(dir.path());
        let t = RouterTokenizer::load(Some(&path)).unwrap();
        let mut ids = Vec::new();
        t.encode_into("hello world nope", &mut ids);
        assert_eq!(ids, [2, 3, 0]);
        assert!(t.describe().contains("no chat template"));
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"bos_token":{"content":"<s>"},"chat_template":"{{ bos_token }}{% for m in messages %}{{ m.role }} : {{ m.content.strip() }} | {% endfor %}{% if add_generation_prompt %}assistant :{% endif %}"}"#,
        )
        .unwrap();
        let t = RouterTokenizer::load(Some(dir.path())).unwrap();
        assert_eq!(
            t.chat(&[turn("user", "  hello ")]),
            [1, 4, 6, 2, 7, 5, 6],
            "<s> user : hello | assistant :"
        );
        let two = t.chat(&[turn("user", "hello"), turn("assistant", "world")]);
        assert_eq!(
            two[..5],
            [1, 4, 6, 2, 7],
            "turn 2 extends turn 1's messages"
        );
    }

    #[test]
    fn load_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = RouterTokenizer::load(Some(&dir.path().join("nope.json"))).unwrap_err();
        assert!(missing.contains("nope.json") && missing.contains("tokenizer.json"));
        saved_tokenizer(dir.path());
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"chat_template":"{% for %}"}"#,
        )
        .unwrap();
        let e = RouterTokenizer::load(Some(dir.path())).unwrap_err();
        assert!(
            e.contains("tokenizer_config.json") && e.contains("does not compile"),
            "{e}"
        );
    }

    #[test]
    fn chat_requests_render_with_the_template_file_tools_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        saved_tokenizer(dir.path());
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"bos_token":"<s>","chat_template":"ignored: the .jinja file wins"}"#,
        )
        .unwrap();
        // Indented for reading, as published templates are: trim/lstrip blocks remove it.
        std::fs::write(
            dir.path().join("chat_template.jinja"),
            "{{ bos_token }}\n{% for m in messages %}\n    {{ m.role }} : {{ m.content }} |\n{% endfor %}\n{% if tools %}{{ raise_exception('tools: ' ~ (tools | tojson)) }}{% endif %}\n",
        )
        .unwrap();
        let t = RouterTokenizer::load(Some(dir.path())).unwrap();
        let body = br#"{"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}]}"#;
        assert_eq!(
            t.chat_request_ids(body).unwrap().unwrap(),
            [1, 4, 6, 2, 7, 4, 6, 3, 7],
            "<s> user : hello | user : world | (a last assistant turn renders as the user's)"
        );
        assert_eq!(t.unkeyed_chats(), 0);
        let tools = br#"{"messages": [{"role": "user", "content": "hello"}], "tools": [{"type": "function", "function": {"name": "f"}}]}"#;
        let e = t.chat_request_ids(tools).unwrap().unwrap_err();
        assert!(
            e.contains(r#"tools: [{"name": "f", "description": null, "parameters": null}]"#),
            "retried with bare functions: {e}"
        );
        assert_eq!(t.unkeyed_chats(), 1, "a failed render is counted");
        let image = br#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]}"#;
        assert!(t.chat_request_ids(image).unwrap().is_err());
        assert_eq!(t.unkeyed_chats(), 2);
        assert!(RouterTokenizer::default().chat_request_ids(body).is_none());
    }
}
