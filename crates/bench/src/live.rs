//! The live experiment: real `loadlink engine` and `loadlink route` processes on loopback, driven
//! over HTTP by the same seeded workload as the simulation, with time compressed by the engines'
//! `--time-scale` (arrivals are sent at t / K, measured times are multiplied by K). Every process it
//! starts is killed when the run ends (or fails).
//!
//! A run is: start the engines and wait until they answer; then per variant, start the routers and
//! wait until each sees every engine's load, drive the traffic while sampling queue imbalance,
//! read the routers' decision counters, and wait for the engines to drain.

use crate::report::Row;
use crate::scenario::{Scenario, VARIANTS, arrivals};
use crate::sim::{DirectTarget, Outcome, isolated_ttft};
use crate::workload::Arrival;
use loadlink_publish::free_port_block;
use loadlink_router::LoadSignal;
use loadlink_router::Policy;
use loadlink_router::policy::mix;
pub(crate) mod scrape;

use scrape::{fleet_cache_counters, metric};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct LiveConfig {
    /// The `loadlink` executable to start engines and routers from.
    pub exe: PathBuf,
    pub scenario: Scenario,
    pub seed: u64,
    pub load: f64,
    pub time_scale: f64,
    /// Virtual seconds of arrivals per variant.
    pub duration_s: f64,
}

/// Child processes killed on drop.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(exe: &PathBuf, args: &[String]) -> Result<Child, String> {
    // stdout/stderr are discarded (not piped): an undrained pipe would stall the child.
    Command::new(exe)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", exe.display()))
}

async fn wait_until<F: FnMut() -> Fut, Fut: std::future::Future<Output = bool>>(
    what: &str,
    secs: u64,
    mut f: F,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("timed out waiting for {what}"))
}

async fn get_json(c: &reqwest::Client, url: &str) -> Option<serde_json::Value> {
    c.get(url).send().await.ok()?.json().await.ok()
}

/// Started processes (killed on drop) and their base URLs.
struct Fleet {
    procs: Procs,
    urls: Vec<String>,
}

/// The engines, each answering `/health`.
async fn start_engines(cfg: &LiveConfig, client: &reqwest::Client) -> Result<Fleet, String> {
    let s = &cfg.scenario;
    let mut fleet = Fleet {
        procs: Procs(Vec::new()),
        urls: Vec::new(),
    };
    for _ in 0..s.engines {
        let http = free_port_block(1)?;
        let kv = free_port_block(2)?;
        fleet.procs.0.push(spawn(
            &cfg.exe,
            &[
                "engine".into(),
                "--port".into(),
                http.to_string(),
                "--time-scale".into(),
                cfg.time_scale.to_string(),
                "--max-running-requests".into(),
                s.model.max_running_requests.to_string(),
                "--publish-point".into(),
                s.publish_point.as_str().into(),
                "--kv-events-config".into(),
                format!(r#"{{"publisher":"zmq","endpoint":"tcp://*:{kv}"}}"#),
            ],
        )?);
        fleet.urls.push(format!("http://127.0.0.1:{http}"));
    }
    for u in &fleet.urls {
        wait_until("an engine to start", 30, || async {
            client.get(format!("{u}/health")).send().await.is_ok()
        })
        .await?;
    }
    Ok(fleet)
}

/// The scenario's router replicas for one variant, each seeing every engine's load.
async fn start_routers(
    cfg: &LiveConfig,
    client: &reqwest::Client,
    engines: &[String],
    (policy, signal): (Policy, LoadSignal),
) -> Result<Fleet, String> {
    let mut fleet = Fleet {
        procs: Procs(Vec::new()),
        urls: Vec::new(),
    };
    for _ in 0..cfg.scenario.routers {
        let port = free_port_block(1)?;
        let mut args: Vec<String> = vec![
            "route".into(),
            "--port".into(),
            port.to_string(),
            "--policy".into(),
            policy.as_str().into(),
            "--load-signal".into(),
            signal.as_str().into(),
            "--worker-urls".into(),
        ];
        args.extend(engines.iter().cloned());
        fleet.procs.0.push(spawn(&cfg.exe, &args)?);
        fleet.urls.push(format!("http://127.0.0.1:{port}"));
    }
    for u in &fleet.urls {
        wait_until("a router to see every engine's load", 30, || async {
            get_json(client, &format!("{u}/workers"))
                .await
                .is_some_and(|v| {
                    v["workers"].as_array().is_some_and(|ws| {
                        ws.len() == engines.len()
                            && ws
                                .iter()
                                .all(|w| w["ranks"][0]["seq"].as_i64().is_some_and(|q| q >= 0))
                    })
                })
        })
        .await?;
    }
    Ok(fleet)
}

/// Every engine's `/v1/loads` rows (core section).
async fn engine_loads(c: &reqwest::Client, url: &str) -> Option<Vec<serde_json::Value>> {
    let v = get_json(c, &format!("{url}/v1/loads?include=core")).await?;
    v["loads"].as_array().cloned()
}

/// Samples the coefficient of variation of waiting requests across engines once a second until
/// stopped; [`QueueSampler::finish`] gives the mean.
struct QueueSampler {
    done: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<f64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl QueueSampler {
    fn start(c: reqwest::Client, urls: Vec<String>) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let samples: Arc<Mutex<Vec<f64>>> = Arc::default();
        let (d, out) = (done.clone(), samples.clone());
        let task = tokio::spawn(async move {
            while !d.load(Ordering::Relaxed) {
                let mut w = Vec::new();
                for u in &urls {
                    if let Some(l) = engine_loads(&c, u).await {
                        let waiting = l.iter().map(|x| x["num_waiting_reqs"].as_f64());
                        w.push(waiting.map(|x| x.unwrap_or(0.0)).sum());
                    }
                }
                out.lock().unwrap_or_else(|p| p.into_inner()).push(cv(&w));
                tokio::time::sleep(Duration::from_millis(1000)).await;
            }
        });
        QueueSampler {
            done,
            samples,
            task,
        }
    }

    async fn finish(self) -> f64 {
        self.done.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        let cvs = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        cvs.iter().sum::<f64>() / cvs.len().max(1) as f64
    }
}

/// Coefficient of variation (0 when the mean is 0).
fn cv(w: &[f64]) -> f64 {
    let m = w.iter().sum::<f64>() / w.len().max(1) as f64;
    if m > 0.0 {
        (w.iter().map(|x| (x - m).powi(2)).sum::<f64>() / w.len() as f64).sqrt() / m
    } else {
        0.0
    }
}

/// Per completed request: (TTFT, E2E, TTFT floor), in virtual seconds.
type Measured = Vec<(f64, f64, f64)>;

/// Where arrival `i` is sent: a router replica, or an engine for direct traffic.
fn target(s: &Scenario, i: usize, a: &Arrival, engines: &[String], routers: &[String]) -> String {
    if !a.direct {
        return routers[i % routers.len()].clone();
    }
    match s.direct {
        DirectTarget::Pinned => engines[0].clone(),
        DirectTarget::Uniform => {
            engines[(mix(i as u64 ^ 0xd1ec7) % engines.len() as u64) as usize].clone()
        }
    }
}

/// One streaming request at `at`; its (TTFT, E2E) in wall seconds when it streamed anything.
async fn send_one(
    c: reqwest::Client,
    at: Instant,
    url: String,
    body: serde_json::Value,
) -> Option<(f64, f64)> {
    tokio::time::sleep_until(at.into()).await;
    let t0 = Instant::now();
    let mut resp = c
        .post(format!("{url}/v1/completions"))
        .json(&body)
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let mut first = None;
    while let Ok(Some(_)) = resp.chunk().await {
        first.get_or_insert_with(|| t0.elapsed().as_secs_f64());
    }
    Some((first?, t0.elapsed().as_secs_f64()))
}

/// Sends every arrival at its (compressed) time and waits for all of them.
async fn drive_traffic(
    cfg: &LiveConfig,
    client: &reqwest::Client,
    arrivals: &[Arrival],
    (engines, routers): (&[String], &[String]),
    progress: &mut dyn FnMut(&str),
    label: &str,
) -> Measured {
    let (s, k) = (&cfg.scenario, cfg.time_scale);
    let start = Instant::now();
    let mut floors = std::collections::HashMap::new();
    let mut tasks = Vec::with_capacity(arrivals.len());
    for (i, a) in arrivals.iter().enumerate() {
        let at = start + Duration::from_secs_f64(a.t / k);
        let url = target(s, i, a, engines, routers);
        let floor = *floors
            .entry(a.prompt_tokens)
            .or_insert_with(|| isolated_ttft(s.model, a.prompt_tokens));
        let body = serde_json::json!({ "input_ids": a.prompt_ids(i), "max_tokens": a.output_tokens, "stream": true });
        let sent = send_one(client.clone(), at, url, body);
        tasks.push(tokio::spawn(async move {
            sent.await.map(|(ttft, e2e)| (ttft * k, e2e * k, floor))
        }));
    }
    let (n, mut measured) = (tasks.len(), Measured::new());
    for (j, t) in tasks.into_iter().enumerate() {
        measured.extend(t.await.ok().flatten());
        if j % 200 == 0 {
            progress(&format!("{label}: {j}/{n} requests done"));
        }
    }
    measured
}

/// Sums the routers' decision and fallback-decision counters (0 for a router that cannot be read).
async fn decisions(
    client: &reqwest::Client,
    routers: &[String],
    progress: &mut dyn FnMut(&str),
) -> (u64, u64) {
    let (mut decisions, mut fallback) = (0.0, 0.0);
    for u in routers {
        for (sum, name) in [
            (&mut decisions, "loadlink_router_decisions_total"),
            (&mut fallback, "loadlink_router_fallback_decisions_total"),
        ] {
            *sum += metric(client, u, name).await.unwrap_or_else(|e| {
                progress(&e);
                0.0
            });
        }
    }
    (decisions as u64, fallback as u64)
}

/// Empties every engine's prefix cache (`POST /flush_cache`; the engines are idle by then).
async fn flush_caches(client: &reqwest::Client, engines: &[String]) -> Result<(), String> {
    for u in engines {
        let r = client
            .post(format!("{u}/flush_cache"))
            .send()
            .await
            .map_err(|e| format!("{u}/flush_cache: {e}"))?;
        if !r.status().is_success() {
            return Err(format!("{u}/flush_cache: {}", r.status()));
        }
    }
    Ok(())
}

/// Waits until no engine has anything running or waiting.
async fn wait_drained(client: &reqwest::Client, engines: &[String]) -> Result<(), String> {
    for u in engines {
        wait_until("the engines to drain", 120, || async {
            engine_loads(client, u).await.is_some_and(|l| {
                l.iter()
                    .all(|x| x["num_running_reqs"] == 0 && x["num_waiting_reqs"] == 0)
            })
        })
        .await?;
    }
    Ok(())
}

/// One variant: routers up, traffic, counters, drain.
async fn run_variant(
    cfg: &LiveConfig,
    client: &reqwest::Client,
    engines: &[String],
    arrivals: &[Arrival],
    variant: (Policy, LoadSignal),
    progress: &mut dyn FnMut(&str),
) -> Result<Row, String> {
    let label = format!("{} / {}", variant.0.as_str(), variant.1.as_str());
    progress(&format!(
        "{label}: starting {} routers",
        cfg.scenario.routers
    ));
    // Every variant starts with cold caches: the same prompts were sent to these engines by the
    // variant before, and what they left cached would count as this variant's hits.
    flush_caches(client, engines).await?;
    let routers = start_routers(cfg, client, engines, variant).await?;
    let cache_before = fleet_cache_counters(client, engines).await;
    let sampler = QueueSampler::start(client.clone(), engines.to_vec());
    let start = Instant::now();
    let fleets = (engines, routers.urls.as_slice());
    let measured = drive_traffic(cfg, client, arrivals, fleets, progress, &label).await;
    let makespan = start.elapsed().as_secs_f64() * cfg.time_scale;
    let queue_cv = sampler.finish().await;
    let (decisions, fallback) = decisions(client, &routers.urls, progress).await;
    drop(routers);
    let mut outcome = Outcome {
        ttft: measured.iter().map(|r| r.0).collect(),
        e2e: measured.iter().map(|r| r.1).collect(),
        ttft_floor: measured.iter().map(|r| r.2).collect(),
        completed: measured.len(),
        submitted: arrivals.len(),
        makespan,
        queue_cv,
        decisions,
        // An in-flight router prices every decision on its fallback signal.
        fallback_decisions: if variant.1 != LoadSignal::Inflight {
            fallback
        } else {
            decisions
        },
        cache_tokens: None,
    };
    // Let the engines drain before the next variant (the counters include every admission then).
    wait_drained(client, engines).await?;
    let cache_after = fleet_cache_counters(client, engines).await;
    if let (Some(b), Some(a)) = (cache_before, cache_after) {
        let delta = |x: f64, y: f64| (x - y).max(0.0) as u64;
        outcome.cache_tokens = Some((delta(a.0, b.0), delta(a.1, b.1)));
    }
    Ok(Row {
        label,
        load: cfg.load,
        outcome,
    })
}

/// Runs every variant of the scenario live; returns one row per variant.
pub async fn run_live(
    cfg: &LiveConfig,
    mut progress: impl FnMut(&str),
) -> Result<Vec<Row>, String> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .map_err(|e| e.to_string())?;
    let engines = start_engines(cfg, &client).await?;
    let scenario = Scenario {
        duration_s: cfg.duration_s,
        ..cfg.scenario.clone()
    };
    let arrivals = arrivals(&scenario, cfg.seed, cfg.load);
    let mut rows = Vec::new();
    for variant in VARIANTS {
        let row = run_variant(
            cfg,
            &client,
            &engines.urls,
            &arrivals,
            variant,
            &mut progress,
        );
        rows.push(row.await?);
    }
    drop(engines.procs);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_decision_counters_are_read_from_a_real_router_page() {
        let router = loadlink_router::start(loadlink_router::RouterConfig {
            port: 0,
            ..Default::default()
        })
        .await
        .unwrap();
        let c = reqwest::Client::new();
        let url = router.url();
        assert_eq!(
            metric(&c, &url, "loadlink_router_decisions_total").await,
            Ok(0.0)
        );
        assert!(metric(&c, &url, "no_such_metric").await.is_err());
        let mut said = Vec::new();
        let mut progress = |m: &str| said.push(m.to_string());
        let got = decisions(&c, std::slice::from_ref(&url), &mut progress).await;
        assert_eq!(got, (0, 0));
        assert!(said.is_empty(), "{said:?}");
        router.stop().await;
    }

    #[test]
    fn cv_of_equal_queues_is_zero_and_grows_with_imbalance() {
        assert_eq!(cv(&[0.0, 0.0]), 0.0);
        assert_eq!(cv(&[3.0, 3.0, 3.0]), 0.0);
        assert!((cv(&[0.0, 2.0]) - 1.0).abs() < 1e-12);
    }
}
