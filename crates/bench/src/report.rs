//! Reports: a table per policy × signal and JSON for machines; the plots for people are in
//! [`crate::plot`].

use crate::sim::{Outcome, QueueStats, quantile};
use serde_json::{Value, json};
use std::fmt::Write;

/// One row of a report.
pub struct Row {
    pub label: String,
    pub load: f64,
    pub outcome: Outcome,
}

pub fn row_json(r: &Row) -> Value {
    let o = &r.outcome;
    let mut j = json!({
        "variant": r.label,
        "load": r.load,
        "ttft_p50_s": quantile(&o.ttft, 0.5),
        "ttft_p90_s": quantile(&o.ttft, 0.9),
        "ttft_p99_s": quantile(&o.ttft, 0.99),
        "ttft_floor_p99_s": quantile(&o.ttft_floor, 0.99),
        "wait_p99_s": quantile(&o.waits(), 0.99),
        "e2e_p99_s": quantile(&o.e2e, 0.99),
        "throughput_rps": o.completed as f64 / o.makespan.max(1e-9),
        "completed": o.completed,
        "submitted": o.submitted,
        "queue_cv": o.queue_cv,
        "fallback_fraction": if o.decisions == 0 { 0.0 } else { o.fallback_decisions as f64 / o.decisions as f64 },
        "cache_hit_rate": o.cache_hit_rate(),
    });
    if o.rejected + o.retried + o.abandoned > 0 {
        // Admission refused some: what the clients did about it.
        j["refused"] = json!(o.rejected);
        j["retried"] = json!(o.retried);
        j["abandoned"] = json!(o.abandoned);
    }
    if !o.tpot.is_empty() {
        j["tpot_p50_s"] = json!(quantile(&o.tpot, 0.5));
        j["tpot_p99_s"] = json!(quantile(&o.tpot, 0.99));
    }
    if let Some(per_1k) = o.adapter_loads_per_1k() {
        j["adapter_loads"] = json!(o.adapter_loads);
        j["adapter_requests"] = json!(o.adapter_requests);
        j["adapter_loads_per_1k_requests"] = json!(per_1k);
    }
    j
}

/// [`row_json`] plus the raw per-request samples, so plots can be redrawn later
/// (`loadlink bench plot`): `ttft_samples_s` and `ttft_floor_samples_s`, same order (one entry per
/// completed request, in completion order), rounded to the microsecond.
pub fn row_json_with_samples(r: &Row) -> Value {
    let us = |v: &[f64]| -> Vec<f64> { v.iter().map(|x| (x * 1e6).round() / 1e6).collect() };
    let mut j = row_json(r);
    j["ttft_samples_s"] = json!(us(&r.outcome.ttft));
    j["ttft_floor_samples_s"] = json!(us(&r.outcome.ttft_floor));
    j
}

/// Pretty JSON, except that arrays of numbers stay on one line (sample arrays would otherwise take
/// a line per number).
pub fn json_text(doc: &Value) -> String {
    let pretty = serde_json::to_string_pretty(doc).unwrap_or_default();
    let lines: Vec<&str> = pretty.lines().collect();
    let mut out = String::with_capacity(pretty.len());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.ends_with('[') {
            // The numbers up to the closing bracket, if that is all there is.
            let end = (i + 1..lines.len()).find(|&k| lines[k].trim_start().starts_with(']'));
            if let Some(end) = end {
                let items: Vec<&str> = lines[i + 1..end]
                    .iter()
                    .map(|l| l.trim().trim_end_matches(','))
                    .collect();
                if !items.is_empty() && items.iter().all(|x| x.parse::<f64>().is_ok()) {
                    let _ = writeln!(out, "{line}{}{}", items.join(", "), lines[end].trim_start());
                    i = end + 1;
                    continue;
                }
            }
        }
        out.push_str(line);
        out.push('\n');
        i += 1;
    }
    out.pop();
    out
}

/// The cache hit rate column, when any row hit the cache (workloads of unique prompts never do,
/// so their tables keep their columns).
fn cache_column(rows: &[Row]) -> Option<Vec<String>> {
    let rates: Vec<Option<f64>> = rows.iter().map(|r| r.outcome.cache_hit_rate()).collect();
    rates.iter().any(|r| r.is_some_and(|x| x > 0.0)).then(|| {
        rates
            .iter()
            .map(|r| r.map_or_else(|| "?".to_string(), |x| format!("{:.1}%", x * 100.0)))
            .collect()
    })
}

/// The adapter loads per 1,000 requests column, when any row sent requests for an adapter.
fn adapter_column(rows: &[Row]) -> Option<Vec<String>> {
    let loads: Vec<Option<f64>> = rows
        .iter()
        .map(|r| r.outcome.adapter_loads_per_1k())
        .collect();
    loads.iter().any(Option::is_some).then(|| {
        loads
            .iter()
            .map(|l| l.map_or_else(|| "?".to_string(), |x| format!("{x:.1}")))
            .collect()
    })
}

pub fn table(rows: &[Row]) -> String {
    let cache = cache_column(rows);
    let adapters = adapter_column(rows);
    let mut s = format!(
        "{:<24} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9}",
        "variant",
        "load",
        "TTFT p50",
        "TTFT p90",
        "TTFT p99",
        "wait p99",
        "E2E p99",
        "req/s",
        "queue CV",
        "fallback"
    );
    if cache.is_some() {
        s.push_str(" cache hit");
    }
    if adapters.is_some() {
        s.push_str(" loads/1k");
    }
    s.push('\n');
    for (i, r) in rows.iter().enumerate() {
        let j = row_json(r);
        let f = |k: &str| j[k].as_f64().unwrap_or(f64::NAN);
        // The in-flight signal never uses engine load, so "fallback" says nothing there; nor
        // does it for a row without decision counters (an external router in a live run).
        let fallback = if r.label.ends_with("inflight") || r.outcome.decisions == 0 {
            "-".to_string()
        } else {
            format!("{:.1}%", f("fallback_fraction") * 100.0)
        };
        let _ = write!(
            s,
            "{:<24} {:>5.2} {:>8.3}s {:>8.3}s {:>8.3}s {:>8.3}s {:>8.2}s {:>8.2} {:>9.3} {:>9}",
            r.label,
            r.load,
            f("ttft_p50_s"),
            f("ttft_p90_s"),
            f("ttft_p99_s"),
            f("wait_p99_s"),
            f("e2e_p99_s"),
            f("throughput_rps"),
            f("queue_cv"),
            fallback
        );
        if let Some(c) = &cache {
            let _ = write!(s, " {:>9}", c[i]);
        }
        if let Some(a) = &adapters {
            let _ = write!(s, " {:>8}", a[i]);
        }
        s.push('\n');
    }
    if let Some(r) = rows.first() {
        let _ = writeln!(
            s,
            "TTFT floor p99 {:.3}s: the same requests alone on an idle engine (own prefill); \
             \"wait\" is TTFT minus that floor, the part routing can change.",
            quantile(&r.outcome.ttft_floor, 0.99)
        );
    }
    s
}

/// A row of the cache-aware comparison: a [`Row`] plus how unevenly the queues filled.
pub struct CacheRow {
    pub row: Row,
    pub queues: QueueStats,
}

/// The label of the bound every cache-aware row is compared with.
pub const CLAIRVOYANT: &str = "clairvoyant";

/// Wait p99 of the clairvoyant row, when there is one.
fn clairvoyant_wait_p99(rows: &[CacheRow]) -> Option<f64> {
    rows.iter()
        .find(|r| r.row.label == CLAIRVOYANT)
        .map(|r| quantile(&r.row.outcome.waits(), 0.99))
}

/// [`row_json`] plus the hot-queue figures and the wait p99 as a multiple of the clairvoyant's.
pub fn cache_rows_json(rows: &[CacheRow]) -> Vec<Value> {
    let bound = clairvoyant_wait_p99(rows);
    rows.iter()
        .map(|r| {
            let mut j = row_json(&r.row);
            j["queue_hot_fraction"] = json!(r.queues.hot_fraction);
            j["queue_hot_longest_s"] = json!(r.queues.hot_longest_s);
            j["wait_p99_vs_clairvoyant"] =
                json!(bound.map(|b| quantile(&r.row.outcome.waits(), 0.99) / b));
            j
        })
        .collect()
}

/// The cache-aware comparison as a table.
pub fn cache_table(rows: &[CacheRow]) -> String {
    let mut s = format!(
        "{:<24} {:>9} {:>9} {:>9} {:>8} {:>9} {:>8} {:>9} {:>8} {:>8}\n",
        "variant",
        "TTFT p50",
        "TTFT p99",
        "wait p99",
        "×clairv",
        "cache hit",
        "req/s",
        "queue CV",
        "hot q %",
        "hot q s"
    );
    for j in cache_rows_json(rows) {
        let f = |k: &str| j[k].as_f64().unwrap_or(f64::NAN);
        let _ = writeln!(
            s,
            "{:<24} {:>8.3}s {:>8.3}s {:>8.3}s {:>8.2} {:>8.1}% {:>8.2} {:>9.3} {:>7.1}% {:>7.0}s",
            j["variant"].as_str().unwrap_or("?"),
            f("ttft_p50_s"),
            f("ttft_p99_s"),
            f("wait_p99_s"),
            f("wait_p99_vs_clairvoyant"),
            f("cache_hit_rate") * 100.0,
            f("throughput_rps"),
            f("queue_cv"),
            f("queue_hot_fraction") * 100.0,
            f("queue_hot_longest_s"),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_text_keeps_number_arrays_on_one_line_and_the_same_value() {
        let doc = json!({
            "rows": [{ "variant": "a / b", "ttft_samples_s": [0.5, 1e-6, 2.25], "nested": [[1, 2], [3]] }],
            "names": ["x", "y"],
            "empty": [],
        });
        let text = json_text(&doc);
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), doc);
        assert!(
            text.contains(r#""ttft_samples_s": [0.5, 1e-6, 2.25]"#),
            "{text}"
        );
        assert!(text.contains("[1, 2],"), "{text}");
        // Arrays of strings and of objects stay one item per line, as to_string_pretty has them.
        assert!(text.contains("\"names\": [\n"), "{text}");
        assert!(text.contains("\"rows\": [\n"), "{text}");
        // Without number arrays it is exactly to_string_pretty.
        let plain = json!({ "rows": [{ "variant": "a", "ttft_p99_s": 0.5 }] });
        assert_eq!(
            json_text(&plain),
            serde_json::to_string_pretty(&plain).unwrap()
        );
    }

    #[test]
    fn the_cache_column_shows_only_when_something_hit() {
        let row = |cache_tokens| Row {
            label: "round_robin / inflight".into(),
            load: 0.85,
            outcome: Outcome {
                ttft: vec![0.1],
                cache_tokens,
                ..Outcome::default()
            },
        };
        let unique = table(&[row(Some((0, 500))), row(None)]);
        assert!(!unique.contains("cache hit"), "{unique}");
        let reused = table(&[row(Some((250, 1000))), row(None)]);
        let lines: Vec<&str> = reused.lines().collect();
        assert!(lines[0].ends_with(" cache hit"), "{reused}");
        assert!(lines[1].ends_with("     25.0%"), "{reused}");
        assert!(lines[2].ends_with("         ?"), "{reused}");
        assert_eq!(row_json(&row(Some((1, 4))))["cache_hit_rate"], 0.25);
        assert!(row_json(&row(None))["cache_hit_rate"].is_null());
    }

    #[test]
    fn samples_are_stored_per_request_to_the_microsecond() {
        let r = Row {
            label: "p / s".into(),
            load: 0.85,
            outcome: Outcome {
                ttft: vec![0.123_456_789, 2.0],
                ttft_floor: vec![0.1, 0.000_000_4],
                ..Outcome::default()
            },
        };
        let j = row_json_with_samples(&r);
        assert_eq!(j["ttft_samples_s"], json!([0.123457, 2.0]));
        assert_eq!(j["ttft_floor_samples_s"], json!([0.1, 0.0]));
        assert_eq!(j["variant"], "p / s");
        assert_eq!(j["ttft_p99_s"], row_json(&r)["ttft_p99_s"]);
    }
}
