//! `bench live --burst` end to end on the real binary: the trace carries issue 24's burst, each
//! variant's recovery figures (p50 per 10 s window of arrivals, recovery time) are printed and
//! stored, a loadlink variant can carry extra `loadlink route` flags (`--fleet-pricing blind`), and
//! `--warmup` adds the figures after a cold start, its hit rate from the cache counters read
//! during the run.

use std::path::PathBuf;
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_loadlink");

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("loadlink-live-burst-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_burst_run_reports_each_variants_windows_and_recovery() {
    let out = out_dir("ok");
    // The shortest burst run (50 virtual s) of S3 at a low base, compressed 10×.
    let run = Command::new(EXE)
        .args(["bench", "live", "--scenario", "s3", "--duration", "50"])
        .args([
            "--load",
            "0.3",
            "--time-scale",
            "10",
            "--burst",
            "--warmup",
            "20",
            "--out",
        ])
        .arg(&out)
        .args(["--variant", "min_ttft/backlog --fleet-pricing blind"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("0.45 from 10 s for 30 s"), "{stdout}");
    let text = std::fs::read_to_string(out.join("s3-live-burst.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["burst"]["start_s"], 10.0);
    assert_eq!(doc["burst"]["len_s"], 30.0);
    assert_eq!(doc["burst"]["short"], true);
    let row = &doc["rows"][0];
    assert_eq!(row["variant"], "min_ttft / backlog --fleet-pricing blind");
    assert_eq!(row["completed"], row["submitted"], "{row}");
    let rec = doc["recovery"].as_array().unwrap();
    assert_eq!(rec.len(), 1);
    assert_eq!(rec[0]["label"], row["variant"]);
    // Arrivals run from 0 to under 50 s: five 10 s windows, each with requests in it at this
    // rate, so each has a p50; the pre-burst p50 is a real TTFT.
    let windows = rec[0]["window_p50_s"].as_array().unwrap();
    assert_eq!(windows.len(), 5, "{windows:?}");
    assert!(windows.iter().all(|w| w.as_f64().is_some_and(|x| x > 0.0)));
    assert!(rec[0]["before_p50_s"].as_f64().is_some_and(|x| x > 0.0));
    assert!(stdout.contains("recovery"), "{stdout}");
    // After the warm-up: fewer requests than the run, a hit rate from the counters read during
    // the run (every 5 virtual s), the whole run's figures beside them.
    let warm = &doc["after_warmup"][0];
    let (after, all) = (
        warm["requests"].as_u64().unwrap(),
        row["completed"].as_u64().unwrap(),
    );
    assert!(after > 0 && after < all, "{warm}");
    assert!(
        warm["hit"]
            .as_f64()
            .is_some_and(|h| (0.0..=1.0).contains(&h)),
        "{warm}"
    );
    assert_eq!(warm["hit_whole_run"], row["cache_hit_rate"], "{warm}");
    assert!(stdout.contains("after the first 20 virtual s"), "{stdout}");
}

#[test]
fn a_burst_that_does_not_fit_the_run_is_refused_before_anything_starts() {
    let out = out_dir("short");
    let run = Command::new(EXE)
        .args([
            "bench",
            "live",
            "--scenario",
            "s3",
            "--duration",
            "40",
            "--burst",
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("--duration 40") && stderr.contains("at least 50"),
        "{stderr}"
    );
}
