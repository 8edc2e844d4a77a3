//! The Jinja environment chat templates are rendered in, set up as transformers sets up its own
//! (`utils/chat_template_utils.py`, `_compile_jinja_template`, transformers 5.19), because the
//! engine's prompt is what that environment renders and a prefix hash is only worth something
//! when the router renders the very same text:
//!
//! * `trim_blocks` and `lstrip_blocks` on: published templates are indented for reading and rely
//!   on both to print none of that whitespace;
//! * the `loopcontrols` extension (`break`, `continue`);
//! * `raise_exception(msg)`, which fails the render (the engine answers such a request with a
//!   400, so the router has nothing to price);
//! * `strftime_now(fmt)`: local time formatted by the C library's `strftime`, as Python's
//!   `datetime.now().strftime` formats it (Llama 3.x prints today's date into its system header);
//! * `tojson` as Python's `json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)`
//!   ([`super::py_json`]), not Jinja's HTML-escaping one;
//! * Python's string and dict methods (`.strip()`, `.split()`, `.items()`, …) through
//!   minijinja-contrib's pycompat callback.
//!
//! Two bounds keep a hostile template or request from costing the request path more than a
//! render should: [`RENDER_FUEL`] instructions and [`MAX_RENDERED_BYTES`] of output. Past either,
//! the render fails and the request is routed without a cache key (see `tokenizer.rs`).

use super::py_json::{DumpOptions, dumps};
use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use std::io::{self, Write};

/// Instructions one render may execute: a long multi-turn chat with tools takes tens of
/// thousands; this is a hundred times that, a few tens of milliseconds of CPU.
pub const RENDER_FUEL: u64 = 5_000_000;

/// Bytes one rendered prompt may have: about two million tokens of text.
pub const MAX_RENDERED_BYTES: usize = 8 << 20;

/// An environment holding `templates` (name, source), configured as transformers configures
/// its own.
pub fn chat_environment(templates: Vec<(String, String)>) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_fuel(Some(RENDER_FUEL));
    env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    for (name, source) in templates {
        env.add_template_owned(name, source)?;
    }
    Ok(env)
}

/// Renders template `name` of `env` with `ctx`, failing past [`MAX_RENDERED_BYTES`].
pub fn render_bounded(env: &Environment<'_>, name: &str, ctx: Value) -> Result<String, Error> {
    let t = env.get_template(name)?;
    let mut out = Bounded(Vec::new(), false);
    let rendered = t.render_captured_to(ctx, &mut out);
    if out.1 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("the rendered prompt passed {MAX_RENDERED_BYTES} bytes"),
        ));
    }
    rendered?;
    String::from_utf8(out.0).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))
}

/// An output buffer that refuses to grow past [`MAX_RENDERED_BYTES`] (and says it did).
struct Bounded(Vec<u8>, bool);

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDERED_BYTES {
            self.1 = true;
            return Err(io::Error::other("output bound"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `x | tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, positional
/// or by keyword, as transformers' override takes them.
fn tojson(value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let bad = |what: &str| Error::new(ErrorKind::InvalidOperation, format!("tojson: {what}"));
    let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > names.len() {
        return Err(bad("takes at most 4 arguments"));
    }
    let arg = |i: usize| -> Result<Option<Value>, Error> {
        match (args.get(i), kwargs.get::<Option<Value>>(names[i])?) {
            (Some(_), Some(_)) => Err(bad(&format!("{} given twice", names[i]))),
            (Some(v), None) => Ok(Some(v.clone())),
            (None, Some(v)) => Ok(Some(v)),
            (None, None) => Ok(None),
        }
    };
    let mut o = DumpOptions::default();
    if let Some(v) = arg(0)? {
        o.ensure_ascii = v.is_true();
    }
    if let Some(v) = arg(1)? {
        o.indent = match v.kind() {
            ValueKind::None | ValueKind::Undefined => None,
            ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
            _ => {
                let n = v
                    .as_i64()
                    .ok_or_else(|| bad("indent: expected an integer, a string or none"))?;
                Some(" ".repeat(usize::try_from(n).unwrap_or(0).min(64)))
            }
        };
    }
    if let Some(v) = arg(2)?
        && !v.is_none()
        && !v.is_undefined()
    {
        let pair: Vec<Value> = v.try_iter()?.collect();
        match pair.as_slice() {
            [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                o.separators = Some((a.to_string(), b.to_string()));
            }
            _ => return Err(bad("separators: expected a pair of strings")),
        }
    }
    if let Some(v) = arg(3)? {
        o.sort_keys = v.is_true();
    }
    kwargs.assert_all_used()?;
    dumps(&value, &o)
        .map(Value::from)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e))
}

/// `datetime.now().strftime(format)`: the local time through the C library's `strftime`.
fn strftime_now(format: String) -> Result<String, Error> {
    let bad = |what: &str| Error::new(ErrorKind::InvalidOperation, format!("strftime_now: {what}"));
    let fmt = std::ffi::CString::new(format.as_str()).map_err(|_| bad("a NUL in the format"))?;
    // SAFETY: `time` with a null pointer only returns the time; `localtime_r` writes into the
    // zeroed `tm` we own; `strftime` writes at most `buf.len()` bytes into `buf` and reads the
    // NUL-terminated `fmt` and the initialised `tm`.
    let (n, buf) = unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            return Err(bad("the local time is unavailable"));
        }
        let mut buf = vec![0u8; 64 + format.len() * 16];
        let n = libc::strftime(buf.as_mut_ptr().cast(), buf.len(), fmt.as_ptr(), &tm);
        (n, buf)
    };
    if n == 0 && !format.is_empty() {
        return Err(bad("the formatted date is empty or too long"));
    }
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, ctx: Value) -> Result<String, Error> {
        let env = chat_environment(vec![("t".into(), source.into())])?;
        render_bounded(&env, "t", ctx)
    }

    #[test]
    fn renders_as_transformers_environment_does() {
        let ctx = minijinja::context! {
            messages => vec![
                minijinja::context! { role => "user", content => " hi " },
                minijinja::context! { role => "assistant", content => "yo" },
            ],
        };
        // trim_blocks drops the newline after a block tag, lstrip_blocks the indent before it.
        let src = "{% for m in messages %}\n    {% if m.role == 'assistant' %}\n{% break %}\n    {% endif %}\n[{{ m.content.strip() }}]\n{% endfor %}\n";
        assert_eq!(render(src, ctx.clone()).unwrap(), "[hi]\n");
        let json = "{{ {'b': [1, 2.0], 'a': 'é<'} | tojson }}|{{ {'x': 1} | tojson(indent=2) }}|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}";
        assert_eq!(
            render(json, ctx.clone()).unwrap(),
            "{\"b\": [1, 2.0], \"a\": \"é<\"}|{\n  \"x\": 1\n}|{\"a\": 2, \"b\": 1}"
        );
        let e = render("{{ raise_exception('no system role') }}", ctx.clone()).unwrap_err();
        assert!(e.to_string().contains("no system role"), "{e}");
        let year = render("{{ strftime_now('%Y') }}", ctx.clone()).unwrap();
        assert!(year.len() == 4 && year.starts_with('2'), "{year}");
    }

    #[test]
    fn a_render_past_its_bounds_fails() {
        let ctx = minijinja::context! {};
        let big = render(
            "{% for i in range(10000) %}{{ 'x' * 1000 }}{% endfor %}",
            ctx.clone(),
        );
        let e = big.unwrap_err();
        assert!(e.to_string().contains("bytes"), "output bound: {e}");
        let spin = render(
            "{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}",
            ctx,
        );
        assert!(spin.is_err(), "fuel bound");
    }
}
