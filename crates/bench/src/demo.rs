//! `loadlink demo`: the whole system in one process. Simulated engines publish their load, two
//! routers sit in front of them — one pricing workers on engine-reported load, one on its own
//! in-flight count — and clients send streaming traffic through both, plus direct-to-engine
//! traffic that no router sees. A live table shows what the engine-load router believes; at the
//! end, time-to-first-token through each router is compared.
//!
//! The run is: start the fleet, announce it, start the clients, watch (one table a second until the
//! duration or Ctrl-C), stop the clients, report, stop the fleet. Output goes line by line to the
//! caller's `out`.

use crate::demo_traffic::{Conversation, DemoWorkload};
use crate::sim::quantile;
use loadlink_engine::{Engine, EngineConfig, ModelConfig};
use loadlink_router::{LoadSignal, Policy, RouterConfig, RouterHandle};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What `loadlink demo` runs.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Simulated engines (at least 2).
    pub engines: usize,
    /// Seconds to run (Ctrl-C stops earlier).
    pub duration_s: f64,
    /// Concurrent clients sending through the routers (half through each).
    pub clients: usize,
    /// Concurrent clients talking directly to the first engine (load no router sees).
    pub direct_clients: usize,
    /// Engine speed-up over real time.
    pub time_scale: f64,
    /// Output tokens per request.
    pub max_tokens: u64,
    /// Running-batch limit per engine.
    pub max_running_requests: usize,
    /// Preferred port of the engine-load router (any free port when it is taken).
    pub router_port: u16,
    /// What the clients send.
    pub workload: DemoWorkload,
}

/// The engines and the two routers in front of them.
struct Fleet {
    engines: Vec<Engine>,
    urls: Vec<String>,
    engine_router: RouterHandle,
    inflight_router: RouterHandle,
}

impl Fleet {
    async fn start(cfg: &DemoConfig) -> Result<Fleet, String> {
        let mut engines = Vec::new();
        for _ in 0..cfg.engines.max(2) {
            let kv = loadlink_publish::free_port_block(2)?;
            let engine = Engine::start(EngineConfig {
                port: 0,
                time_scale: cfg.time_scale,
                kv_events_config: Some(format!(
                    r#"{{"publisher":"zmq","endpoint":"tcp://*:{kv}"}}"#
                )),
                model: ModelConfig {
                    max_running_requests: cfg.max_running_requests.max(1),
                    ..Default::default()
                },
                ..Default::default()
            });
            engines.push(engine.await.map_err(|e| e.to_string())?);
        }
        let urls: Vec<String> = engines.iter().map(Engine::url).collect();
        // loadlink's default router (min_ttft on engine backlog and KV events) against the
        // classic one (power of two on its own in-flight count).
        let mk = |policy, signal, port| RouterConfig {
            port,
            worker_urls: urls.clone(),
            policy,
            load_signal: signal,
            ..Default::default()
        };
        let ours = RouterConfig::default();
        let (p, s) = (ours.policy, ours.load_signal);
        // Prefer the well-known port (so /workers is easy to find); take any if it is busy.
        let engine_router = match loadlink_router::start(mk(p, s, cfg.router_port)).await {
            Ok(r) => r,
            Err(_) => loadlink_router::start(mk(p, s, 0))
                .await
                .map_err(|e| e.to_string())?,
        };
        let inflight_router =
            loadlink_router::start(mk(Policy::PowerOfTwo, LoadSignal::Inflight, 0))
                .await
                .map_err(|e| e.to_string())?;
        Ok(Fleet {
            engines,
            urls,
            engine_router,
            inflight_router,
        })
    }

    fn announce(&self, cfg: &DemoConfig, out: &mut dyn FnMut(&str)) {
        out(&format!(
            "loadlink demo: {} engines, 2 routers, {} routed + {} direct clients, {:.0} s",
            self.engines.len(),
            cfg.clients,
            cfg.direct_clients,
            cfg.duration_s
        ));
        let url = self.engine_router.url();
        out(&format!(
            "  engine-load router   {url}   (try {url}/workers and /metrics)"
        ));
        out(&format!(
            "  in-flight router     {}",
            self.inflight_router.url()
        ));
        for (i, u) in self.urls.iter().enumerate() {
            let note = if i == 0 {
                "   <- also loaded by direct clients"
            } else {
                ""
            };
            out(&format!("  engine {i}             {u}{note}"));
        }
        out("");
    }

    async fn stop(self) {
        self.engine_router.stop().await;
        self.inflight_router.stop().await;
        for e in self.engines {
            e.stop().await;
        }
    }
}

/// Time to first token per client kind.
#[derive(Default)]
struct Ttfts {
    engine: Vec<f64>,
    inflight: Vec<f64>,
    errors: u64,
}

/// Where a client sends its requests.
#[derive(Clone, Copy)]
enum ClientKind {
    EngineRouter,
    InflightRouter,
    Direct,
}

/// One streaming request; returns time to the first event.
async fn stream_once(
    c: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> Result<f64, String> {
    let t0 = Instant::now();
    let send = c
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send();
    let mut resp = send
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| e.to_string())?;
    let first = resp.chunk().await.map_err(|e| e.to_string())?;
    first.ok_or("empty stream")?;
    let ttft = t0.elapsed().as_secs_f64();
    while resp.chunk().await.map_err(|e| e.to_string())?.is_some() {}
    Ok(ttft)
}

/// The client tasks, looping until stopped.
struct Clients {
    stop: Arc<AtomicBool>,
    ttfts: Arc<Mutex<Ttfts>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Clients {
    fn start(cfg: &DemoConfig, fleet: &Fleet) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let ttfts = Arc::new(Mutex::new(Ttfts::default()));
        let client = reqwest::Client::new();
        let mut tasks = Vec::new();
        for i in 0..cfg.clients + cfg.direct_clients {
            let (c, stop, ttfts) = (client.clone(), stop.clone(), ttfts.clone());
            let (target, kind) = if i >= cfg.clients {
                (fleet.urls[0].clone(), ClientKind::Direct)
            } else if i % 2 == 0 {
                (fleet.engine_router.url(), ClientKind::EngineRouter)
            } else {
                (fleet.inflight_router.url(), ClientKind::InflightRouter)
            };
            let max_tokens = cfg.max_tokens;
            let mut talk = Conversation::new(cfg.workload, i);
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let r = stream_once(&c, &target, &talk.next_body(max_tokens)).await;
                    talk.answered(max_tokens);
                    let mut t = ttfts.lock().unwrap_or_else(|p| p.into_inner());
                    match (r, kind) {
                        (Ok(x), ClientKind::EngineRouter) => t.engine.push(x),
                        (Ok(x), ClientKind::InflightRouter) => t.inflight.push(x),
                        (Ok(_), ClientKind::Direct) => {}
                        (Err(_), _) => t.errors += 1,
                    }
                }
            }));
        }
        Clients { stop, ttfts, tasks }
    }

    fn stop(self) -> Ttfts {
        self.stop.store(true, Ordering::Relaxed);
        self.tasks.iter().for_each(|t| t.abort());
        std::mem::take(&mut *self.ttfts.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Prints the engine-load router's view once a second until `duration_s` or Ctrl-C.
async fn watch(r: &RouterHandle, duration_s: f64, out: &mut dyn FnMut(&str)) {
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(duration_s.max(1.0));
    let mut ctrl_c = Box::pin(tokio::signal::ctrl_c());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = &mut ctrl_c => break,
        }
        out(&table(r, started.elapsed().as_secs_f64()));
        if Instant::now() >= deadline {
            break;
        }
    }
}

/// What the router believes about each worker, at `t` seconds into the demo.
fn table(r: &RouterHandle, t: f64) -> String {
    let cfg = &r.state.cfg;
    let mut out = format!(
        "t={t:>5.1}s  {:<26} {:>7} {:>7} {:>6} {:>6} {:>9} {:>7}",
        "worker", "running", "waiting", "KV%", "load", "source", "age"
    );
    for w in r.state.fleet.workers().iter() {
        let l = w.load(cfg.load_signal, cfg.freshness_ms);
        let (run, wait, kv) = w.ranks.iter().fold((0, 0, 0.0f64), |acc, r| {
            let usage = f64::from_bits(r.token_usage_bits.load(Ordering::Relaxed));
            (
                acc.0 + r.running.load(Ordering::Relaxed),
                acc.1 + r.waiting.load(Ordering::Relaxed),
                acc.2.max(usage),
            )
        });
        let age = if l.age_ms == u64::MAX {
            "-".to_string()
        } else {
            format!("{}ms", l.age_ms)
        };
        out.push_str(&format!(
            "\n          {:<26} {:>7} {:>7} {:>5.1}% {:>6} {:>9} {:>7}",
            w.url,
            run,
            wait,
            kv * 100.0,
            l.requests,
            l.source.as_str(),
            age
        ));
    }
    out
}

fn report(mut t: Ttfts, out: &mut dyn FnMut(&str)) {
    out("\nTime to first token through each router (same engines, same traffic mix):");
    out(&format!(
        "  {:<22} {:>8} {:>10} {:>10}",
        "router", "requests", "p50 (s)", "p99 (s)"
    ));
    for (name, v) in [
        ("loadlink (min_ttft)", &mut t.engine),
        ("in-flight (P2C)", &mut t.inflight),
    ] {
        let (p50, p99) = (quantile(v, 0.5), quantile(v, 0.99));
        out(&format!(
            "  {name:<22} {:>8} {p50:>10.3} {p99:>10.3}",
            v.len()
        ));
    }
    if t.errors > 0 {
        out(&format!("  ({} client errors)", t.errors));
    }
    out("The in-flight router cannot see the direct clients on engine 0; loadlink's router can.");
}

/// Prefix-cache figures of a chat run: what the engines reused (both routers' traffic and the
/// direct clients'), and what loadlink's router believed it routed for.
async fn cache_report(fleet: &Fleet, out: &mut dyn FnMut(&str)) {
    let c = reqwest::Client::new();
    let (hit, prompt) = crate::live::scrape::fleet_cache_counters(&c, &fleet.urls)
        .await
        .unwrap_or((0.0, 0.0));
    let (mut cached, mut routed) = (0u64, 0u64);
    for w in fleet.engine_router.state.fleet.workers().iter() {
        cached += w.routed_cached_tokens.load(Ordering::Relaxed);
        routed += w.routed_prompt_tokens.load(Ordering::Relaxed);
    }
    out(&format!(
        "Prefix cache: engines reused {:.0}% of all prompt tokens; loadlink's router sent its \
         requests where {:.0}% of their tokens were cached.",
        100.0 * hit / prompt.max(1.0),
        100.0 * cached as f64 / routed.max(1) as f64
    ));
}

/// Runs the demo; every line of output goes to `out`.
pub async fn run_demo(cfg: &DemoConfig, mut out: impl FnMut(&str)) -> Result<(), String> {
    let fleet = Fleet::start(cfg).await?;
    fleet.announce(cfg, &mut out);
    let clients = Clients::start(cfg, &fleet);
    watch(&fleet.engine_router, cfg.duration_s, &mut out).await;
    report(clients.stop(), &mut out);
    if cfg.workload == DemoWorkload::Chat {
        cache_report(&fleet, &mut out).await;
    }
    fleet.stop().await;
    Ok(())
}
