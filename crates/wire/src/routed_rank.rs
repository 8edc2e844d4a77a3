//! A DP rank named by the request (what a rank-aware router, or a client, asks an engine to run it
//! on), read by SGLang 0.5.23's rules. One reader for both sides: the engine runs the request
//! there, the router keeps a client's own rank instead of choosing one.
//!
//! * body `routed_dp_rank`, and the deprecated alias `data_parallel_rank`, used only when
//!   `routed_dp_rank` is absent or null. The OpenAI routes validate both as pydantic's lax `int`
//!   (`3`, `3.0`, `"3"`, `true` are all integers); `/generate`'s JSON contract wants a plain JSON
//!   integer for `routed_dp_rank` (the alias is still lax there);
//! * header `X-Data-Parallel-Rank` on the OpenAI routes only; it overrides the body, and a value
//!   that Python's `int()` does not take is a 400.
//!
//! A rank is kept as an `i128` so a client's absurd value is echoed as written in an error.

use serde_json::{Map, Value};

/// The header SGLang's OpenAI routes read (HTTP header names are case-insensitive).
pub const RANK_HEADER: &str = "x-data-parallel-rank";
/// The body field SGLang 0.5.23 reads.
pub const RANK_FIELD: &str = "routed_dp_rank";
/// Its deprecated spelling, still accepted (SMG's `--dp-aware` sends it).
pub const RANK_ALIAS: &str = "data_parallel_rank";

/// A rank as the client wrote it (not yet checked against any engine's ranks).
pub type RankValue = i128;

/// The body's rank: `routed_dp_rank`, else `data_parallel_rank`; `None` when neither is set.
/// `generate`: the body is `/generate`'s, whose `routed_dp_rank` must be a plain JSON integer.
pub fn body_rank(generate: bool, m: &Map<String, Value>) -> Result<Option<RankValue>, String> {
    let field = |key: &str, strict: bool| -> Result<Option<RankValue>, String> {
        match m.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                let parsed = if strict { json_int(v) } else { lax_int(v) };
                parsed.map(Some).ok_or_else(|| {
                    let form = if strict {
                        "a JSON integer"
                    } else {
                        "an integer"
                    };
                    format!("{key}: expected {form} (a DP rank), got {v}")
                })
            }
        }
    };
    let routed = field(RANK_FIELD, generate)?;
    let alias = field(RANK_ALIAS, false)?;
    Ok(routed.or(alias))
}

/// The `X-Data-Parallel-Rank` header's value, read as Python's `int()` reads a string.
pub fn header_rank(raw: &[u8]) -> Result<RankValue, String> {
    let text = String::from_utf8_lossy(raw);
    python_int(&text).ok_or_else(|| {
        format!("Invalid X-Data-Parallel-Rank header: must be an integer, got '{text}'")
    })
}

/// The rank a request asks for: on the OpenAI routes (`openai`) the header wins over the body;
/// `/generate` reads the body only.
pub fn requested(
    openai: bool,
    header: Option<RankValue>,
    body: Option<RankValue>,
) -> Option<RankValue> {
    if !openai {
        return body;
    }
    header.or(body)
}

/// A plain JSON integer (what `/generate`'s contract calls `i64`).
fn json_int(v: &Value) -> Option<RankValue> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .map(RankValue::from)
            .or_else(|| n.as_u64().map(RankValue::from)),
        _ => None,
    }
}

/// Pydantic's lax `int`: integers, floats with no fractional part, booleans, and strings that
/// hold an integer (optionally followed by `.0`).
fn lax_int(v: &Value) -> Option<RankValue> {
    match v {
        Value::Bool(b) => Some(RankValue::from(*b)),
        Value::Number(n) => json_int(v).or_else(|| {
            let f = n.as_f64()?;
            // Beyond ±1e38 an i128 cannot hold it; pydantic refuses such floats too.
            (f.fract() == 0.0 && f.abs() < 1e38).then_some(f as RankValue)
        }),
        Value::String(s) => {
            let s = s.trim();
            let whole = match s.split_once('.') {
                Some((w, zeros)) if !zeros.is_empty() && zeros.bytes().all(|b| b == b'0') => w,
                Some(_) => return None,
                None => s,
            };
            python_int(whole)
        }
        _ => None,
    }
}

/// Python's `int(str)` in base 10: surrounding whitespace, an optional sign, digits with single
/// underscores between them.
fn python_int(text: &str) -> Option<RankValue> {
    let s = text.trim();
    let (negative, digits) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let bytes = digits.as_bytes();
    let well_formed = !bytes.is_empty()
        && bytes.first().is_some_and(u8::is_ascii_digit)
        && bytes.last().is_some_and(u8::is_ascii_digit)
        && bytes.iter().all(|b| b.is_ascii_digit() || *b == b'_')
        && !digits.contains("__");
    if !well_formed {
        return None;
    }
    let mut value: RankValue = 0;
    for b in bytes.iter().filter(|b| b.is_ascii_digit()) {
        value = value
            .checked_mul(10)?
            .checked_add(RankValue::from(b - b'0'))?;
    }
    Some(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_int_takes_what_int_takes() {
        for (text, want) in [
            ("3", Some(3)),
            (" 4 ", Some(4)),
            ("+2", Some(2)),
            ("-1", Some(-1)),
            ("007", Some(7)),
            ("1_0", Some(10)),
            ("", None),
            ("_1", None),
            ("1__0", None),
            ("1_", None),
            ("3.0", None),
            ("0x10", None),
            ("abc", None),
            ("3 4", None),
        ] {
            assert_eq!(python_int(text), want, "{text:?}");
        }
    }

    #[test]
    fn lax_int_is_pydantics() {
        for (v, want) in [
            (json!(3), Some(3)),
            (json!(3.0), Some(3)),
            (json!(true), Some(1)),
            (json!("2"), Some(2)),
            (json!("3.0"), Some(3)),
            (json!(3.5), None),
            (json!("3."), None),
            (json!([1]), None),
        ] {
            assert_eq!(lax_int(&v), want, "{v}");
        }
        assert_eq!(json_int(&json!(3.0)), None);
        assert_eq!(json_int(&json!("3")), None);
    }

    #[test]
    fn alias_only_when_routed_is_unset() {
        let m = |v: Value| v.as_object().cloned().unwrap();
        let both = m(json!({"routed_dp_rank": 1, "data_parallel_rank": 0}));
        assert_eq!(body_rank(false, &both), Ok(Some(1)));
        let alias = m(json!({"routed_dp_rank": null, "data_parallel_rank": "2"}));
        assert_eq!(body_rank(true, &alias), Ok(Some(2)));
        let strict = m(json!({"routed_dp_rank": "2"}));
        assert!(
            body_rank(true, &strict)
                .unwrap_err()
                .starts_with("routed_dp_rank: expected a JSON integer")
        );
        assert_eq!(body_rank(false, &strict), Ok(Some(2)));
        assert_eq!(
            requested(false, Some(3), Some(1)),
            Some(1),
            "/generate: the body only"
        );
        assert_eq!(
            requested(true, Some(3), Some(1)),
            Some(3),
            "the header wins"
        );
        assert!(header_rank(b"two").unwrap_err().contains("got 'two'"));
    }
}
