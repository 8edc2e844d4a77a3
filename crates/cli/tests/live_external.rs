//! `bench live` with an external router, end to end on the real binary: `loadlink route` itself is
//! given as the external command template, so the path that starts, waits for, drives and stops a
//! foreign router (one per replica) runs without Python. The test lives in the CLI crate because
//! only its tests can start the `loadlink` binary the live runner spawns engines from.

use std::path::PathBuf;
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_loadlink");

/// A fresh output directory for one test.
fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("loadlink-live-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `bench live` on a few virtual seconds of S3 at low load, with these extra flags.
fn bench_live(out: &PathBuf, extra: &[&str]) -> std::process::Output {
    Command::new(EXE)
        .args(["bench", "live", "--scenario", "s3", "--duration", "4"])
        .args(["--load", "0.3", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn an_external_router_is_started_per_replica_driven_and_reported_beside_loadlink() {
    let out = out_dir("ok");
    let template = format!("self={EXE} route --port {{port}} --worker-urls {{workers}}");
    let run = bench_live(
        &out,
        &[
            "--variant",
            "round_robin/inflight",
            "--external-router",
            &template,
        ],
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("s3-live.json")).unwrap()).unwrap();
    let rows = doc["rows"].as_array().unwrap();
    let labels: Vec<&str> = rows
        .iter()
        .map(|r| r["variant"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["round_robin / inflight", "self"]);
    for r in rows {
        let submitted = r["submitted"].as_u64().unwrap();
        assert!(submitted > 0, "{r}");
        // Every request went through (routed ones via the external router's replicas).
        assert_eq!(r["completed"].as_u64(), Some(submitted), "{r}");
    }
    assert_eq!(doc["external_routers"][0]["variant"], "self");
    assert!(doc["load_average"]["start"].is_string() || doc["load_average"]["start"].is_null());
    assert!(
        stdout.lines().any(|l| l.starts_with("self ")),
        "the table has the external row: {stdout}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn an_external_router_that_dies_at_start_up_fails_the_run_with_its_output() {
    let out = out_dir("dies");
    let template = "dies=sh -c echo_then_exit {port} {workers}"
        .replace("echo_then_exit", "echo${IFS}no-such-flag;exit${IFS}3");
    let run = bench_live(&out, &["--external-router", &template]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(stderr.contains("dies exited at start-up"), "{stderr}");
    assert!(
        stderr.contains("no-such-flag"),
        "the log tail is shown: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_bad_template_is_refused_before_anything_starts() {
    let out = out_dir("bad");
    let run = bench_live(&out, &["--external-router", "x=r --port {prot} {workers}"]);
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("{port}"), "{stderr}");
    let _ = std::fs::remove_dir_all(&out);
}
