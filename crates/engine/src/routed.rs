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
//! The reading itself is `loadlink_wire::routed_rank` (the router reads a client's own rank with
//! it too); this module adds what is the engine's: the header as axum hands it, SGLang's log line
//! for a disagreement, and the range check against this engine's ranks.

use crate::api::Route;
use axum::http::HeaderMap;
pub use loadlink_wire::routed_rank::{RANK_HEADER, RankValue};
use loadlink_wire::routed_rank::{body_rank as wire_body_rank, header_rank as wire_header_rank};
use serde_json::{Map, Value};

/// The body's rank: `routed_dp_rank`, else `data_parallel_rank`; `None` when neither is set.
pub(crate) fn body_rank(route: Route, m: &Map<String, Value>) -> Result<Option<RankValue>, String> {
    wire_body_rank(route == Route::Generate, m)
}

/// The `X-Data-Parallel-Rank` header, read as Python's `int()` reads a string.
pub(crate) fn header_rank(headers: &HeaderMap) -> Result<Option<RankValue>, String> {
    headers
        .get(RANK_HEADER)
        .map(|raw| wire_header_rank(raw.as_bytes()))
        .transpose()
}

/// The rank a request asks for on `route`: on the OpenAI routes the header wins over the body
/// (a disagreement is logged at debug level, as SGLang does); `/generate` reads the body only.
pub(crate) fn requested(
    route: Route,
    header: Option<RankValue>,
    body: Option<RankValue>,
) -> Option<RankValue> {
    if let (Some(h), Some(b), false) = (header, body, route == Route::Generate)
        && h != b
    {
        tracing::debug!("X-Data-Parallel-Rank header ({h}) overrides body routed_dp_rank ({b})");
    }
    loadlink_wire::routed_rank::requested(route != Route::Generate, header, body)
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

#[cfg(test)]
mod tests {
    use super::*;

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
