//! The live experiment: real `loadlink engine` and `loadlink route` processes on loopback, driven
//! over HTTP by the same seeded workload as the simulation, with time compressed by the engines'
//! `--time-scale` (arrivals are sent at t / K, measured times are multiplied by K). Every process it
//! starts is stopped (SIGTERM, then SIGKILL after a bound) when the run ends (or fails).
//!
//! A run is: start the engines and wait until they answer; then per variant, flush the engines'
//! caches, start the routers and wait until each knows every engine, drive the traffic while
//! sampling queue imbalance, read the routers' decision counters, stop the routers, and wait for
//! the engines to drain.
//!
//! A variant is loadlink's router under any policy and load signal, or an external router started
//! from a command template, such as the real `sglang-router` (`live/variant.rs`,
//! `live/routers.rs`): the comparison with a peer is then measured on the same engines and the
//! same trace.

use crate::report::Row;
use crate::scenario::{Scenario, arrivals, saturation::burst_arrivals};
use crate::sim::Outcome;
use crate::workload::Arrival;
use loadlink_publish::free_port_block;
pub mod burst;
pub mod cache_series;
pub(crate) mod procs;
mod routers;
pub(crate) mod scrape;
mod traffic;
pub use traffic::AdapterField;
pub mod pd;
mod variant;

pub use pd::PdWorkers;
pub use variant::{ExternalRouter, LiveVariant, Slot};

use procs::{Procs, spawn};
use scrape::{fleet_cache_counters, metric};
use std::path::PathBuf;
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
    /// What to compare, in order ([`LiveVariant::defaults`]: the simulation's list).
    pub variants: Vec<LiveVariant>,
    /// How a request names its LoRA adapter (requests of a many-model trace only).
    pub adapter_field: traffic::AdapterField,
    /// A disaggregated fleet: this many prefill engines, the rest decode ([`pd`]); `None`: every
    /// engine serves whole requests.
    pub pd_prefill: Option<usize>,
    /// A burst on the trace ([`burst::live_burst`]); the load is then its base.
    pub burst: Option<crate::workload::burst::Burst>,
    /// How many times a client sends a request again after a 429 (after its `Retry-After`, as
    /// the OpenAI SDK does); 0: the first refusal is final, and ends a closed-loop session.
    pub client_retries: u32,
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

/// Started processes (killed on drop), their base URLs, and a PD fleet's sides.
struct Fleet {
    procs: Procs,
    urls: Vec<String>,
    pd: Option<PdWorkers>,
}

/// The engines, each answering `/health`.
async fn start_engines(cfg: &LiveConfig, client: &reqwest::Client) -> Result<Fleet, String> {
    let s = &cfg.scenario;
    let mut fleet = Fleet {
        procs: Procs(Vec::new()),
        urls: Vec::new(),
        pd: None,
    };
    let ranks = s.ranks.max(1);
    for e in 0..s.engines {
        let http = free_port_block(1)?;
        // The KV ports (one per rank), then the load range the engine derives after them.
        let kv = free_port_block(2 * ranks as u16)?;
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
                "--dp-size".into(),
                ranks.to_string(),
                "--kv-events-config".into(),
                format!(r#"{{"publisher":"zmq","endpoint":"tcp://*:{kv}"}}"#),
            ]
            .into_iter()
            .chain(engine_args(s, e))
            .chain(
                cfg.pd_prefill
                    .map_or_else(Vec::new, |p| pd::engine_args(e, p)),
            )
            .collect::<Vec<String>>(),
        )?);
        fleet.urls.push(format!("http://127.0.0.1:{http}"));
    }
    for u in &fleet.urls {
        wait_until("an engine to start", 30, || async {
            client.get(format!("{u}/health")).send().await.is_ok()
        })
        .await?;
    }
    if let Some(prefill) = cfg.pd_prefill {
        let mut sides = PdWorkers::default();
        for (e, u) in fleet.urls.iter().enumerate() {
            match e < prefill {
                true => sides
                    .prefill
                    .push((u.clone(), pd::bootstrap_port(client, u).await?)),
                false => sides.decode.push(u.clone()),
            }
        }
        fleet.pd = Some(sides);
    }
    Ok(fleet)
}

/// Engine `e`'s own flags: its model and adapters, in a fleet of several models.
fn engine_args(s: &Scenario, e: usize) -> Vec<String> {
    match s.workload {
        crate::scenario::Workload::Models => crate::scenario::models::engine_args(e),
        _ => Vec::new(),
    }
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

/// The run's fixed parts: the client, the engines, the trace and how requests are written.
struct Bench<'a> {
    cfg: &'a LiveConfig,
    client: reqwest::Client,
    engines: Vec<String>,
    arrivals: Vec<Arrival>,
    /// The engines' served model name, when requests must carry OpenAI's `model` and text
    /// `prompt` (the run has an external router; see [`traffic`]).
    openai_model: Option<String>,
    /// A PD fleet's sides.
    pd: Option<PdWorkers>,
}

/// One variant: routers up, traffic, counters, routers down, drain.
async fn run_variant(
    b: &Bench<'_>,
    variant: &LiveVariant,
    progress: &mut dyn FnMut(&str),
) -> Result<Row, String> {
    let (cfg, client, engines) = (b.cfg, &b.client, b.engines.as_slice());
    let label = variant.label();
    progress(&format!(
        "{label}: starting {} routers",
        cfg.scenario.routers
    ));
    // Every variant starts with cold caches: the same prompts were sent to these engines by the
    // variant before, and what they left cached would count as this variant's hits.
    flush_caches(client, engines).await?;
    let routers = routers::start(cfg, client, (engines, b.pd.as_ref()), variant).await?;
    // A PD fleet's decode engines compute no prompt: the hit rate counts the prefill engines.
    let prefilling =
        b.pd.as_ref()
            .map_or_else(|| engines.to_vec(), PdWorkers::prefill_urls);
    let cache_before = fleet_cache_counters(client, &prefilling).await;
    let loads_before = scrape::fleet_adapter_loads(client, engines).await;
    let sampler = QueueSampler::start(client.clone(), engines.to_vec());
    let start = Instant::now();
    let series = cache_before.map(|b| {
        let (c, e) = (client.clone(), prefilling.clone());
        cache_series::CacheSeries::start(c, e, (start, b), cfg.time_scale)
    });
    let fleets = (engines, routers.urls.as_slice(), b.pd.as_ref());
    let trace = (b.arrivals.as_slice(), b.openai_model.as_deref());
    let measured = traffic::drive(cfg, client, trace, fleets, progress, &label).await;
    let makespan = start.elapsed().as_secs_f64() * cfg.time_scale;
    let queue_cv = sampler.finish().await;
    let cache_series = match series {
        Some(s) => s.finish().await,
        None => Vec::new(),
    };
    // An external router has no loadlink decision counters; its rows say 0 of 0.
    let (decisions, fallback) = match variant {
        LiveVariant::Loadlink { .. } => decisions(client, &routers.urls, progress).await,
        LiveVariant::External(_) => (0, 0),
    };
    for note in routers.stop().await {
        progress(&note);
    }
    let mut outcome = Outcome {
        // `arrived` aligned with `ttft`, so a burst's figures window by arrival time.
        arrived: measured.done.iter().map(|r| r.arrived).collect(),
        ttft: measured.done.iter().map(|r| r.ttft).collect(),
        e2e: measured.done.iter().map(|r| r.e2e).collect(),
        ttft_floor: measured.done.iter().map(|r| r.floor).collect(),
        tpot: measured.done.iter().filter_map(|r| r.tpot).collect(),
        completed: measured.done.len(),
        submitted: b.arrivals.len(),
        makespan,
        queue_cv,
        decisions,
        // An in-flight router prices every decision on its fallback signal.
        fallback_decisions: match variant {
            LiveVariant::Loadlink { signal, .. } if signal == "inflight" => decisions,
            _ => fallback,
        },
        cache_tokens: None,
        cache_series,
        rejected: measured.refused,
        retried: measured.retried,
        abandoned: measured.abandoned,
        loaded_back_tokens: 0,
        adapter_loads: 0,
        adapter_requests: b
            .arrivals
            .iter()
            .filter(|a| a.model.as_ref().is_some_and(|m| m.adapter.is_some()))
            .count() as u64,
        ..Outcome::default()
    };
    // Let the engines drain before the next variant (the counters include every admission then).
    wait_drained(client, engines).await?;
    let cache_after = fleet_cache_counters(client, &prefilling).await;
    if let (Some(b), Some(a)) = (
        loads_before,
        scrape::fleet_adapter_loads(client, engines).await,
    ) {
        outcome.adapter_loads = (a - b).max(0.0) as u64;
    }
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

/// The first model an engine's `/v1/models` lists.
async fn served_model(client: &reqwest::Client, engine: &str) -> Result<String, String> {
    get_json(client, &format!("{engine}/v1/models"))
        .await
        .and_then(|v| v["data"][0]["id"].as_str().map(String::from))
        .ok_or_else(|| format!("{engine}/v1/models names no model"))
}

/// Runs every variant of `cfg.variants` live; returns one row per variant, in order.
pub async fn run_live(
    cfg: &LiveConfig,
    mut progress: impl FnMut(&str),
) -> Result<Vec<Row>, String> {
    if cfg.variants.is_empty() {
        return Err("no variants to run".into());
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .map_err(|e| e.to_string())?;
    let engines = start_engines(cfg, &client).await?;
    let scenario = Scenario {
        duration_s: cfg.duration_s,
        ..cfg.scenario.clone()
    };
    let openai_model = match cfg.variants.iter().any(LiveVariant::is_external) {
        true => {
            let first = engines.urls.first().ok_or("the scenario has no engines")?;
            Some(served_model(&client, first).await?)
        }
        false => None,
    };
    let bench = Bench {
        cfg,
        client,
        engines: engines.urls.clone(),
        arrivals: match &cfg.burst {
            Some(b) => burst_arrivals(&scenario, cfg.seed, b),
            None => arrivals(&scenario, cfg.seed, cfg.load),
        },
        openai_model,
        pd: engines.pd.clone(),
    };
    let mut rows = Vec::new();
    for variant in &cfg.variants {
        rows.push(run_variant(&bench, variant, &mut progress).await?);
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
