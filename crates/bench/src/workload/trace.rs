//! JSONL traces: replaying recorded (or generated) traffic, and writing a generated workload as a
//! trace so another tool, or a later run, sends exactly the same requests.
//!
//! One request per line: `{"t": s, "prompt_tokens": n, "output_tokens": m}`, optional `"stream"`
//! and `"direct"` booleans, and optionally the prompt itself, as one of `"input_ids"` (token ids),
//! `"text"` (the engine's tokenizer) or `"messages"` (`[{"role", "content"}…]`, the engine's chat
//! template). With a prompt, `prompt_tokens` may be left out (it is the prompt's length); given, it
//! must match. A request of a many-model fleet names its `"model"` (a served model's name) and
//! optionally its `"adapter"` (a LoRA adapter of that model).

use super::{Arrival, ModelRef};
use loadlink_engine::tokenize::{VOCAB, render_chat, tokenize};
use serde_json::{Value, json};
use std::sync::Arc;

/// Reads a JSONL trace, sorted by arrival time. Errors name the line and the field.
pub fn read_trace(text: &str) -> Result<Vec<Arrival>, String> {
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        out.push(read_line(line).map_err(|e| format!("trace line {}: {e}", i + 1))?);
    }
    out.sort_by(|a, b| a.t.total_cmp(&b.t));
    Ok(out)
}

fn read_line(line: &str) -> Result<Arrival, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e})"))?;
    let num = |k: &str| {
        v.get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("{k}: expected a number"))
    };
    let t = num("t")?;
    let prompt = read_prompt(&v)?;
    let p = match (&prompt, v.get("prompt_tokens")) {
        (None, _) => num("prompt_tokens")?,
        (Some(ids), None) => ids.len() as f64,
        (Some(ids), Some(_)) => {
            let p = num("prompt_tokens")?;
            if p != ids.len() as f64 {
                return Err(format!(
                    "prompt_tokens: {p} but the prompt has {} tokens",
                    ids.len()
                ));
            }
            p
        }
    };
    let o = num("output_tokens")?;
    if !(t >= 0.0 && p >= 1.0 && o >= 1.0) {
        return Err("t must be ≥ 0 and token counts ≥ 1".into());
    }
    let flag = |k: &str, default| v.get(k).and_then(Value::as_bool).unwrap_or(default);
    Ok(Arrival {
        t,
        prompt_tokens: p as u64,
        output_tokens: o as u64,
        stream: flag("stream", true),
        direct: flag("direct", false),
        prompt,
        turn: None,
        model: read_model(&v)?,
    })
}

/// The request's `model` and `adapter` (an adapter needs its model).
fn read_model(v: &Value) -> Result<Option<ModelRef>, String> {
    let text = |k: &str| match v.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(Arc::<str>::from(s.as_str()))),
        Some(_) => Err(format!("{k}: expected a non-empty string")),
    };
    match (text("model")?, text("adapter")?) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err("adapter: given without its model".into()),
        (Some(model), adapter) => Ok(Some(ModelRef { model, adapter })),
    }
}

/// The prompt's ids from `input_ids`, `text` or `messages` (at most one of them).
fn read_prompt(v: &Value) -> Result<Option<Arc<[u32]>>, String> {
    let given: Vec<&str> = ["input_ids", "text", "messages"]
        .into_iter()
        .filter(|k| v.get(k).is_some())
        .collect();
    let ids = match given.as_slice() {
        [] => return Ok(None),
        ["input_ids"] => input_ids(&v["input_ids"])?,
        ["text"] => tokenize(v["text"].as_str().ok_or("text: expected a string")?),
        ["messages"] => messages(&v["messages"])?,
        more => return Err(format!("give one of {}", more.join(", "))),
    };
    if ids.is_empty() {
        return Err(format!("{}: empty prompt", given[0]));
    }
    Ok(Some(ids.into()))
}

fn input_ids(v: &Value) -> Result<Vec<u32>, String> {
    let bad = || format!("input_ids: expected a list of integers below {VOCAB}");
    v.as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|x| {
            x.as_u64()
                .filter(|&id| id < VOCAB as u64)
                .map(|id| id as u32)
                .ok_or_else(bad)
        })
        .collect()
}

fn messages(v: &Value) -> Result<Vec<u32>, String> {
    let bad = || "messages: expected a list of {\"role\": string, \"content\": string}".to_string();
    let list = v.as_array().ok_or_else(bad)?;
    let mut pairs = Vec::with_capacity(list.len());
    for m in list {
        let role = m.get("role").and_then(Value::as_str).ok_or_else(bad)?;
        let content = m.get("content").and_then(Value::as_str).ok_or_else(bad)?;
        pairs.push((role, content));
    }
    Ok(render_chat(pairs))
}

/// One JSON line per arrival (with `input_ids` when the workload has them): [`read_trace`] reads
/// it back to the same arrivals.
pub fn write_trace(arrivals: &[Arrival], out: &mut impl std::io::Write) -> std::io::Result<()> {
    for a in arrivals {
        let mut line = json!({
            "t": a.t,
            "prompt_tokens": a.prompt_tokens,
            "output_tokens": a.output_tokens,
            "stream": a.stream,
            "direct": a.direct,
        });
        if let Some(p) = &a.prompt {
            line["input_ids"] = json!(p.as_ref());
        }
        if let Some(m) = &a.model {
            line["model"] = json!(m.model.as_ref());
            if let Some(ad) = &m.adapter {
                line["adapter"] = json!(ad.as_ref());
            }
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use loadlink_engine::tokenize::OUTPUT_TOKEN;

    #[test]
    fn prompts_come_from_ids_text_or_messages() {
        let t = read_trace(concat!(
            r#"{"t": 2, "output_tokens": 3, "input_ids": [20, 21, 22]}"#,
            "\n",
            r#"{"t": 1, "output_tokens": 3, "text": "abcdefgh", "prompt_tokens": 2}"#,
            "\n",
            r#"{"t": 0, "output_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}"#,
        ))
        .unwrap();
        assert_eq!(
            t[0].prompt.as_deref(),
            Some(&render_chat([("user", "hi")])[..])
        );
        assert_eq!(t[1].prompt.as_deref(), Some(&tokenize("abcdefgh")[..]));
        assert_eq!(
            (t[2].prompt_tokens, t[2].prompt.as_deref()),
            (3, Some(&[20, 21, 22][..]))
        );
    }

    #[test]
    fn bad_prompts_name_the_line_and_the_field() {
        let err = |s: &str| read_trace(s).unwrap_err();
        assert!(
            err(r#"{"t": 0, "output_tokens": 1, "input_ids": [1, -2]}"#)
                .contains("line 1: input_ids")
        );
        assert!(
            err(r#"{"t": 0, "output_tokens": 1, "input_ids": [1], "text": "a"}"#)
                .contains("input_ids, text")
        );
        assert!(
            err(r#"{"t": 0, "output_tokens": 1, "text": "abcd", "prompt_tokens": 5}"#)
                .contains("prompt_tokens")
        );
        assert!(
            err(r#"{"t": 0, "output_tokens": 1, "messages": [{"role": "user"}]}"#)
                .contains("messages")
        );
        assert!(err(r#"{"t": 0, "output_tokens": 1, "input_ids": []}"#).contains("empty"));
        assert!(
            err(r#"{"t": 0, "output_tokens": 1, "prompt_tokens": 1, "adapter": "a"}"#)
                .contains("adapter: given without its model")
        );
        assert!(
            err(r#"{"t": 0, "output_tokens": 1, "prompt_tokens": 1, "model": 3}"#)
                .contains("model: expected a non-empty string")
        );
    }

    #[test]
    fn a_written_trace_reads_back_to_the_same_arrivals() {
        let a = vec![
            Arrival {
                t: 0.25,
                prompt_tokens: 3,
                output_tokens: 2,
                stream: true,
                direct: true,
                prompt: Some(vec![OUTPUT_TOKEN, 17, 99].into()),
                turn: None,
                model: None,
            },
            Arrival {
                t: 1.5,
                prompt_tokens: 40,
                output_tokens: 9,
                stream: false,
                direct: false,
                prompt: None,
                turn: None,
                model: Some(ModelRef {
                    model: "base".into(),
                    adapter: Some("tenant-3".into()),
                }),
            },
        ];
        let mut text = Vec::new();
        write_trace(&a, &mut text).unwrap();
        assert_eq!(read_trace(std::str::from_utf8(&text).unwrap()).unwrap(), a);
    }
}
