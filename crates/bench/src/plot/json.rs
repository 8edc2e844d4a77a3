//! `loadlink bench plot`: redraws the figures of a results JSON written by `bench sim` or
//! `bench live`, so a figure can be restyled without rerunning an experiment. Only what the JSON
//! holds can be drawn: the TTFT figure needs the raw samples (live runs record them), the sweep
//! figure needs a sweep; for anything else it says why it was not drawn.

use super::figure::with_suffix;
use super::{Curve, SweepPoint, p99_vs_load_points, sweep_title, ttft_cdf_samples, ttft_title};
use loadlink_engine::PublishPoint;
use serde_json::Value;
use std::io;
use std::path::{Path, PathBuf};

/// What a results JSON says about the figures' titles.
struct Heading<'a> {
    scenario: &'a str,
    point: &'a str,
    live: bool,
}

/// `loadlink bench plot`: redraws the plots of a results JSON beside it — the TTFT figure when its
/// rows carry `ttft_samples_s` (live runs record them), the sweep when it has one. Returns the
/// files written and, for what it could not draw, why.
pub fn from_json(json: &Path) -> io::Result<(Vec<PathBuf>, Vec<String>)> {
    let text = std::fs::read_to_string(json)?;
    let doc: Value = serde_json::from_str(&text).map_err(io::Error::other)?;
    let base = json.with_extension("");
    let heading = Heading {
        scenario: doc["scenario"].as_str().unwrap_or("?"),
        point: doc["publish_point"]
            .as_str()
            .unwrap_or(PublishPoint::default().as_str()),
        live: doc["mode"] == "live",
    };
    let (mut wrote, mut skipped) = (Vec::new(), Vec::new());
    let rows = doc["rows"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    match ttft_from_rows(&with_suffix(&base, "-ttft-cdf"), &heading, rows)? {
        Some(files) => wrote.extend(files),
        None => skipped.push(no_samples(json, heading.live)),
    }
    match doc["sweep"].as_array() {
        Some(sweep) if !sweep.is_empty() => {
            let stem = with_suffix(&base, "-p99-vs-load");
            wrote.extend(sweep_from_rows(&stem, &heading, sweep)?);
        }
        _ => skipped.push(format!("sweep plot: {} has no sweep", json.display())),
    }
    Ok((wrote, skipped))
}

/// The numbers of `r[key]`, if it is an array of numbers only.
fn samples(r: &Value, key: &str) -> Option<Vec<f64>> {
    r[key].as_array()?.iter().map(Value::as_f64).collect()
}

/// The TTFT figure of `rows` at `stem`, or `None` when some row has no samples (or none are).
fn ttft_from_rows(
    stem: &Path,
    heading: &Heading,
    rows: &[Value],
) -> io::Result<Option<[PathBuf; 2]>> {
    let with_samples: Option<Vec<(String, Vec<f64>)>> = rows
        .iter()
        .map(|r| {
            Some((
                r["variant"].as_str()?.to_string(),
                samples(r, "ttft_samples_s")?,
            ))
        })
        .collect();
    let Some(curves) = with_samples.filter(|c| !c.is_empty()) else {
        return Ok(None);
    };
    let floor = rows
        .first()
        .and_then(|r| samples(r, "ttft_floor_samples_s"))
        .unwrap_or_default();
    let curves: Vec<Curve> = curves
        .iter()
        .map(|(l, t)| Curve { label: l, ttft: t })
        .collect();
    let load = rows[0]["load"].as_f64().unwrap_or(f64::NAN);
    let title = ttft_title(heading.scenario, heading.live, heading.point, load);
    ttft_cdf_samples(stem, &title, &curves, &floor).map(Some)
}

/// Why the TTFT figure of `json` was not drawn.
fn no_samples(json: &Path, live: bool) -> String {
    format!(
        "TTFT plot: the rows of {} carry no ttft_samples_s ({})",
        json.display(),
        if live {
            "a live run from before they were recorded; only a rerun of `loadlink bench live` \
             has them"
        } else {
            "simulated results do not; `loadlink bench sim` redraws them, it is deterministic"
        }
    )
}

/// The sweep figure of the JSON's `sweep` rows at `stem`.
fn sweep_from_rows(stem: &Path, heading: &Heading, sweep: &[Value]) -> io::Result<[PathBuf; 2]> {
    let pts: Vec<SweepPoint> = sweep
        .iter()
        .map(|r| SweepPoint {
            label: r["variant"].as_str().unwrap_or("?"),
            load: r["load"].as_f64().unwrap_or(f64::NAN),
            p99: r["ttft_p99_s"].as_f64().unwrap_or(f64::NAN),
            floor_p99: r["ttft_floor_p99_s"].as_f64().unwrap_or(f64::NAN),
        })
        .collect();
    let title = sweep_title(heading.scenario, heading.point);
    p99_vs_load_points(stem, &title, &pts)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check_figure, rows};
    use super::*;
    use crate::report::{Row, json_text, row_json_with_samples};

    #[test]
    fn bench_plot_redraws_from_samples_and_sweeps_only() {
        let dir = tempfile::tempdir().unwrap();
        let r85 = rows(0.85);
        let live = serde_json::json!({ "scenario": "s9", "mode": "live", "publish_point": "batch-end", "rows": r85.iter().map(row_json_with_samples).collect::<Vec<_>>() });
        let json = dir.path().join("s9-live-batch-end.json");
        std::fs::write(&json, json_text(&live)).unwrap();
        let (wrote, skipped) = from_json(&json).unwrap();
        let name = |f: &str| dir.path().join(f);
        assert_eq!(
            wrote,
            vec![
                name("s9-live-batch-end-ttft-cdf.svg"),
                name("s9-live-batch-end-ttft-cdf.png")
            ]
        );
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        let svg = std::fs::read_to_string(&wrote[0]).unwrap();
        assert!(svg.contains(
            "S9 live: time to first token per request (load 0.85, publish point batch-end)"
        ));
        check_figure(&[wrote[0].clone(), wrote[1].clone()], "TTFT floor");

        // A simulated result: quantiles only, and a sweep.
        let sweep: Vec<Row> = [0.5, 0.9].into_iter().flat_map(rows).collect();
        let sim = serde_json::json!({ "scenario": "s9", "publish_point": "ingest", "rows": r85.iter().map(crate::report::row_json).collect::<Vec<_>>(), "sweep": sweep.iter().map(crate::report::row_json).collect::<Vec<_>>() });
        let json = name("s9.json");
        std::fs::write(&json, serde_json::to_string_pretty(&sim).unwrap()).unwrap();
        let (wrote, skipped) = from_json(&json).unwrap();
        assert_eq!(
            wrote,
            vec![name("s9-p99-vs-load.svg"), name("s9-p99-vs-load.png")]
        );
        assert!(skipped[0].contains("no ttft_samples_s"), "{skipped:?}");
        assert!(!name("s9-ttft-cdf.svg").exists());
    }
}
