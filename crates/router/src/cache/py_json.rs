//! `json.dumps` as Python writes it, for the chat templates' `tojson` filter.
//!
//! transformers replaces Jinja's `tojson` (which HTML-escapes) with `json.dumps(x,
//! ensure_ascii=False, indent=…, separators=…, sort_keys=…)`, and published templates print tool
//! schemas and tool-call arguments through it, so every byte of its output is part of the prompt:
//! `", "` and `": "` between items unless told otherwise (`","` once an indent is set), non-ASCII
//! kept, Python's float repr (`1.0`, `1e-05`, `1e+16`), maps in their given order.

use minijinja::value::{Value, ValueKind};
use std::fmt::Write;

/// How `tojson` was called.
#[derive(Debug, Clone, Default)]
pub struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: newline and `s` per level (Python's `indent=n` is `n` spaces,
    /// a string indent is itself).
    pub indent: Option<String>,
    /// `(item, key)` separators; Python's default depends on `indent`.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

/// `value` as Python's `json.dumps` writes it; an error names what JSON cannot hold.
pub fn dumps(value: &Value, o: &DumpOptions) -> Result<String, String> {
    let (item, key) = o.separators.clone().unwrap_or_else(|| {
        let item = if o.indent.is_some() { "," } else { ", " };
        (item.to_string(), ": ".to_string())
    });
    let mut out = String::new();
    Writer {
        o,
        item: &item,
        key: &key,
    }
    .value(value, 0, &mut out)?;
    Ok(out)
}

struct Writer<'a> {
    o: &'a DumpOptions,
    item: &'a str,
    key: &'a str,
}

impl Writer<'_> {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(ind) = &self.o.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    }

    fn value(&self, v: &Value, depth: usize, out: &mut String) -> Result<(), String> {
        match v.kind() {
            ValueKind::None | ValueKind::Undefined => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => number(v, out)?,
            ValueKind::String => string(v.as_str().unwrap_or_default(), self.o.ensure_ascii, out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter().map_err(|e| e.to_string())?.collect();
                self.open_close(out, depth, '[', ']', items.len(), |i, d, out| {
                    self.value(&items[i], d, out)
                })?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter().map_err(|e| e.to_string())?.collect();
                if self.o.sort_keys {
                    keys.sort();
                }
                self.open_close(out, depth, '{', '}', keys.len(), |i, d, out| {
                    let k = &keys[i];
                    match k.as_str() {
                        Some(s) => string(s, self.o.ensure_ascii, out),
                        None => {
                            // Python writes int, float, bool and None keys as strings.
                            let mut s = String::new();
                            self.value(k, d, &mut s)?;
                            string(s.trim_matches('"'), self.o.ensure_ascii, out);
                        }
                    }
                    out.push_str(self.key);
                    let item = v.get_item(k).map_err(|e| e.to_string())?;
                    self.value(&item, d, out)
                })?;
            }
            other => return Err(format!("tojson: a {other} value is not JSON serializable")),
        }
        Ok(())
    }

    fn open_close(
        &self,
        out: &mut String,
        depth: usize,
        open: char,
        close: char,
        n: usize,
        mut each: impl FnMut(usize, usize, &mut String) -> Result<(), String>,
    ) -> Result<(), String> {
        out.push(open);
        if n == 0 {
            out.push(close);
            return Ok(());
        }
        for i in 0..n {
            if i > 0 {
                out.push_str(self.item);
            }
            self.newline(depth + 1, out);
            each(i, depth + 1, out)?;
        }
        self.newline(depth, out);
        out.push(close);
        Ok(())
    }
}

fn number(v: &Value, out: &mut String) -> Result<(), String> {
    if v.is_integer() {
        // Integers of any width: their decimal form.
        let _ = write!(out, "{v}");
    } else {
        let f = f64::try_from(v.clone()).map_err(|e| format!("tojson: {e}"))?;
        out.push_str(&float_repr(f));
    }
    Ok(())
}

/// Python's `repr(float)` as `json.dumps` writes it: the shortest round-tripping digits, fixed
/// notation for exponents -4 to 15, else `d.ddde±XX`; `NaN`, `Infinity`, `-Infinity`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // `{:e}`: the shortest round-tripping digits as `d.ddde<exp>`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let s = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (a, b) = digits.split_at(point as usize);
            format!("{a}.{b}")
        };
        format!("{sign}{s}")
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}

fn string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(json: &str) -> Value {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn writes_what_python_json_dumps_writes() {
        let v = parsed(r#"{"b": [1, 2.5, true, null], "a": "é\n\"", "c": {}, "d": []}"#);
        let one = dumps(&v, &DumpOptions::default()).unwrap();
        assert_eq!(
            one,
            r#"{"b": [1, 2.5, true, null], "a": "é\n\"", "c": {}, "d": []}"#
        );
        let sorted = DumpOptions {
            sort_keys: true,
            ensure_ascii: true,
            ..Default::default()
        };
        assert_eq!(
            dumps(&v, &sorted).unwrap(),
            r#"{"a": "\u00e9\n\"", "b": [1, 2.5, true, null], "c": {}, "d": []}"#
        );
        let indented = DumpOptions {
            indent: Some("    ".into()),
            ..Default::default()
        };
        assert_eq!(
            dumps(&parsed(r#"{"x": [1, {"y": null}], "z": []}"#), &indented).unwrap(),
            "{\n    \"x\": [\n        1,\n        {\n            \"y\": null\n        }\n    ],\n    \"z\": []\n}"
        );
        let tight = DumpOptions {
            separators: Some((",".into(), ":".into())),
            ..Default::default()
        };
        assert_eq!(
            dumps(&parsed(r#"{"a": [1, 2]}"#), &tight).unwrap(),
            r#"{"a":[1,2]}"#
        );
    }

    #[test]
    fn floats_as_python_repr() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456.789, "123456.789"),
            (1.5e300, "1.5e+300"),
            (0.0, "0.0"),
        ] {
            assert_eq!(float_repr(f), s, "{f}");
        }
    }
}
