//! `loadlink demo`: the whole system in one process. Simulated engines publish their load, two
//! routers sit in front of them — one pricing workers on engine-reported load, one on its own
//! in-flight count — and clients send streaming traffic through both, plus direct-to-engine
//! traffic that no router sees. A live table shows what the engine-load router believes; at the
//! end, time-to-first-token through each router is compared.

use anyhow::{Context, Result};
use clap::Args;
use loadlink_engine::{Engine, EngineConfig, ModelConfig};
use loadlink_router::{LoadSignal, Policy, RouterConfig, RouterHandle};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct DemoArgs {
    /// Number of simulated engines.
    #[arg(long, default_value_t = 3)]
    engines: usize,
    /// Seconds to run (Ctrl-C stops earlier).
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// Concurrent clients sending through the routers (half through each).
    #[arg(long, default_value_t = 24)]
    clients: usize,
    /// Concurrent clients talking directly to the first engine (load no router sees).
    #[arg(long, default_value_t = 20)]
    direct_clients: usize,
    /// Engine speed-up over real time.
    #[arg(long, default_value_t = 4.0)]
    time_scale: f64,
    /// Output tokens per request.
    #[arg(long, default_value_t = 120)]
    max_tokens: u64,
    /// Running-batch limit per engine (small, so queues form and load differences show).
    #[arg(long, default_value_t = 8)]
    max_running_requests: usize,
    /// Port of the engine-load router (its /workers and /metrics are live during the demo).
    #[arg(long, default_value_t = 30080)]
    router_port: u16,
}

#[derive(Default)]
struct Ttfts {
    engine: Vec<f64>,
    inflight: Vec<f64>,
    errors: u64,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// One streaming request; returns time to the first event.
async fn stream_once(c: &reqwest::Client, url: &str, max_tokens: u64) -> Result<f64> {
    let t0 = Instant::now();
    let mut resp = c
        .post(format!("{url}/v1/chat/completions"))
        .json(&serde_json::json!({"messages": [{"role": "user", "content": "Tell me about load balancing."}], "max_tokens": max_tokens, "stream": true}))
        .send()
        .await?
        .error_for_status()?;
    let first = resp.chunk().await?.context("empty stream")?;
    let ttft = t0.elapsed().as_secs_f64();
    let _ = first;
    while resp.chunk().await?.is_some() {}
    Ok(ttft)
}

pub fn run(a: DemoArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(demo(a))
}

async fn demo(a: DemoArgs) -> Result<()> {
    let mut engines = Vec::new();
    for _ in 0..a.engines.max(2) {
        let kv = loadlink_publish::free_port_block(2).map_err(anyhow::Error::msg)?;
        engines.push(
            Engine::start(EngineConfig {
                port: 0,
                time_scale: a.time_scale,
                kv_events_config: Some(format!(
                    r#"{{"publisher":"zmq","endpoint":"tcp://*:{kv}"}}"#
                )),
                model: ModelConfig {
                    max_running_requests: a.max_running_requests.max(1),
                    ..Default::default()
                },
                ..Default::default()
            })
            .await?,
        );
    }
    let urls: Vec<String> = engines.iter().map(Engine::url).collect();
    let mk = |signal, port| RouterConfig {
        port,
        worker_urls: urls.clone(),
        policy: Policy::PowerOfTwo,
        load_signal: signal,
        ..Default::default()
    };
    // Prefer the well-known port (so /workers is easy to find); take any if it is busy.
    let engine_router = match loadlink_router::start(mk(LoadSignal::Backlog, a.router_port)).await {
        Ok(r) => r,
        Err(_) => loadlink_router::start(mk(LoadSignal::Backlog, 0)).await?,
    };
    let inflight_router = loadlink_router::start(mk(LoadSignal::Inflight, 0)).await?;
    println!(
        "loadlink demo: {} engines, 2 routers, {} routed + {} direct clients, {:.0} s",
        engines.len(),
        a.clients,
        a.direct_clients,
        a.duration
    );
    println!(
        "  engine-load router   {}   (try {}/workers and /metrics)",
        engine_router.url(),
        engine_router.url()
    );
    println!("  in-flight router     {}", inflight_router.url());
    for (i, u) in urls.iter().enumerate() {
        println!(
            "  engine {i}             {u}{}",
            if i == 0 {
                "   <- also loaded by direct clients"
            } else {
                ""
            }
        );
    }
    println!();

    let stop = Arc::new(AtomicBool::new(false));
    let ttfts = Arc::new(Mutex::new(Ttfts::default()));
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for i in 0..a.clients + a.direct_clients {
        let (c, stop, ttfts) = (client.clone(), stop.clone(), ttfts.clone());
        let (target, kind) = if i >= a.clients {
            (urls[0].clone(), 2)
        } else if i % 2 == 0 {
            (engine_router.url(), 0)
        } else {
            (inflight_router.url(), 1)
        };
        let max_tokens = a.max_tokens;
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let r = stream_once(&c, &target, max_tokens).await;
                let mut t = ttfts.lock().unwrap_or_else(|p| p.into_inner());
                match (r, kind) {
                    (Ok(x), 0) => t.engine.push(x),
                    (Ok(x), 1) => t.inflight.push(x),
                    (Ok(_), _) => {}
                    (Err(_), _) => t.errors += 1,
                }
            }
        }));
    }

    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(a.duration.max(1.0));
    let mut ctrl_c = Box::pin(tokio::signal::ctrl_c());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = &mut ctrl_c => break,
        }
        print_table(&engine_router, started.elapsed().as_secs_f64());
        if Instant::now() >= deadline {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.abort();
    }
    let mut t = std::mem::take(&mut *ttfts.lock().unwrap_or_else(|p| p.into_inner()));
    println!("\nTime to first token through each router (same engines, same traffic mix):");
    println!(
        "  {:<22} {:>8} {:>10} {:>10}",
        "router", "requests", "p50 (s)", "p99 (s)"
    );
    for (name, v) in [
        ("engine backlog (P2C)", &mut t.engine),
        ("in-flight (P2C)", &mut t.inflight),
    ] {
        let n = v.len();
        println!(
            "  {:<22} {:>8} {:>10.3} {:>10.3}",
            name,
            n,
            pct(v, 0.5),
            pct(v, 0.99)
        );
    }
    if t.errors > 0 {
        println!("  ({} client errors)", t.errors);
    }
    println!(
        "The in-flight router cannot see the direct clients on engine 0; the engine-load router can."
    );
    engine_router.stop().await;
    inflight_router.stop().await;
    for e in engines {
        e.stop().await;
    }
    Ok(())
}

fn print_table(r: &RouterHandle, t: f64) {
    let ws = r.state.fleet.workers();
    let cfg = &r.state.cfg;
    let mut out = format!(
        "t={t:>5.1}s  {:<26} {:>7} {:>7} {:>6} {:>6} {:>9} {:>7}\n",
        "worker", "running", "waiting", "KV%", "load", "source", "age"
    );
    for w in ws.iter() {
        let l = w.load(cfg.load_signal, cfg.freshness_ms);
        let (run, wait, kv) = w.ranks.iter().fold((0, 0, 0.0f64), |acc, r| {
            (
                acc.0 + r.running.load(Ordering::Relaxed),
                acc.1 + r.waiting.load(Ordering::Relaxed),
                acc.2
                    .max(f64::from_bits(r.token_usage_bits.load(Ordering::Relaxed))),
            )
        });
        let age = if l.age_ms == u64::MAX {
            "-".to_string()
        } else {
            format!("{}ms", l.age_ms)
        };
        out.push_str(&format!(
            "          {:<26} {:>7} {:>7} {:>5.1}% {:>6} {:>9} {:>7}\n",
            w.url,
            run,
            wait,
            kv * 100.0,
            l.requests,
            l.source.as_str(),
            age
        ));
    }
    print!("{out}");
}
