//! The router's tokenizer: the one that turns a request into the token ids the engine's cache is
//! keyed by, so that its block hashes are the ones the engine announces.
//!
//! * Without `--tokenizer`: the simulated engine's deterministic tokenizer and template
//!   (`loadlink_wire::prompt::SimTokenizer`), exact for `loadlink engine`.
//! * With `--tokenizer PATH` (a Hugging Face `tokenizer.json`, or the directory holding it): text is
//!   encoded with the model's special tokens as the engine's tokenizer does; chat is rendered with
//!   the `chat_template` of `tokenizer_config.json` beside it (Jinja, through minijinja with
//!   Python-compatible string methods) and encoded without adding special tokens again, as
//!   `apply_chat_template` does. A model without a template falls back to `role: content` lines:
//!   self-consistent (the approximate tree still matches), but not the engine's ids.
//!
//! A tokenizer that cannot be loaded is a startup error naming the file and what was wrong.

use loadlink_wire::prompt::{ChatTurn, SimTokenizer, Tokenizer};
use minijinja::Environment;
use serde_json::Value;
use std::path::{Path, PathBuf};

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
}

struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
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
        let chat = match std::fs::read(&config) {
            Ok(body) => ChatTemplate::from_config(&config, &body)?,
            Err(_) => None,
        };
        Ok(HfTokenizer {
            path: file,
            tok,
            chat,
        })
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

/// A special token as `tokenizer_config.json` writes it: a string or `{"content": ...}`.
fn special_token(config: &Value, key: &str) -> String {
    match config.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    fn from_config(path: &Path, body: &[u8]) -> Result<Option<Self>, String> {
        let bad = |what: String| format!("{}: {what}", path.display());
        let config: Value =
            serde_json::from_slice(body).map_err(|e| bad(format!("not valid JSON ({e})")))?;
        let source = match config.get("chat_template") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) => s.clone(),
            // The list form: named templates; the "default" one renders chat.
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template").and_then(Value::as_str))
                .ok_or_else(|| bad("chat_template: a list without a \"default\" entry".into()))?
                .to_string(),
            Some(v) => return Err(bad(format!("chat_template: expected a string, got {v}"))),
        };
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, _> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        });
        env.add_template_owned("chat", source)
            .map_err(|e| bad(format!("chat_template does not compile: {e}")))?;
        Ok(Some(ChatTemplate {
            env,
            bos: special_token(&config, "bos_token"),
            eos: special_token(&config, "eos_token"),
        }))
    }

    /// The rendered prompt; `None` when the template refuses these messages.
    fn render(&self, turns: &[ChatTurn<'_>]) -> Option<String> {
        let messages: Vec<Value> = turns
            .iter()
            .map(|t| serde_json::json!({ "role": t.role, "content": t.content }))
            .collect();
        let ctx = minijinja::context! {
            messages => minijinja::Value::from_serialize(&messages),
            add_generation_prompt => true,
            bos_token => self.bos.as_str(),
            eos_token => self.eos.as_str(),
        };
        self.env.get_template("chat").ok()?.render(ctx).ok()
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
}
