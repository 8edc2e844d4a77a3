//! Load read over HTTP, for engines that publish no load socket: the `/v1/loads` JSON document
//! (PROTOCOL.md §7) and a Prometheus `/metrics` page with SGLang's or vLLM's scheduler gauges, each
//! turned into one [`LoadSnapshot`] per rank so a router can store it exactly as a pushed one.
//!
//! Pure: the caller fetches the body. Errors name what was missing, so a worker shown on
//! in-flight says why (`/v1/loads: loads[1]: missing "num_waiting_reqs"`).
//!
//! Tolerance is deliberate and one-sided. A `/v1/loads` rank may carry fields this version does
//! not know (a newer SGLang): they are ignored, while a known field of the wrong type is an error.
//! A real `/metrics` page holds hundreds of counters and histograms in `prometheus_client`'s
//! spelling (`_total`, `_created`); only the lines of the known gauges are kept, and those go
//! through the strict parser ([`crate::prom::parse`]).

use crate::loads::snapshot_from_dict;
use crate::prom::{Scrape, parse};
use crate::snapshot::{CORE_SCALARS, LoadSnapshot};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Why a polled body gave no load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolledError {
    #[error("/v1/loads: {0}")]
    Loads(String),
    #[error("/metrics: {0}")]
    Metrics(String),
    /// The page holds more scheduler-gauge samples than the caller's budget: refused before any
    /// of them is parsed.
    #[error("/metrics: {samples} or more scheduler-gauge samples, over the budget of {budget}")]
    OverBudget { samples: usize, budget: usize },
}

/// Fields a `/v1/loads` rank must carry to be priced.
const REQUIRED: [&str; 3] = ["dp_rank", "num_running_reqs", "num_waiting_reqs"];

/// The per-rank snapshots of a `/v1/loads` JSON body, sorted by `dp_rank`.
pub fn loads_from_json(body: &[u8]) -> Result<Vec<LoadSnapshot>, PolledError> {
    let err = |m: String| PolledError::Loads(m);
    let doc: Value = serde_json::from_slice(body).map_err(|e| err(format!("not JSON: {e}")))?;
    let loads = doc
        .get("loads")
        .ok_or_else(|| err("missing \"loads\"".into()))?
        .as_array()
        .ok_or_else(|| err("\"loads\": expected a list".into()))?;
    if loads.is_empty() {
        return Err(err("\"loads\" is empty".into()));
    }
    let mut snaps = loads
        .iter()
        .enumerate()
        .map(|(i, rank)| rank_from_json(rank).map_err(|m| err(format!("loads[{i}]: {m}"))))
        .collect::<Result<Vec<_>, _>>()?;
    snaps.sort_by_key(|s| s.dp_rank);
    Ok(snaps)
}

/// One rank: the known core scalars (strictly typed), unknown keys and sections ignored.
fn rank_from_json(v: &Value) -> Result<LoadSnapshot, String> {
    let obj = v.as_object().ok_or("expected a JSON object")?;
    if let Some(missing) = REQUIRED
        .iter()
        .find(|k| obj.get(**k).is_none_or(Value::is_null))
    {
        return Err(format!("missing {missing:?}"));
    }
    let core: Map<String, Value> = obj
        .iter()
        .filter(|(k, _)| CORE_SCALARS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let snap = snapshot_from_dict(&Value::Object(core))?;
    if snap.dp_rank < 0 {
        return Err(format!("dp_rank: expected >= 0, got {}", snap.dp_rank));
    }
    Ok(snap)
}

/// Whose gauge names a `/metrics` page uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsFlavor {
    /// `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`, … by `dp_rank`.
    Sglang,
    /// `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
    /// (before v0.10: `vllm:gpu_cache_usage_perc`), by `engine`.
    Vllm,
}

/// The gauges read per flavour.
struct Names {
    running: &'static str,
    waiting: &'static str,
    /// KV usage, 0–1: the current name, then an older one.
    usage: [&'static str; 2],
    used_tokens: Option<&'static str>,
    max_tokens: Option<&'static str>,
    rank_label: &'static str,
}

impl MetricsFlavor {
    pub fn as_str(self) -> &'static str {
        match self {
            MetricsFlavor::Sglang => "sglang",
            MetricsFlavor::Vllm => "vllm",
        }
    }

    fn names(self) -> Names {
        match self {
            MetricsFlavor::Sglang => Names {
                running: "sglang:num_running_reqs",
                waiting: "sglang:num_queue_reqs",
                usage: ["sglang:token_usage", "sglang:token_usage"],
                used_tokens: Some("sglang:num_used_tokens"),
                max_tokens: Some("sglang:max_total_num_tokens"),
                rank_label: "dp_rank",
            },
            MetricsFlavor::Vllm => Names {
                running: "vllm:num_requests_running",
                waiting: "vllm:num_requests_waiting",
                usage: ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
                used_tokens: None,
                max_tokens: None,
                rank_label: "engine",
            },
        }
    }

    fn gauges(self) -> Vec<&'static str> {
        let n = self.names();
        let mut v = vec![n.running, n.waiting, n.usage[0], n.usage[1]];
        v.extend(n.used_tokens);
        v.extend(n.max_tokens);
        v
    }
}

/// Keeps the `# HELP`/`# TYPE` and sample lines of `names` only, at most `max_samples` samples.
fn keep_gauges(text: &str, names: &[&str], max_samples: usize) -> Result<String, PolledError> {
    let metric = |line: &str| -> Option<bool> {
        let line = line.trim_start();
        let rest = match line.strip_prefix('#') {
            Some(c) => {
                let c = c.trim_start();
                c.strip_prefix("HELP ")
                    .or_else(|| c.strip_prefix("TYPE "))?
            }
            None => line,
        };
        let name = rest.split(|c: char| c == '{' || c.is_whitespace()).next()?;
        Some(names.contains(&name))
    };
    let mut out = String::new();
    let mut samples = 0usize;
    for line in text.lines().filter(|l| metric(l) == Some(true)) {
        if !line.trim_start().starts_with('#') {
            samples += 1;
            if samples > max_samples {
                return Err(PolledError::OverBudget {
                    samples,
                    budget: max_samples,
                });
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(out)
}

/// The flavour whose running-requests gauge has samples on the page, SGLang first.
fn detect(text: &str) -> Option<MetricsFlavor> {
    [MetricsFlavor::Sglang, MetricsFlavor::Vllm]
        .into_iter()
        .find(|f| {
            let running = f.names().running;
            text.lines().any(|l| {
                l.strip_prefix(running)
                    .is_some_and(|r| r.starts_with(['{', ' ']))
            })
        })
}

/// The per-rank load of a `/metrics` page, and whose names it used. Ranks are numbered by the
/// rank label (absent: rank 0); how several series of one rank combine is [`per_rank`]'s rule.
pub fn loads_from_metrics(text: &str) -> Result<(MetricsFlavor, Vec<LoadSnapshot>), PolledError> {
    loads_from_metrics_within(text, usize::MAX)
}

/// [`loads_from_metrics`], refusing a page with more than `max_samples` samples of the scheduler
/// gauges before it parses any: parsing costs memory in proportion to the samples, and a page of
/// a few MiB can hold a hundred thousand.
pub fn loads_from_metrics_within(
    text: &str,
    max_samples: usize,
) -> Result<(MetricsFlavor, Vec<LoadSnapshot>), PolledError> {
    let err = |m: String| PolledError::Metrics(m);
    let flavor = detect(text).ok_or_else(|| {
        err(
            "no scheduler gauge: expected sglang:num_running_reqs or vllm:num_requests_running"
                .into(),
        )
    })?;
    let kept = keep_gauges(text, &flavor.gauges(), max_samples)?;
    let page = parse(&kept).map_err(|e| err(e.to_string()))?;
    let n = flavor.names();
    let running = per_rank(&page, n.running, n.rank_label).map_err(err)?;
    let waiting = per_rank(&page, n.waiting, n.rank_label).map_err(err)?;
    let usage = match per_rank(&page, n.usage[0], n.rank_label).map_err(err)? {
        u if u.is_empty() => per_rank(&page, n.usage[1], n.rank_label).map_err(err)?,
        u => u,
    };
    let optional = |name: Option<&str>| match name {
        Some(name) => per_rank(&page, name, n.rank_label).map_err(err),
        None => Ok(Vec::new()),
    };
    let (used, max) = (optional(n.used_tokens)?, optional(n.max_tokens)?);
    // Each list is sorted by rank: a lookup is a binary search, so a page of many ranks stays
    // n log n.
    let at =
        |v: &[(i64, f64)], r: i64| v.binary_search_by_key(&r, |(k, _)| *k).ok().map(|i| v[i].1);
    running
        .iter()
        .map(|&(rank, run)| {
            let wait = at(&waiting, rank)
                .ok_or_else(|| err(format!("missing {} for rank {rank}", n.waiting)))?;
            Ok(LoadSnapshot {
                dp_rank: rank,
                num_running_reqs: gauge_count(run),
                num_waiting_reqs: gauge_count(wait),
                token_usage: at(&usage, rank).filter(|u| u.is_finite()),
                num_used_tokens: at(&used, rank).map_or(0, gauge_count),
                max_total_num_tokens: at(&max, rank).map_or(0, gauge_count),
                ..LoadSnapshot::default()
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(|snaps| (flavor, snaps))
}

/// A gauge read as a count: non-finite or negative is 0.
fn gauge_count(v: f64) -> i64 {
    if v.is_finite() && v > 0.0 {
        v.round().min(i64::MAX as f64) as i64
    } else {
        0
    }
}

/// Labels that name a replica of one scheduler's numbers (its tensor, pipeline or expert-parallel
/// ranks all report the same gauges): their series are one reading, not several to add.
const REPLICA_LABELS: [&str; 3] = ["tp_rank", "pp_rank", "moe_ep_rank"];

/// A series' labels other than its rank and replica labels, sorted.
type SeriesKey<'a> = Vec<(&'a str, &'a str)>;

/// `(rank, value)` per distinct rank label of `name`, sorted by rank. Within a rank, series that
/// differ only in [`REPLICA_LABELS`] give their maximum; series that differ otherwise (a
/// `priority` label, say) are added.
fn per_rank(page: &Scrape, name: &str, rank_label: &str) -> Result<Vec<(i64, f64)>, String> {
    // Ordered maps: one lookup per sample (linear-logarithmic in the page), and a sum order that
    // does not depend on hashing.
    let mut groups: BTreeMap<(i64, SeriesKey<'_>), f64> = BTreeMap::new();
    for s in page.samples(name) {
        let rank = match s.label(rank_label) {
            None => 0,
            Some(r) => r
                .parse::<i64>()
                .ok()
                .filter(|r| *r >= 0)
                .ok_or_else(|| format!("{name}: label {rank_label}={r:?} is not a rank"))?,
        };
        let mut key: SeriesKey<'_> = s
            .labels
            .iter()
            .filter(|(k, _)| k != rank_label && !REPLICA_LABELS.contains(&k.as_str()))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        key.sort_unstable();
        groups
            .entry((rank, key))
            .and_modify(|v| *v = v.max(s.value))
            .or_insert(s.value);
    }
    let mut out: Vec<(i64, f64)> = Vec::new();
    for ((rank, _), v) in groups {
        match out.last_mut() {
            Some((r, sum)) if *r == rank => *sum += v,
            _ => out.push((rank, v)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
