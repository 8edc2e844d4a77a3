//! `loadlink publish`: a real publisher (the same factory and `Publisher` an engine embeds) fed by a
//! synthetic load that changes over time, one thread per rank.

use anyhow::Result;
use clap::Args;
use loadlink_publish::{EngineSettings, InternalSink, Publisher, build_sinks};
use loadlink_wire::{Generation, LoadSnapshot};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Args)]
pub struct PublishArgs {
    /// SGLang-style KV-events config JSON; the load range derives from its endpoint.
    #[arg(
        long,
        default_value = r#"{"publisher":"zmq","endpoint":"tcp://*:5557"}"#
    )]
    kv_events_config: String,
    /// off | auto | tcp://*:PORT. Unset: generation A is on (auto), generation B is off.
    #[arg(long)]
    load_publish_endpoint: Option<String>,
    /// Wire generation: snapshot (A, full map on the empty topic) or loadstat (B, SGLang 0.5.23).
    #[arg(long, default_value = "snapshot", value_parser = Generation::parse)]
    generation: Generation,
    /// Number of DP ranks (one publisher thread each).
    #[arg(long, default_value_t = 1)]
    dp_size: u32,
    /// Scheduler cycles per second to simulate.
    #[arg(long, default_value_t = 100.0)]
    cycle_hz: f64,
    /// Publish every N cycles (per sink; force publishes ignore it).
    #[arg(long, default_value_t = 1)]
    publish_interval: u32,
    /// Also write the SLNS slot file at this path.
    #[arg(long)]
    shm_path: Option<PathBuf>,
    /// Stop after this many seconds (0: run until killed).
    #[arg(long, default_value_t = 0.0, value_parser = crate::seconds::run_duration)]
    duration: f64,
}

pub fn run(a: PublishArgs) -> Result<()> {
    let settings = EngineSettings {
        kv_events_config: Some(a.kv_events_config.clone()),
        load_publish_endpoint: a.load_publish_endpoint.clone(),
        publish_interval: a.publish_interval,
        dp_size: a.dp_size,
        generation: a.generation,
        internal: a
            .shm_path
            .clone()
            .map_or(InternalSink::None, InternalSink::Shm),
    };
    settings.kv_config().map_err(anyhow::Error::msg)?;
    let ctx = zmq::Context::new();
    match settings.advertise(16) {
        Some(d) => eprintln!("advertising kv_events: {}", serde_json::to_string(&d)?),
        None => eprintln!("advertising kv_events: null"),
    }
    let period = Duration::from_secs_f64(1.0 / a.cycle_hz.max(0.1));
    let end = (a.duration > 0.0).then(|| Instant::now() + Duration::from_secs_f64(a.duration));
    let threads: Vec<_> = (0..a.dp_size)
        .map(|rank| {
            let built = build_sinks(&ctx, &settings, rank);
            if let Some(r) = &built.range {
                eprintln!("rank {rank}: {}", r.bind_endpoint(rank as u16));
            }
            std::thread::spawn(move || {
                let start = Instant::now();
                let source = move || {
                    let t = start.elapsed().as_secs_f64();
                    let waiting = ((t * 0.7 + rank as f64).sin() * 8.0 + 8.0) as i64;
                    Ok(LoadSnapshot {
                        timestamp: Some(
                            SystemTime::now()
                                .duration_since(UNIX_EPOCH)
                                .map_or(0.0, |d| d.as_secs_f64()),
                        ),
                        dp_rank: rank as i64,
                        num_running_reqs: 32 + waiting / 2,
                        num_waiting_reqs: waiting,
                        max_running_requests: 64,
                        max_total_num_tokens: 100_000,
                        num_used_tokens: 40_000 + waiting * 1000,
                        token_usage: Some((40_000 + waiting * 1000) as f64 / 100_000.0),
                        gen_throughput: Some(1500.0),
                        cache_hit_rate: Some(0.25),
                        utilization: Some(0.8),
                        ..Default::default()
                    })
                };
                let mut p = Publisher::new(source, built.sinks);
                while end.is_none_or(|e| Instant::now() < e) {
                    p.publish(false);
                    std::thread::sleep(period);
                }
                p.close();
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}
