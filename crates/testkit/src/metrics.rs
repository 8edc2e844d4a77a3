//! Reading a `/metrics` page in a test: fetched, then parsed with the strict
//! [`loadlink_wire::prom::parse`], so a test that reads one number also proves the whole page is
//! well-formed Prometheus text (no prefix matching that a malformed page would pass).

use crate::http::get_text;
use loadlink_wire::prom::{self, Scrape};

/// `GET {base_url}/metrics`, parsed strictly; panics (with the page) when it is not well-formed.
pub async fn scrape(c: &reqwest::Client, base_url: &str) -> Scrape {
    let text = get_text(c, &format!("{base_url}/metrics")).await;
    prom::parse(&text).unwrap_or_else(|e| panic!("{base_url}/metrics: {e}\n{text}"))
}
