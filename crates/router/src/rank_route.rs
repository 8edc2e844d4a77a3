//! The DP rank on the wire between client, router and engine.
//!
//! * **What the router adds.** The chosen rank goes in the header `X-Data-Parallel-Rank` and/or
//!   the body field `routed_dp_rank` ([`crate::candidate::RankField`] says which, per route). The
//!   field is spliced in right after the body's opening brace, so the body is copied once and never
//!   re-serialised: the client's JSON (key order, number forms, unknown fields) reaches the engine
//!   byte for byte.
//! * **What a client may name itself.** A client that sends its own rank (the header, or
//!   `routed_dp_rank` / `data_parallel_rank` in the body) pins the request to it: the router then
//!   picks among that rank's candidates (and whole workers) and adds nothing, and the client's
//!   header travels as it came. It is read exactly as the engine reads it (header on the OpenAI
//!   routes only, winning over the body; pydantic's lax integers there, a plain JSON integer in
//!   `/generate`'s `routed_dp_rank`), by the same code ([`loadlink_wire::routed_rank`]). The body is
//!   parsed for this only when one of the two keys appears in it.

use crate::candidate::{RANK_BODY_ALIAS, RANK_BODY_FIELD, RANK_HEADER};
use axum::body::Bytes;
use axum::http::HeaderMap;
use loadlink_wire::routed_rank::{body_rank, header_rank, requested};
use serde_json::Value;

/// A rank the client named for its request, read as the engine will read it
/// ([`loadlink_wire::routed_rank`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientRank(Option<u32>);

impl ClientRank {
    /// What a request to `path` with `headers` and `body` names: the header on the OpenAI routes
    /// (it wins), else `routed_dp_rank` / `data_parallel_rank` in the body. A value the engine
    /// would refuse is an error naming it (the engine's 400, answered by the router).
    pub fn of(path: &str, headers: &HeaderMap, body: &[u8]) -> Result<Self, String> {
        let openai = path.starts_with("/v1/");
        let header = match headers.get(RANK_HEADER).filter(|_| openai) {
            Some(v) => Some(header_rank(v.as_bytes())?),
            None => None,
        };
        let body = match names_a_rank(body) {
            true => match serde_json::from_slice::<Value>(body) {
                Ok(Value::Object(m)) => body_rank(path == "/generate", &m)?,
                _ => None, // not a JSON object: the engine answers for it
            },
            false => None,
        };
        match requested(openai, header, body) {
            None => Ok(ClientRank(None)),
            Some(r) => u32::try_from(r)
                .map(|r| ClientRank(Some(r)))
                .map_err(|_| format!("routed_dp_rank={r} out of range: a DP rank is 0 or more")),
        }
    }

    /// The rank the engine will take.
    pub fn rank(&self) -> Option<u32> {
        self.0
    }
}

/// Whether either rank key appears in `body` (the body is parsed only then).
fn names_a_rank(body: &[u8]) -> bool {
    let named = |key: &str| {
        body.windows(key.len() + 1)
            .any(|w| &w[..key.len()] == key.as_bytes() && w[key.len()] == b'"')
    };
    named(RANK_BODY_FIELD) || named(RANK_BODY_ALIAS)
}

/// `body` with `"routed_dp_rank":rank` as its first member; `None` when it is not a JSON object.
pub fn with_rank_field(body: &[u8], rank: u32) -> Option<Bytes> {
    let open = body.iter().position(|b| !b.is_ascii_whitespace())?;
    if body[open] != b'{' {
        return None;
    }
    let rest = &body[open + 1..];
    let empty = rest
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_none_or(|&b| b == b'}');
    let member = format!(
        "\"{RANK_BODY_FIELD}\":{rank}{}",
        if empty { "" } else { "," }
    );
    let mut out = Vec::with_capacity(body.len() + member.len());
    out.extend_from_slice(&body[..=open]);
    out.extend_from_slice(member.as_bytes());
    out.extend_from_slice(rest);
    Some(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(b: &Bytes) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn the_field_is_spliced_in_and_the_rest_kept_byte_for_byte() {
        let body = br#" {"model":"m","prompt":"a \"routed\" {text}","max_tokens":1.0}"#;
        let out = with_rank_field(body, 3).unwrap();
        assert_eq!(
            &out[..],
            br#" {"routed_dp_rank":3,"model":"m","prompt":"a \"routed\" {text}","max_tokens":1.0}"#
        );
        assert_eq!(parsed(&out)["routed_dp_rank"], 3);
        assert_eq!(
            parsed(&with_rank_field(b"{ }", 0).unwrap())["routed_dp_rank"],
            0
        );
        assert_eq!(with_rank_field(b"[1,2]", 1), None);
        assert_eq!(with_rank_field(b"", 1), None);
    }

    #[test]
    fn a_client_rank_is_read_as_the_engine_reads_it() {
        let of = |path, h: &HeaderMap, body: &[u8]| ClientRank::of(path, h, body);
        let mut h = HeaderMap::new();
        let c = "/v1/completions";
        let body = br#"{"prompt":"x","data_parallel_rank":2}"#;
        assert_eq!(of(c, &h, body).unwrap().rank(), Some(2));
        let body = br#"{"routed_dp_rank":"1","data_parallel_rank":2}"#;
        assert_eq!(
            of(c, &h, body).unwrap().rank(),
            Some(1),
            "lax on the OpenAI routes"
        );
        assert!(
            of("/generate", &h, body)
                .unwrap_err()
                .contains("a JSON integer")
        );
        h.insert(RANK_HEADER, " 5 ".parse().unwrap());
        assert_eq!(of(c, &h, body).unwrap().rank(), Some(5), "the header wins");
        let generate = br#"{"text":"x","routed_dp_rank":1}"#;
        assert_eq!(
            of("/generate", &h, generate).unwrap().rank(),
            Some(1),
            "/generate: no header"
        );
        h.insert(RANK_HEADER, "five".parse().unwrap());
        let e = of(c, &h, body).unwrap_err();
        assert!(
            e.contains("X-Data-Parallel-Rank") && e.contains("five"),
            "{e}"
        );
        let h = HeaderMap::new();
        let e = of(c, &h, br#"{"routed_dp_rank":-1}"#).unwrap_err();
        assert!(e.contains("routed_dp_rank=-1 out of range"), "{e}");
        let none = br#"{"prompt":"mentions routed_dp_rank in text","routed_dp_rank":null}"#;
        assert_eq!(of(c, &h, none).unwrap().rank(), None);
    }
}
