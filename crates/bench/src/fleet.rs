//! `loadlink bench fleet`: the router's ingest at fleet scale, on loopback.
//!
//! N fake engines × R ranks are stood up cheaply in this process: every worker is a distinct
//! 127.x.y.z address on one HTTP port (one app answers `/server_info`, `/health` and completions
//! for all of them), and each rank's PUB is bound on 0.0.0.0, so one PUB serves many workers'
//! subscriptions to that rank. Workers are split into groups of [`GROUP`]; each group has its own R
//! PUBs (`/server_info` answers per `Host` with its group's port base) and publishes at its own
//! phase of the period, so the router sees arrivals spread over the period as from independent
//! engines, not one synchronized burst of N × R messages. A publisher thread sends generation-A
//! snapshots (stamped with the time they were taken) on every rank at H Hz: N × R × H messages a
//! second reach the router.
//! The router is a real `loadlink route` child process, so its RSS and CPU are its own. Reported:
//! router RSS and CPU per message, the share of workers priced on engine load, the load-change-to-
//! book lag (p50/p99 from the router's `loadlink_ingest_lag_seconds`), and proxied request latency
//! while the stream runs.

use crate::live::scrape::scrape;
use loadlink_wire::LoadSnapshot;
use loadlink_wire::codec::snapshot_bytes;
use loadlink_wire::descriptor::KvEventsDescriptor;
use loadlink_wire::prom::Scrape;
use serde_json::json;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What to run.
#[derive(Debug, Clone)]
pub struct FleetBench {
    pub workers: usize,
    pub ranks: u16,
    pub hz: f64,
    /// Measured window, seconds (after everything is priced and a warm-up).
    pub duration: f64,
    /// Proxied requests per second sent through the router during the window.
    pub request_rate: f64,
    pub ingest_threads: usize,
    /// The `loadlink` binary that runs the router.
    pub exe: PathBuf,
}

/// What it measured.
#[derive(Debug, Clone, Default)]
pub struct FleetReport {
    pub offered_per_s: f64,
    pub received_per_s: f64,
    pub decoded_per_s: f64,
    pub router_rss_mib: f64,
    pub router_cores: f64,
    pub cpu_us_per_message: f64,
    pub engine_priced_share: f64,
    pub lag_p50_ms: f64,
    pub lag_p99_ms: f64,
    pub request_p50_ms: f64,
    pub request_p99_ms: f64,
    pub requests: usize,
    pub request_errors: usize,
    /// Quiet sockets the ingest's once-a-second sweep found messages on (whole run).
    pub rescued: f64,
    /// Router cores by thread name over the window.
    pub thread_cores: Vec<(String, f64)>,
}

impl FleetReport {
    pub fn text(&self, b: &FleetBench) -> String {
        format!(
            "fleet {} workers × {} ranks at {} Hz ({} ingest thread(s)), {} s window\n\
             offered {:.0} msg/s, received {:.0} msg/s, decoded {:.0}/s\n\
             router RSS {:.1} MiB, CPU {:.2} cores, {:.2} µs per message\n\
             by thread (cores): {}\n\
             priced on engine load: {:.2}% (sweep rescues over the run: {})\n\
             load change → book: p50 ≤ {:.1} ms, p99 ≤ {:.1} ms (histogram bucket bounds)\n\
             proxied requests: {} ({} errors), p50 {:.2} ms, p99 {:.2} ms",
            b.workers,
            b.ranks,
            b.hz,
            b.ingest_threads,
            b.duration,
            self.offered_per_s,
            self.received_per_s,
            self.decoded_per_s,
            self.router_rss_mib,
            self.router_cores,
            self.cpu_us_per_message,
            self.thread_cores
                .iter()
                .map(|(n, c)| format!("{n} {c:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
            100.0 * self.engine_priced_share,
            self.rescued,
            self.lag_p50_ms,
            self.lag_p99_ms,
            self.requests,
            self.request_errors,
            self.request_p50_ms,
            self.request_p99_ms,
        )
    }
}

/// A child process stopped on drop: SIGTERM, then SIGKILL after a bound.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        crate::live::procs::terminate(
            std::slice::from_mut(&mut self.0),
            crate::live::procs::OWN_GRACE,
        );
    }
}

/// Runs the experiment.
pub async fn run(b: &FleetBench) -> Result<FleetReport, String> {
    let groups = b.workers.div_ceil(GROUP).max(1);
    let ports = u16::try_from(groups * b.ranks as usize).map_err(|_| "too many PUB ports")?;
    let base = loadlink_publish::free_port_block(ports)?;
    let http = fake_workers(b.ranks, base, groups).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let pub_thread = {
        let (stop, ranks, hz) = (stop.clone(), b.ranks, b.hz);
        std::thread::spawn(move || publish(base, ranks, groups, hz, &stop))
    };
    let result = measure(b, http).await;
    stop.store(true, Relaxed);
    let _ = pub_thread.join();
    result
}

async fn measure(b: &FleetBench, http: u16) -> Result<FleetReport, String> {
    let port = loadlink_publish::free_port_block(1)?;
    let urls: Vec<String> = (0..b.workers).map(|i| worker_url(i, http)).collect();
    let child = Command::new(&b.exe)
        .args([
            "route",
            "--port",
            &port.to_string(),
            "--load-signal",
            "engine",
        ])
        .args(["--ingest-threads", &b.ingest_threads.to_string()])
        .arg("--worker-urls")
        .arg(urls.join(","))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", b.exe.display()))?;
    let mut child = Killed(child);
    let pid = child.0.id();
    let router = format!("http://127.0.0.1:{port}");
    let c = reqwest::Client::new();
    let priced = wait_priced(&c, &router, b.workers, &mut child.0).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let threads0 = thread_cpu(pid);
    let (m0, cpu0, t0) = (
        scrape(&c, &router).await?,
        cpu_seconds(pid)?,
        Instant::now(),
    );
    let lat = requests(&c, &router, b.request_rate, b.duration).await;
    let (m1, cpu1, secs) = (
        scrape(&c, &router).await?,
        cpu_seconds(pid)?,
        t0.elapsed().as_secs_f64(),
    );
    let delta = |name: &str| total(&m1, name) - total(&m0, name);
    let threads: Vec<(String, f64)> = thread_cpu(pid)
        .into_iter()
        .map(|(n, c)| {
            let before = threads0.iter().find(|(m, _)| *m == n).map_or(0.0, |x| x.1);
            (n, (c - before) / secs)
        })
        .filter(|(_, c)| *c > 0.005)
        .collect();
    let received = delta("loadlink_ingest_messages_total");
    // The process total and the sum over its threads can disagree on a busy VM; take the larger.
    let cores = ((cpu1 - cpu0) / secs).max(threads.iter().map(|(_, c)| c).sum());
    let (p50, p99) = lag_quantiles(&m0, &m1);
    let mut r = FleetReport {
        offered_per_s: b.workers as f64 * b.ranks as f64 * b.hz,
        received_per_s: received / secs,
        decoded_per_s: delta("loadlink_ingest_decoded_total") / secs,
        router_rss_mib: rss_mib(pid)?,
        router_cores: cores,
        cpu_us_per_message: if received > 0.0 {
            cores * secs * 1e6 / received
        } else {
            f64::NAN
        },
        engine_priced_share: total(&m1, "loadlink_worker_engine_priced").max(priced)
            / b.workers as f64,
        lag_p50_ms: p50 * 1000.0,
        lag_p99_ms: p99 * 1000.0,
        thread_cores: threads,
        rescued: total(&m1, "loadlink_ingest_rescued_total"),
        ..Default::default()
    };
    r.requests = lat.0.len() + lat.1;
    r.request_errors = lat.1;
    r.request_p50_ms = quantile(&lat.0, 0.5);
    r.request_p99_ms = quantile(&lat.0, 0.99);
    drop(child);
    Ok(r)
}

/// Worker `i`'s URL: its own loopback address (127.0.0.0/8 is all loopback on Linux).
pub fn worker_url(i: usize, port: u16) -> String {
    format!(
        "http://127.{}.{}.{}:{port}",
        1 + i / 62_500,
        (i / 250) % 250,
        1 + i % 250
    )
}

/// Workers per publishing group (one PUB per rank per group).
pub const GROUP: usize = 100;

/// Worker index of a `Host` header written by [`worker_url`].
fn worker_index(host: &str) -> usize {
    let ip = host.split(':').next().unwrap_or("");
    let o: Vec<usize> = ip.split('.').filter_map(|x| x.parse().ok()).collect();
    match o[..] {
        [127, a, b, c] => (a - 1) * 62_500 + b * 250 + c.saturating_sub(1),
        _ => 0,
    }
}

/// One HTTP app on 0.0.0.0 that answers for every worker; returns its port. `/server_info`
/// advertises the load ports of the asking worker's group.
async fn fake_workers(ranks: u16, load_base: u16, groups: usize) -> Result<u16, String> {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .map_err(|e| format!("binding the fake workers' HTTP port: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let info = move |headers: axum::http::HeaderMap| {
        let host = headers
            .get("host")
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        let group = (worker_index(host) / GROUP).min(groups - 1);
        let base = load_base + (group * ranks as usize) as u16;
        let kv = KvEventsDescriptor {
            publisher: "zmq".into(),
            endpoint_host: "*".into(),
            endpoint_port_base: base.wrapping_add(20_000),
            topic: String::new(),
            block_size: 16,
            dp_size: ranks as u32,
            load_endpoint_port_base: Some(base),
            load_topic: None,
            replay_endpoint_port_base: None,
        };
        std::future::ready(axum::Json(json!({ "dp_size": ranks, "kv_events": kv })))
    };
    let done = json!({"choices": [{"text": "ok"}]});
    let app = axum::Router::new()
        .route("/server_info", axum::routing::get(info))
        .route("/health", axum::routing::get(|| async { "ok" }))
        .route(
            "/v1/completions",
            axum::routing::post(move || std::future::ready(axum::Json(done.clone()))),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(port)
}

/// Publishes a stamped snapshot on every rank of every group at `hz` until `stop`; group g
/// publishes at phase g / groups of the period.
fn publish(base: u16, ranks: u16, groups: usize, hz: f64, stop: &AtomicBool) {
    let ctx = zmq::Context::new();
    let pubs: Vec<zmq::Socket> = (0..groups as u16 * ranks)
        .filter_map(|p| {
            let s = ctx.socket(zmq::PUB).ok()?;
            s.set_linger(0).ok()?;
            s.set_sndhwm(1000).ok()?;
            // One PUB serves a whole group's subscriptions to its rank: they connect at once.
            s.set_backlog(4096).ok()?;
            s.bind(&format!("tcp://0.0.0.0:{}", base + p)).ok()?;
            Some(s)
        })
        .collect();
    let slot = Duration::from_secs_f64(1.0 / hz.max(0.1) / groups as f64);
    let mut next = Instant::now();
    let mut seq = 0i64;
    while !stop.load(Relaxed) {
        for group in pubs.chunks(ranks as usize) {
            for (r, s) in group.iter().enumerate() {
                let snap = LoadSnapshot {
                    num_running_reqs: r as i64,
                    num_waiting_reqs: seq % 7,
                    timestamp: Some(unix_now()),
                    ..Default::default()
                };
                let bytes = snapshot_bytes(&snap);
                let _ = s.send_multipart([&b""[..], &seq.to_be_bytes(), &bytes], zmq::DONTWAIT);
            }
            next += slot;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        seq += 1;
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Σ of every sample of `name`.
fn total(s: &Scrape, name: &str) -> f64 {
    s.samples(name).map(|x| x.value).sum()
}

/// Waits (bounded) until the router answers and every worker is priced on engine load, or the
/// share stops growing; returns the number priced.
async fn wait_priced(
    c: &reqwest::Client,
    router: &str,
    n: usize,
    child: &mut Child,
) -> Result<f64, String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut priced = 0.0;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the router exited ({status}); its error is above"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Ok(s) = scrape(c, router).await {
            priced = total(&s, "loadlink_worker_engine_priced");
            if priced as usize >= n {
                return Ok(priced);
            }
        }
    }
    if priced > 0.0 {
        Ok(priced)
    } else {
        Err(format!(
            "the router at {router} priced no worker on engine load within 120 s"
        ))
    }
}

/// The p50 and p99 upper bucket bounds of the lag histogram between two scrapes.
fn lag_quantiles(a: &Scrape, b: &Scrape) -> (f64, f64) {
    let buckets = |s: &Scrape| -> Vec<(f64, f64)> {
        s.samples("loadlink_ingest_lag_seconds_bucket")
            .filter_map(|x| {
                let le = x
                    .labels
                    .iter()
                    .find(|(k, _)| k == "le")?
                    .1
                    .parse::<f64>()
                    .ok()?;
                Some((le, x.value))
            })
            .collect()
    };
    let (ba, bb) = (buckets(a), buckets(b));
    let d: Vec<(f64, f64)> = bb
        .iter()
        .map(|(le, n)| {
            (
                *le,
                n - ba.iter().find(|(l, _)| l == le).map_or(0.0, |x| x.1),
            )
        })
        .collect();
    let count = d.iter().map(|x| x.1).fold(0.0, f64::max);
    let q = |p: f64| {
        d.iter()
            .find(|(_, n)| *n >= p * count)
            .map_or(f64::INFINITY, |x| x.0)
    };
    (q(0.5), q(0.99))
}

/// Sends completions through the router at `rate` per second for `secs`; latencies (ms) of the
/// successful ones and the error count.
async fn requests(c: &reqwest::Client, router: &str, rate: f64, secs: f64) -> (Vec<f64>, usize) {
    let (mut lat, mut errors) = (Vec::new(), 0);
    let period = Duration::from_secs_f64(1.0 / rate.max(0.1));
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let url = format!("{router}/v1/completions");
    while Instant::now() < end {
        let t = Instant::now();
        match c.post(&url).json(&json!({"prompt": "x"})).send().await {
            Ok(r) if r.status().is_success() => {
                let _ = r.bytes().await;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            _ => errors += 1,
        }
        tokio::time::sleep(period.saturating_sub(t.elapsed())).await;
    }
    (lat, errors)
}

fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * p).round() as usize]
}

/// utime + stime of `pid`, seconds.
fn cpu_seconds(pid: u32) -> Result<f64, String> {
    stat_cpu(&format!("/proc/{pid}/stat"))
}

/// CPU seconds of `pid`'s threads, summed by thread name (digits dropped: `ingest-0` → `ingest-`).
fn thread_cpu(pid: u32) -> Vec<(String, f64)> {
    let mut by: Vec<(String, f64)> = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return by;
    };
    for t in dir.flatten() {
        let p = t.path();
        let name = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        let name: String = name
            .trim()
            .chars()
            .filter(|c| !c.is_ascii_digit())
            .collect();
        let cpu = stat_cpu(&p.join("stat").to_string_lossy()).unwrap_or(0.0);
        match by.iter_mut().find(|(n, _)| *n == name) {
            Some(e) => e.1 += cpu,
            None => by.push((name, cpu)),
        }
    }
    by
}

fn stat_cpu(path: &str) -> Result<f64, String> {
    let stat = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let after = stat.rsplit_once(')').map_or("", |x| x.1);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of stat; `after` starts at field 3. Linux's clock tick is 100 Hz.
    Ok((ticks(11) + ticks(12)) / 100.0)
}

fn rss_mib(pid: u32) -> Result<f64, String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .ok_or("no VmRSS")?;
    Ok(kb / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_addresses_are_distinct_loopback_hosts() {
        let urls: std::collections::HashSet<_> = (0..5000).map(|i| worker_url(i, 1)).collect();
        assert_eq!(urls.len(), 5000);
        assert!(urls.iter().all(|u| u.starts_with("http://127.")));
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.5), 2.0);
        for i in [0, 1, 249, 250, 4321] {
            let host = worker_url(i, 80).trim_start_matches("http://").to_string();
            assert_eq!(worker_index(&host), i);
        }
    }
}
