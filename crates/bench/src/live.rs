//! The live experiment: real `loadlink engine` and `loadlink route` processes on loopback, driven
//! over HTTP by the same seeded workload as the simulation, with time compressed by the engines'
//! `--time-scale` (arrivals are sent at t / K, measured times are multiplied by K). Every process it
//! starts is killed when the run ends (or fails).

use crate::report::Row;
use crate::scenario::{Scenario, VARIANTS, workload_spec};
use crate::sim::{DirectTarget, Outcome, isolated_ttft};
use crate::workload::generate;
use loadlink_publish::free_port_block;
use loadlink_router::LoadSignal;
use loadlink_router::policy::mix;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
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

async fn metric(c: &reqwest::Client, url: &str, name: &str) -> f64 {
    let text = match c.get(format!("{url}/metrics")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => return 0.0,
    };
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// Runs every variant of the scenario live; returns one row per variant.
pub async fn run_live(
    cfg: &LiveConfig,
    mut progress: impl FnMut(&str),
) -> Result<Vec<Row>, String> {
    let s = &cfg.scenario;
    let k = cfg.time_scale;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .map_err(|e| e.to_string())?;
    let mut engines = Procs(Vec::new());
    let mut engine_urls = Vec::new();
    for _ in 0..s.engines {
        let http = free_port_block(1)?;
        let kv = free_port_block(2)?;
        engines.0.push(spawn(
            &cfg.exe,
            &[
                "engine".into(),
                "--port".into(),
                http.to_string(),
                "--time-scale".into(),
                k.to_string(),
                "--max-running-requests".into(),
                s.model.max_running_requests.to_string(),
                "--publish-point".into(),
                s.publish_point.as_str().into(),
                "--kv-events-config".into(),
                format!(r#"{{"publisher":"zmq","endpoint":"tcp://*:{kv}"}}"#),
            ],
        )?);
        engine_urls.push(format!("http://127.0.0.1:{http}"));
    }
    for u in &engine_urls {
        wait_until("an engine to start", 30, || async {
            client.get(format!("{u}/health")).send().await.is_ok()
        })
        .await?;
    }
    let mut spec = workload_spec(s, cfg.seed, cfg.load);
    spec.duration_s = cfg.duration_s;
    let arrivals = generate(&spec);
    let mut rows = Vec::new();
    for &(policy, signal) in &VARIANTS {
        let label = format!("{} / {}", policy.as_str(), signal.as_str());
        progress(&format!("{label}: starting {} routers", s.routers));
        let mut routers = Procs(Vec::new());
        let mut router_urls = Vec::new();
        for _ in 0..s.routers {
            let port = free_port_block(1)?;
            let mut args = vec![
                "route".to_string(),
                "--port".into(),
                port.to_string(),
                "--policy".into(),
                policy.as_str().into(),
            ];
            args.extend([
                "--load-signal".into(),
                signal.as_str().into(),
                "--worker-urls".into(),
            ]);
            args.extend(engine_urls.iter().cloned());
            routers.0.push(spawn(&cfg.exe, &args)?);
            router_urls.push(format!("http://127.0.0.1:{port}"));
        }
        for u in &router_urls {
            wait_until("a router to see every engine's load", 30, || async {
                get_json(&client, &format!("{u}/workers"))
                    .await
                    .is_some_and(|v| {
                        v["workers"].as_array().is_some_and(|ws| {
                            ws.len() == engine_urls.len()
                                && ws
                                    .iter()
                                    .all(|w| w["ranks"][0]["seq"].as_i64().is_some_and(|q| q >= 0))
                        })
                    })
            })
            .await?;
        }
        let samples: Arc<Mutex<Vec<f64>>> = Arc::default();
        let results: Arc<Mutex<Vec<(f64, f64, f64)>>> = Arc::default();
        let start = Instant::now();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let (c, urls, samples, done) = (
                client.clone(),
                engine_urls.clone(),
                samples.clone(),
                done.clone(),
            );
            tokio::spawn(async move {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut w = Vec::new();
                    for u in &urls {
                        if let Some(v) = get_json(&c, &format!("{u}/v1/loads?include=core")).await {
                            w.push(v["loads"].as_array().map_or(0.0, |l| {
                                l.iter()
                                    .map(|x| x["num_waiting_reqs"].as_f64().unwrap_or(0.0))
                                    .sum()
                            }));
                        }
                    }
                    let m = w.iter().sum::<f64>() / w.len().max(1) as f64;
                    let cv = if m > 0.0 {
                        (w.iter().map(|x| (x - m).powi(2)).sum::<f64>() / w.len() as f64).sqrt() / m
                    } else {
                        0.0
                    };
                    samples.lock().unwrap_or_else(|p| p.into_inner()).push(cv);
                    tokio::time::sleep(Duration::from_millis(1000)).await;
                }
            })
        };
        let mut tasks = Vec::with_capacity(arrivals.len());
        let mut floors = std::collections::HashMap::new();
        for (i, a) in arrivals.iter().enumerate() {
            let at = start + Duration::from_secs_f64(a.t / k);
            let target = if a.direct {
                match s.direct {
                    DirectTarget::Pinned => engine_urls[0].clone(),
                    DirectTarget::Uniform => engine_urls
                        [(mix(i as u64 ^ 0xd1ec7) % engine_urls.len() as u64) as usize]
                        .clone(),
                }
            } else {
                router_urls[i % router_urls.len()].clone()
            };
            let (c, results) = (client.clone(), results.clone());
            let floor = *floors
                .entry(a.prompt_tokens)
                .or_insert_with(|| isolated_ttft(s.model, a.prompt_tokens));
            let body = serde_json::json!({ "input_ids": vec![1u32; a.prompt_tokens as usize], "max_tokens": a.output_tokens, "stream": true });
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(at.into()).await;
                let t0 = Instant::now();
                let Ok(mut resp) = c
                    .post(format!("{target}/v1/completions"))
                    .json(&body)
                    .send()
                    .await
                else {
                    return;
                };
                if !resp.status().is_success() {
                    return;
                }
                let mut first = None;
                while let Ok(Some(_)) = resp.chunk().await {
                    first.get_or_insert_with(|| t0.elapsed().as_secs_f64());
                }
                if let Some(f) = first {
                    results.lock().unwrap_or_else(|p| p.into_inner()).push((
                        f * k,
                        t0.elapsed().as_secs_f64() * k,
                        floor,
                    ));
                }
            }));
        }
        let n = tasks.len();
        for (j, t) in tasks.into_iter().enumerate() {
            let _ = t.await;
            if j % 200 == 0 {
                progress(&format!("{label}: {j}/{n} requests done"));
            }
        }
        let makespan = start.elapsed().as_secs_f64() * k;
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = sampler.await;
        let (mut decisions, mut fallback) = (0.0, 0.0);
        for u in &router_urls {
            decisions += metric(&client, u, "loadlink_router_decisions_total").await;
            fallback += metric(&client, u, "loadlink_router_fallback_decisions_total").await;
        }
        drop(routers);
        let res = std::mem::take(&mut *results.lock().unwrap_or_else(|p| p.into_inner()));
        let cvs = samples.lock().unwrap_or_else(|p| p.into_inner()).clone();
        rows.push(Row {
            label,
            load: cfg.load,
            outcome: Outcome {
                ttft: res.iter().map(|r| r.0).collect(),
                e2e: res.iter().map(|r| r.1).collect(),
                ttft_floor: res.iter().map(|r| r.2).collect(),
                completed: res.len(),
                submitted: n,
                makespan,
                queue_cv: cvs.iter().sum::<f64>() / cvs.len().max(1) as f64,
                decisions: decisions as u64,
                fallback_decisions: if signal != LoadSignal::Inflight {
                    fallback as u64
                } else {
                    decisions as u64
                },
            },
        });
        // Let the engines drain before the next variant.
        for u in &engine_urls {
            wait_until("the engines to drain", 120, || async {
                get_json(&client, &format!("{u}/v1/loads?include=core"))
                    .await
                    .is_some_and(|v| {
                        v["loads"].as_array().is_some_and(|l| {
                            l.iter()
                                .all(|x| x["num_running_reqs"] == 0 && x["num_waiting_reqs"] == 0)
                        })
                    })
            })
            .await?;
        }
    }
    drop(engines);
    Ok(rows)
}
