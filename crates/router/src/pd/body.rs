//! The bootstrap fields of a PD request's body, as SGLang 0.5.23's request models read them
//! (`GenerateReqInput`, `CompletionRequest`, `ChatCompletionRequest`): `bootstrap_host`,
//! `bootstrap_port`, `bootstrap_room` and, when the router chose the prefill rank,
//! `disagg_prefill_dp_rank`. A batched `/generate` (a list `text`, or a list of token lists as
//! `input_ids`) carries a list of each, one room per prompt, as the engines pair each prompt on
//! its own.
//!
//! The body is parsed once per request ([`shape`]): to learn the batch size and to drop bootstrap
//! fields a client sent (the router's own must be the only ones: a duplicate key is an error to a
//! strict parser). Each attempt then splices its fields in front of the body's members
//! ([`with_bootstrap`]), leaving the rest byte for byte, as the routed-rank field is spliced.

use super::BootstrapPort;
use axum::body::Bytes;
use serde_json::Value;

/// The fields the router owns on a PD request.
pub const FIELDS: [&str; 4] = [
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "disagg_prefill_dp_rank",
];

/// What the rewrite needs of a request body.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Prompts in a batched `/generate`; `None`: one request.
    pub batch: Option<usize>,
    /// The body, without any bootstrap field the client sent.
    pub body: Bytes,
}

/// The body's [`Shape`] on route `path`; an error (for a 400) when it is not a JSON object.
pub fn shape(path: &str, body: Bytes) -> Result<Shape, String> {
    let mut v: Value = serde_json::from_slice(&body)
        .map_err(|e| format!("a PD request body must be a JSON object: {e}"))?;
    let Some(obj) = v.as_object_mut() else {
        return Err("a PD request body must be a JSON object".into());
    };
    let batch = match path {
        "/generate" => batch_of(obj),
        _ => None,
    };
    let sent = FIELDS.iter().any(|f| obj.contains_key(*f));
    let body = if sent {
        FIELDS.iter().for_each(|f| {
            obj.remove(*f);
        });
        Bytes::from(serde_json::to_vec(&v).map_err(|e| e.to_string())?)
    } else {
        body
    };
    Ok(Shape { batch, body })
}

/// A `/generate` batch: `text` as a list, or `input_ids` as a list of lists.
fn batch_of(obj: &serde_json::Map<String, Value>) -> Option<usize> {
    if let Some(Value::Array(texts)) = obj.get("text") {
        return Some(texts.len());
    }
    match obj.get("input_ids") {
        Some(Value::Array(ids)) if ids.first().is_some_and(Value::is_array) => Some(ids.len()),
        _ => None,
    }
}

/// One attempt's bootstrap: the prefill engine's host and port, the rooms (one, or one per prompt
/// of a batch) and the prefill rank chosen, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct Bootstrap<'a> {
    pub host: &'a str,
    pub port: BootstrapPort,
    pub rooms: &'a [u64],
    pub prefill_rank: Option<u32>,
}

/// `body` (a JSON object, as [`shape`] checked) with `b`'s fields as its first members: single
/// values, or lists when `batch` is set (`b.rooms` then holds one room per prompt).
pub fn with_bootstrap(body: &[u8], batch: Option<usize>, b: &Bootstrap<'_>) -> Bytes {
    let host = Value::String(b.host.to_string()).to_string();
    let mut members = String::with_capacity(96 + 24 * b.rooms.len());
    let list = |one: &str, n: usize| {
        let mut s = String::from("[");
        for i in 0..n {
            if i > 0 {
                s.push(',');
            }
            s.push_str(one);
        }
        s.push(']');
        s
    };
    let rooms = |single: bool| {
        let r: Vec<String> = b.rooms.iter().map(u64::to_string).collect();
        match single {
            true => r.first().cloned().unwrap_or_else(|| "0".into()),
            false => format!("[{}]", r.join(",")),
        }
    };
    match batch {
        None => {
            members.push_str(&format!("\"bootstrap_host\":{host},"));
            if let BootstrapPort::Port(p) = b.port {
                members.push_str(&format!("\"bootstrap_port\":{p},"));
            }
            members.push_str(&format!("\"bootstrap_room\":{},", rooms(true)));
        }
        Some(n) => {
            members.push_str(&format!("\"bootstrap_host\":{},", list(&host, n)));
            if let BootstrapPort::Port(p) = b.port {
                members.push_str(&format!("\"bootstrap_port\":{},", list(&p.to_string(), n)));
            }
            members.push_str(&format!("\"bootstrap_room\":{},", rooms(false)));
        }
    }
    if let Some(r) = b.prefill_rank {
        members.push_str(&format!("\"disagg_prefill_dp_rank\":{r},"));
    }
    splice_front(body, &members)
}

/// `body` with `members` (each ending in a comma) inserted after its opening brace; the trailing
/// comma is dropped for an empty object.
fn splice_front(body: &[u8], members: &str) -> Bytes {
    let open = body.iter().position(|&b| b == b'{').unwrap_or(0);
    let rest = &body[(open + 1).min(body.len())..];
    let empty = rest
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_none_or(|&b| b == b'}');
    let members = match empty {
        true => members.trim_end_matches(','),
        false => members,
    };
    let mut out = Vec::with_capacity(body.len() + members.len() + 2);
    out.push(b'{');
    out.extend_from_slice(members.as_bytes());
    out.extend_from_slice(rest);
    Bytes::from(out)
}

/// The host part of a worker URL (`http://HOST:PORT`, IPv6 without its brackets), as the engines
/// dial it for the bootstrap.
pub fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6);
    }
    authority.split(':').next().unwrap_or(authority)
}

#[cfg(test)]
#[path = "body_tests.rs"]
mod tests;
