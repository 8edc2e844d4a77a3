//! `loadlink bench soak`: the router under hostile peers, as issue 19's acceptance states it.
//!
//! Four healthy `loadlink engine` processes and a real `loadlink route` process (its RSS and
//! executor are its own) serve steady traffic while the hostile workers of [`hostile`] — stalled
//! and dribbled and oversized `/server_info` bodies, absurd ranks and numbers in `/v1/loads` and
//! `/metrics`, random and oversized frames and garbage replays on the sockets — are registered
//! beside them through the admin API, and removed and registered again every `churn` seconds.
//! The verdict has three parts, each with its figure:
//! * zero client-visible failures (a client retries a failed request up to three times, as any
//!   client of a router may), and the router process alive at the end;
//! * router RSS at most its idle RSS (healthy fleet, before any hostile peer) + 64 MiB;
//! * the router's own 1 ms executor probe ([`loadlink_router::executor_probe`]) never more than
//!   50 ms late.

pub mod hostile;

use crate::live::scrape::scrape;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone)]
pub struct Soak {
    /// The `loadlink` binary that runs the engines and the router.
    pub exe: PathBuf,
    pub duration: Duration,
    pub engines: usize,
    /// Client requests a second through the router.
    pub rate: f64,
    /// Messages a second from the garbage publishers.
    pub flood_per_s: u64,
    /// Hostile workers are removed and registered again this often.
    pub churn: Duration,
    /// Which hostile workers to run ([`hostile::KINDS`]).
    pub hostile: Vec<String>,
}

/// The acceptance bounds.
pub const RSS_GROWTH_BOUND_MIB: f64 = 64.0;
pub const LATENESS_BOUND_MS: f64 = 50.0;

/// What it measured.
#[derive(Debug, Clone, Default)]
pub struct SoakReport {
    pub requests: u64,
    pub failed: u64,
    pub retried: u64,
    pub idle_rss_mib: f64,
    pub max_rss_mib: f64,
    pub lateness_max_ms: f64,
    pub lateness_ticks: f64,
    pub router_alive: bool,
    pub garbage_sent: u64,
    /// `loadlink_peer_refusals_total` by reason.
    pub refusals: Vec<(String, f64)>,
    /// Each hostile worker as `/workers` shows it at the end: kind, url, reason(s).
    pub hostile: Vec<(String, String, String)>,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl SoakReport {
    pub fn passed(&self) -> bool {
        self.failed == 0
            && self.requests > 0
            && self.router_alive
            && self.max_rss_mib - self.idle_rss_mib <= RSS_GROWTH_BOUND_MIB
            && self.lateness_max_ms <= LATENESS_BOUND_MS
            && self.lateness_ticks > 0.0
    }

    pub fn text(&self, s: &Soak) -> String {
        let mut t = format!(
            "soak: {:.0} s, {} healthy engines + {} hostile workers, {:.0} req/s, garbage {} msg/s, churn every {:.0} s\n",
            s.duration.as_secs_f64(),
            s.engines,
            s.hostile.len(),
            s.rate,
            s.flood_per_s,
            s.churn.as_secs_f64()
        );
        let mark = |ok: bool| if ok { "ok  " } else { "FAIL" };
        t += &format!(
            "{} client requests: {} sent, {} failed after retries ({} retried); p50 {:.1} ms, p99 {:.1} ms; router alive: {}\n",
            mark(self.failed == 0 && self.router_alive && self.requests > 0),
            self.requests,
            self.failed,
            self.retried,
            self.p50_ms,
            self.p99_ms,
            self.router_alive
        );
        let growth = self.max_rss_mib - self.idle_rss_mib;
        t += &format!(
            "{} router RSS: idle {:.1} MiB, max {:.1} MiB (+{:.1} MiB, bound +{RSS_GROWTH_BOUND_MIB} MiB)\n",
            mark(growth <= RSS_GROWTH_BOUND_MIB),
            self.idle_rss_mib,
            self.max_rss_mib,
            growth
        );
        t += &format!(
            "{} executor probe: max lateness {:.2} ms over {:.0} ticks (bound {LATENESS_BOUND_MS} ms)\n",
            mark(self.lateness_max_ms <= LATENESS_BOUND_MS && self.lateness_ticks > 0.0),
            self.lateness_max_ms,
            self.lateness_ticks
        );
        t += &format!(
            "garbage messages sent: {}\nrefusals by reason:\n",
            self.garbage_sent
        );
        for (r, n) in &self.refusals {
            t += &format!("  {r:<24} {n}\n");
        }
        t += "hostile workers at the end:\n";
        for (kind, url, why) in &self.hostile {
            t += &format!("  {kind:<14} {url}: {why}\n");
        }
        t += if self.passed() { "PASS\n" } else { "FAIL\n" };
        t
    }
}

/// A child process stopped with SIGTERM (then SIGKILL after 5 s) when dropped: an engine's
/// slot file is state, removed by its own shutdown.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.0.id()) {
            // SAFETY: kill(2) on a child we own and have not reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(s: &Soak, args: &[String]) -> Result<Stopped, String> {
    Command::new(&s.exe)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Stopped)
        .map_err(|e| format!("starting {}: {e}", s.exe.display()))
}

const ADMIN_TOKEN: &str = "soak";

pub async fn run(s: &Soak) -> Result<SoakReport, String> {
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    let mut procs = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..s.engines {
        // The KV port and the load range derived from it (see `loadlink engine --help`).
        let kv = loadlink_publish::free_port_block(8)?;
        let http = loadlink_publish::free_port_block(1)?;
        procs.push(spawn(
            s,
            &[
                "engine".into(),
                "--port".into(),
                http.to_string(),
                "--kv-events-config".into(),
                format!(r#"{{"publisher":"zmq","endpoint":"tcp://*:{kv}"}}"#),
            ],
        )?);
        urls.push(format!("http://127.0.0.1:{http}"));
    }
    for u in &urls {
        wait(&format!("engine {u}"), 30, || async {
            c.get(format!("{u}/health")).send().await.is_ok()
        })
        .await?;
    }
    let port = loadlink_publish::free_port_block(1)?;
    let router = format!("http://127.0.0.1:{port}");
    let mut router_proc = spawn(
        s,
        &[
            "route".into(),
            "--port".into(),
            port.to_string(),
            "--admin-token".into(),
            ADMIN_TOKEN.into(),
            "--worker-urls".into(),
            urls.join(","),
        ],
    )?;
    let pid = router_proc.0.id();
    wait(
        "the router to price every engine on its load",
        30,
        || async {
            let Ok(r) = c.get(format!("{router}/workers")).send().await else {
                return false;
            };
            let Ok(v) = r.json::<Value>().await else {
                return false;
            };
            let ws = v["workers"].as_array().cloned().unwrap_or_default();
            ws.len() == urls.len() && ws.iter().all(|w| w["source"] == "engine")
        },
    )
    .await?;
    // A little traffic first, so pools and buffers of normal operation are in the idle figure.
    for _ in 0..20 {
        let _ = complete(&c, &router).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_rss = rss_mib(pid)?;

    let hostile = hostile::start(&s.hostile, s.flood_per_s).await?;
    let register = |c: reqwest::Client, url: String, router: String| async move {
        let _ = c
            .post(format!("{router}/workers"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({ "url": url }))
            .send()
            .await;
    };
    // Admin calls run beside the traffic (a stalled worker's registration takes its discovery
    // budget); they are awaited at the end, so the report shows every hostile worker registered.
    let mut admin = Vec::new();
    for (_, url) in &hostile.workers {
        admin.push(tokio::spawn(register(
            c.clone(),
            url.clone(),
            router.clone(),
        )));
    }

    let stats = Arc::new(Counters::default());
    let latencies = Arc::new(std::sync::Mutex::new(Vec::<f64>::new()));
    let started = Instant::now();
    let period = Duration::from_secs_f64(1.0 / s.rate.max(0.1));
    let mut next = Instant::now();
    let mut next_churn = started + s.churn;
    let mut next_sample = Instant::now();
    let mut max_rss = idle_rss;
    let mut tasks = Vec::new();
    while started.elapsed() < s.duration {
        let now = Instant::now();
        if now >= next {
            next += period;
            let (c, router, stats, lat) =
                (c.clone(), router.clone(), stats.clone(), latencies.clone());
            tasks.push(tokio::spawn(async move {
                let t0 = Instant::now();
                let ok = with_retries(&c, &router, &stats).await;
                if ok {
                    let mut l = lat.lock().unwrap_or_else(|p| p.into_inner());
                    l.push(t0.elapsed().as_secs_f64() * 1000.0);
                }
            }));
        }
        if now >= next_sample {
            next_sample += Duration::from_millis(250);
            if let Ok(r) = rss_mib(pid) {
                max_rss = max_rss.max(r);
            }
        }
        if now >= next_churn && !s.churn.is_zero() {
            next_churn += s.churn;
            for (_, url) in &hostile.workers {
                let (c, url, router) = (c.clone(), url.clone(), router.clone());
                admin.push(tokio::spawn(async move {
                    let _ = c
                        .delete(format!("{router}/workers"))
                        .query(&[("url", &url)])
                        .bearer_auth(ADMIN_TOKEN)
                        .send()
                        .await;
                    register(c, url, router).await;
                }));
            }
        }
        let wake = next.min(next_sample).min(next_churn);
        tokio::time::sleep(wake.saturating_duration_since(Instant::now())).await;
    }
    for t in tasks.into_iter().chain(admin) {
        let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
    }
    if let Ok(r) = rss_mib(pid) {
        max_rss = max_rss.max(r);
    }
    let router_alive = matches!(router_proc.0.try_wait(), Ok(None));
    let mut report = SoakReport {
        requests: stats.requests.load(Relaxed),
        failed: stats.failed.load(Relaxed),
        retried: stats.retried.load(Relaxed),
        idle_rss_mib: idle_rss,
        max_rss_mib: max_rss,
        router_alive,
        garbage_sent: hostile.sent.load(Relaxed),
        ..Default::default()
    };
    {
        let mut l = latencies.lock().unwrap_or_else(|p| p.into_inner());
        l.sort_by(f64::total_cmp);
        let q = |p: f64| l.get(((l.len() as f64 - 1.0) * p) as usize).copied();
        report.p50_ms = q(0.5).unwrap_or(f64::NAN);
        report.p99_ms = q(0.99).unwrap_or(f64::NAN);
    }
    if router_alive {
        let m = scrape(&c, &router).await?;
        let one = |name: &str| m.samples(name).map(|x| x.value).next().unwrap_or(f64::NAN);
        report.lateness_max_ms = one("loadlink_executor_lateness_max_seconds") * 1000.0;
        report.lateness_ticks = one("loadlink_executor_lateness_seconds_count");
        report.refusals = m
            .samples("loadlink_peer_refusals_total")
            .map(|x| (x.label("reason").unwrap_or("?").to_string(), x.value))
            .collect();
        let ws: Value = c
            .get(format!("{router}/workers"))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        for (kind, url) in &hostile.workers {
            let w = ws["workers"]
                .as_array()
                .and_then(|a| a.iter().find(|w| w["url"] == url.as_str()));
            let why = w.map_or("not registered".to_string(), |w| {
                [
                    &w["no_load_reason"],
                    &w["load_source_reason"],
                    &w["last_refusal"],
                ]
                .iter()
                .filter_map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join(" | ")
            });
            report.hostile.push((kind.to_string(), url.clone(), why));
        }
    }
    drop(hostile);
    drop(router_proc);
    drop(procs);
    Ok(report)
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    failed: AtomicU64,
    retried: AtomicU64,
}

/// One client request with up to three retries (200 ms apart); counts the outcome.
async fn with_retries(c: &reqwest::Client, router: &str, stats: &Counters) -> bool {
    stats.requests.fetch_add(1, Relaxed);
    for attempt in 0..4 {
        if attempt > 0 {
            stats.retried.fetch_add(1, Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if complete(c, router).await {
            return true;
        }
    }
    stats.failed.fetch_add(1, Relaxed);
    false
}

/// One short completion, read to the end; whether it succeeded.
async fn complete(c: &reqwest::Client, router: &str) -> bool {
    let body = json!({"model": "loadlink-sim", "prompt": "The soak test asks for a short answer.", "max_tokens": 8});
    match c
        .post(format!("{router}/v1/completions"))
        .json(&body)
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
        _ => false,
    }
}

async fn wait<F, Fut>(what: &str, secs: u64, mut cond: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if cond().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("timed out after {secs} s waiting for {what}"))
}

fn rss_mib(pid: u32) -> Result<f64, String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .ok_or_else(|| format!("no VmRSS in /proc/{pid}/status"))
}
