//! A DP rank chosen by the client (a rank-aware router) instead of the engine's dispatcher.
//!
//! With DP attention every rank has its own queue and its own prefix cache, so a router that knows
//! where a prompt's prefix is cached must be able to say "run it there". SGLang 0.5.23 takes that
//! choice in three spellings, and this module reads them by SGLang's rules (the sources are
//! named in `docs/engine.md`, "Routed DP rank"):
//!
//! * body `routed_dp_rank`, and the deprecated alias `data_parallel_rank`, used only when
//!   `routed_dp_rank` is absent or null. The OpenAI routes validate both as pydantic's lax `int`
//!   (`3`, `3.0`, `"3"`, `true` are all integers); `/generate`'s JSON contract wants a plain JSON
//!   integer for `routed_dp_rank` (the alias is still lax there);
//! * header `X-Data-Parallel-Rank` on the OpenAI routes only; it overrides the body, and a value
//!   that Python's `int()` does not take is a 400;
//! * the rank must be in `[0, dp_size)`, except that rank 0 on a single-rank engine is ignored.
//!
//! A rank is kept as an `i128` so a client's absurd value is echoed as written in the error.

use crate::api::Route;
use axum::http::HeaderMap;
use serde_json::{Map, Value};

/// The header SGLang's OpenAI routes read (HTTP header names are case-insensitive).
pub const RANK_HEADER: &str = "x-data-parallel-rank";

/// A rank as the client wrote it (not yet checked against the engine's ranks).
pub type RankValue = i128;

/// The body's rank: `routed_dp_rank`, else `data_parallel_rank`; `None` when neither is set.
pub(crate) fn body_rank(route: Route, m: &Map<String, Value>) -> Result<Option<RankValue>, String> {
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
    let routed = field("routed_dp_rank", route == Route::Generate)?;
    let alias = field("data_parallel_rank", false)?;
    Ok(routed.or(alias))
}

/// The `X-Data-Parallel-Rank` header, read as Python's `int()` reads a string.
pub(crate) fn header_rank(headers: &HeaderMap) -> Result<Option<RankValue>, String> {
    let Some(raw) = headers.get(RANK_HEADER) else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(raw.as_bytes());
    python_int(&text).map(Some).ok_or_else(|| {
        format!("Invalid X-Data-Parallel-Rank header: must be an integer, got '{text}'")
    })
}

/// The rank a request asks for on `route`: on the OpenAI routes the header wins over the body;
/// `/generate` reads the body only.
pub(crate) fn requested(
    route: Route,
    header: Option<RankValue>,
    body: Option<RankValue>,
) -> Option<RankValue> {
    if route == Route::Generate {
        return body;
    }
    match (header, body) {
        (Some(h), Some(b)) if h != b => {
            tracing::debug!(
                "X-Data-Parallel-Rank header ({h}) overrides body routed_dp_rank ({b})"
            );
            Some(h)
        }
        (h, b) => h.or(b),
    }
}

/// Checks a requested rank against the engine's `dp_size`: `Ok(Some(rank))` to run it there,
/// `Ok(None)` when it is ignored (rank 0 on a single-rank engine), `Err` (SGLang's message) when
/// it is out of range.
pub(crate) fn check(rank: RankValue, dp_size: u32) -> Result<Option<usize>, String> {
    if dp_size <= 1 && rank == 0 {
        tracing::debug!("routed_dp_rank={rank} is ignored because num_dp_ranks={dp_size}");
        return Ok(None);
    }
    match usize::try_from(rank) {
        Ok(r) if r < dp_size as usize => Ok(Some(r)),
        _ => Err(format!("routed_dp_rank={rank} out of range [0, {dp_size})")),
    }
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
        assert_eq!(body_rank(Route::Chat, &both), Ok(Some(1)));
        let alias = m(json!({"routed_dp_rank": null, "data_parallel_rank": "2"}));
        assert_eq!(body_rank(Route::Generate, &alias), Ok(Some(2)));
        let strict = m(json!({"routed_dp_rank": "2"}));
        assert!(
            body_rank(Route::Generate, &strict)
                .unwrap_err()
                .starts_with("routed_dp_rank: expected a JSON integer")
        );
        assert_eq!(body_rank(Route::Completions, &strict), Ok(Some(2)));
    }

    #[test]
    fn range_and_the_single_rank_exception() {
        assert_eq!(check(0, 1), Ok(None));
        assert_eq!(check(3, 4), Ok(Some(3)));
        assert_eq!(
            check(1, 1),
            Err("routed_dp_rank=1 out of range [0, 1)".into())
        );
        assert_eq!(
            check(-1, 4),
            Err("routed_dp_rank=-1 out of range [0, 4)".into())
        );
    }
}
