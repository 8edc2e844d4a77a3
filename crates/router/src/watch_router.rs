//! `loadlink watch --router URL`: what a running router believes, per worker and per DP rank, as a
//! live table. The engine-side view ([`crate::watch`]) shows what each rank publishes; this one
//! shows what the router made of it: each rank's load as a candidate, what the router routed to it
//! by name, the share it believed cached there, and the blocks its index holds for it. It reads the
//! router's `GET /workers` (bounded in time and size, as every fetch from a peer).

use crate::peer_http::{FetchBudget, HttpClient, bounded_get};
use serde_json::Value;
use std::fmt::Write as _;
use std::time::Duration;

/// How long one fetch of `/workers` may take, and how large it may be (a few hundred bytes per
/// rank: 16 MiB is tens of thousands of ranks).
pub const ROUTER_FETCH: FetchBudget = FetchBudget {
    timeout: Duration::from_secs(2),
    max_body: 16 << 20,
};

/// The router's `/workers` document.
pub async fn fetch_workers(client: &HttpClient, router_url: &str) -> Result<Value, String> {
    let url = format!("{}/workers", router_url.trim_end_matches('/'));
    let answer = bounded_get(client, &url, ROUTER_FETCH)
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !answer.status.is_success() {
        return Err(format!("GET {url}: {}", answer.status));
    }
    serde_json::from_slice(&answer.body)
        .map_err(|e| format!("GET {url}: not the /workers JSON of a loadlink router: {e}"))
}

/// The table: a line per worker, then a line per rank of a worker with several.
pub fn screen(doc: &Value) -> String {
    let mut s = String::from("\x1b[H\x1b[2J");
    let _ = writeln!(
        s,
        "policy {} · load signal {} · prefixes from {}",
        text(&doc["policy"]),
        text(&doc["load_signal"]),
        text(&doc["prefix_source"])
    );
    let _ = writeln!(
        s,
        "{:<36} {:>9} {:>7} {:>8} {:>7} {:>9} {:>8} {:>6} {:>8}",
        "worker / rank",
        "routing",
        "load",
        "source",
        "age",
        "in-flight",
        "routed",
        "hit%",
        "blocks"
    );
    for w in doc["workers"].as_array().into_iter().flatten() {
        let routing = text(&w["rank_routing"]["mode"]);
        let routed = &w["routed"];
        let ranks = w["ranks"].as_array().map_or(&[][..], Vec::as_slice);
        let by_rank: u64 = ranks
            .iter()
            .filter_map(|r| r["routed_requests"].as_u64())
            .sum();
        let _ = writeln!(
            s,
            "{:<36} {:>9} {:>7} {:>8} {:>7} {:>9} {:>8} {:>6} {:>8}",
            text(&w["url"]),
            routing,
            text(&w["load"]),
            text(&w["source"]),
            age(&w["age_ms"]),
            text(&w["inflight"]),
            if routing == "per-rank" {
                by_rank.to_string()
            } else {
                "-".into()
            },
            percent(&routed["hit_rate"]),
            text(&w["kv_events"]["blocks"]),
        );
        if ranks.len() < 2 {
            continue;
        }
        let blocks = w["kv_events"]["rank_blocks"].as_array();
        for (i, r) in ranks.iter().enumerate() {
            let b = blocks.and_then(|b| b.get(i)).map_or("-".into(), text);
            let _ = writeln!(
                s,
                "  rank {:<29} {:>9} {:>7} {:>8} {:>7} {:>9} {:>8} {:>6} {:>8}",
                text(&r["rank"]),
                "",
                text(&r["load"]),
                text(&r["source"]),
                age(&r["age_ms"]),
                text(&r["inflight"]),
                text(&r["routed_requests"]),
                percent(&r["hit_rate"]),
                b,
            );
        }
    }
    s.push_str(
        "\nrouted: requests this router sent to the rank by name; hit%: the share of routed prompt tokens\nit believed cached there. Ctrl-C to stop.\n",
    );
    s
}

/// A JSON scalar as a table cell (`-` when absent).
fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn age(v: &Value) -> String {
    v.as_u64().map_or("-".into(), |ms| format!("{ms}ms"))
}

fn percent(v: &Value) -> String {
    v.as_f64()
        .map_or("-".into(), |x| format!("{:.1}%", x * 100.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_rank_of_a_rank_routed_worker_gets_its_line() {
        let doc = json!({
            "policy": "min_ttft", "load_signal": "backlog", "prefix_source": "auto",
            "workers": [{
                "url": "http://e0:1", "load": 7, "source": "engine", "age_ms": 3, "inflight": 2,
                "rank_routing": {"mode": "per-rank"},
                "routed": {"prompt_tokens": 4096, "hit_rate": 0.75},
                "kv_events": {"blocks": 30, "rank_blocks": [10, 20]},
                "ranks": [
                    {"rank": 0, "load": 3, "source": "engine", "age_ms": 3, "inflight": 1,
                     "routed_requests": 5, "hit_rate": 0.5},
                    {"rank": 1, "load": 4, "source": "fallback", "age_ms": null, "inflight": 1,
                     "routed_requests": 6, "hit_rate": null},
                ],
            }, {
                "url": "http://e1:1", "load": 0, "source": "fallback", "age_ms": null,
                "inflight": 0, "rank_routing": {"mode": "worker"}, "routed": {},
                "kv_events": null, "ranks": [],
            }],
        });
        let s = screen(&doc);
        let line = |needle: &str| s.lines().find(|l| l.contains(needle)).unwrap().to_string();
        let w0 = line("http://e0:1");
        assert!(
            w0.contains("per-rank") && w0.contains("75.0%") && w0.contains(" 11 "),
            "{w0}"
        );
        let r0 = line("rank 0");
        assert!(
            r0.contains("50.0%") && r0.contains(" 5 ") && r0.trim_end().ends_with("10"),
            "{r0}"
        );
        let r1 = line("rank 1");
        assert!(
            r1.contains("fallback") && r1.trim_end().ends_with("20"),
            "{r1}"
        );
        assert!(line("http://e1:1").contains("worker"));
        let rank_lines = s.lines().filter(|l| l.starts_with("  rank ")).count();
        assert_eq!(rank_lines, 2, "no rank lines for a worker without ranks");
    }
}
