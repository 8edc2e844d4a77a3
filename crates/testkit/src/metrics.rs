//! Reading a `/metrics` page in a test: fetched, then parsed with the strict
//! [`loadlink_wire::prom::parse`], so a test that reads one number also proves the whole page is
//! well-formed Prometheus text (no prefix matching that a malformed page would pass).

use loadlink_wire::prom::{self, Scrape};

/// `GET {base_url}/metrics`, parsed strictly; panics (with the page) when it is not well-formed.
pub async fn scrape(c: &reqwest::Client, base_url: &str) -> Scrape {
    let resp = c
        .get(format!("{base_url}/metrics"))
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(resp.status(), 200, "GET {base_url}/metrics");
    let text = resp.text().await.expect("the /metrics body");
    prom::parse(&text).unwrap_or_else(|e| panic!("{base_url}/metrics: {e}\n{text}"))
}
