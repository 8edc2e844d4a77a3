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
//!   header travels as it came. As in SGLang, the header wins over the body. The body is parsed for
//!   this only when one of the two keys appears in it.

use crate::candidate::{RANK_BODY_ALIAS, RANK_BODY_FIELD, RANK_HEADER};
use axum::body::Bytes;
use axum::http::HeaderMap;
use serde_json::Value;

/// A rank the client named for its request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientRank {
    pub header: Option<u32>,
    pub body: Option<u32>,
}

impl ClientRank {
    /// What `headers` and `body` name; an unreadable header or field is an error naming it.
    pub fn of(headers: &HeaderMap, body: &[u8]) -> Result<Self, String> {
        let header = match headers.get(RANK_HEADER) {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok())
                    .ok_or_else(|| {
                        format!(
                            "header X-Data-Parallel-Rank: expected a non-negative integer, got {:?}",
                            String::from_utf8_lossy(v.as_bytes())
                        )
                    })?,
            ),
        };
        Ok(ClientRank {
            header,
            body: body_rank(body)?,
        })
    }

    /// The rank the engine will take: the header's, else the body's.
    pub fn rank(&self) -> Option<u32> {
        self.header.or(self.body)
    }
}

/// `routed_dp_rank` (else `data_parallel_rank`) of a JSON object body; `None` when absent or null.
fn body_rank(body: &[u8]) -> Result<Option<u32>, String> {
    let named = |key: &str| {
        body.windows(key.len() + 1)
            .any(|w| &w[..key.len()] == key.as_bytes() && w[key.len()] == b'"')
    };
    if !named(RANK_BODY_FIELD) && !named(RANK_BODY_ALIAS) {
        return Ok(None);
    }
    let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(body) else {
        return Ok(None); // not a JSON object: the engine answers for it
    };
    for key in [RANK_BODY_FIELD, RANK_BODY_ALIAS] {
        match m.get(key) {
            None | Some(Value::Null) => continue,
            Some(v) => {
                return v
                    .as_u64()
                    .and_then(|r| u32::try_from(r).ok())
                    .map(Some)
                    .ok_or_else(|| format!("{key}: expected a non-negative integer, got {v}"));
            }
        }
    }
    Ok(None)
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
    fn a_client_rank_comes_from_the_header_first_then_either_body_field() {
        let mut h = HeaderMap::new();
        let body = br#"{"prompt":"x","data_parallel_rank":2}"#;
        assert_eq!(ClientRank::of(&h, body).unwrap().rank(), Some(2));
        let body = br#"{"routed_dp_rank":1,"data_parallel_rank":2}"#;
        assert_eq!(ClientRank::of(&h, body).unwrap().rank(), Some(1));
        h.insert(RANK_HEADER, "5".parse().unwrap());
        assert_eq!(ClientRank::of(&h, body).unwrap().rank(), Some(5));
        h.insert(RANK_HEADER, "five".parse().unwrap());
        let e = ClientRank::of(&h, body).unwrap_err();
        assert!(
            e.contains("X-Data-Parallel-Rank") && e.contains("five"),
            "{e}"
        );
        let h = HeaderMap::new();
        let e = ClientRank::of(&h, br#"{"routed_dp_rank":-1}"#).unwrap_err();
        assert!(
            e.contains("routed_dp_rank: expected a non-negative integer"),
            "{e}"
        );
        let none = br#"{"prompt":"mentions routed_dp_rank in text","routed_dp_rank":null}"#;
        assert_eq!(ClientRank::of(&h, none).unwrap().rank(), None);
    }
}
