//! One variant's router replicas: `loadlink route` processes, or an external router's command once
//! per replica. Either way the run waits, bounded, until every replica knows every engine, so no
//! replica starts on part of the fleet:
//! * loadlink: `/workers` lists every engine with a load snapshot received;
//! * external: `/workers` lists every engine and none is marked unhealthy (`is_healthy`, as
//!   sglang-router says); a router without `/workers` (404) is ready when `/health` answers 2xx.

use super::pd::PdWorkers;
use super::procs::{Ended, Logged, Procs, spawn};
use super::variant::{ExternalRouter, LiveVariant, Slot};
use super::{LiveConfig, get_json};
use loadlink_publish::free_port_block;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long an external router may take to know every engine.
const EXTERNAL_READY_S: u64 = 60;
/// How long an external router has to exit after SIGTERM.
const EXTERNAL_GRACE: Duration = Duration::from_secs(10);

/// A variant's running replicas and their base URLs.
pub(super) struct Routers {
    pub(super) urls: Vec<String>,
    own: Option<Procs>,
    external: Vec<Logged>,
}

impl Routers {
    /// Stops every replica: each gets SIGTERM, then SIGKILL after a bound (loadlink's together,
    /// external ones group by group). Returns a note per external replica that had to be killed.
    pub(super) async fn stop(self) -> Vec<String> {
        drop(self.own);
        let mut notes = Vec::new();
        for (i, r) in self.external.into_iter().enumerate() {
            let log = r.log.clone();
            if r.stop(EXTERNAL_GRACE).await == Ended::Killed {
                notes.push(format!(
                    "external router replica {i} ignored SIGTERM for {EXTERNAL_GRACE:?} and was \
                     killed (log: {})",
                    log.display()
                ));
            }
        }
        notes
    }
}

/// Starts `variant`'s replicas on `engines` and waits until each is ready.
pub(super) async fn start(
    cfg: &LiveConfig,
    client: &reqwest::Client,
    (engines, pd): (&[String], Option<&PdWorkers>),
    variant: &LiveVariant,
) -> Result<Routers, String> {
    match variant {
        LiveVariant::Loadlink {
            policy,
            signal,
            decode,
            extra,
        } => {
            let how = (policy.as_str(), signal.as_str(), decode.as_deref());
            start_loadlink(cfg, client, (engines, pd), how, extra).await
        }
        LiveVariant::External(e) if e.wants_pd() != pd.is_some() => Err(format!(
            "{}: {}",
            e.name,
            match pd {
                Some(_) => "the fleet is disaggregated: the command needs {pd_workers}",
                None => "{pd_workers} needs a disaggregated fleet (--scenario s6)",
            }
        )),
        LiveVariant::External(e) => start_external(cfg, client, (engines, pd), e).await,
    }
}

/// `loadlink route`'s arguments for one replica on `port`: every engine by URL, or on a PD fleet
/// both sides with the prefill policy, load signal and decode policy.
pub(super) fn route_args(
    port: u16,
    (engines, pd): (&[String], Option<&PdWorkers>),
    (policy, signal, decode): (&str, &str, Option<&str>),
) -> Vec<String> {
    let mut args: Vec<String> = vec!["route".into(), "--port".into(), port.to_string()];
    match pd {
        None => {
            args.extend(
                ["--policy", policy, "--load-signal", signal, "--worker-urls"].map(String::from),
            );
            args.extend(engines.iter().cloned());
        }
        Some(sides) => {
            args.push("--pd".into());
            args.extend(sides.args());
            args.extend(["--prefill-policy", policy, "--load-signal", signal].map(String::from));
            if let Some(d) = decode {
                args.extend(["--decode-policy".into(), d.into()]);
            }
        }
    }
    args
}

/// The scenario's `loadlink route` replicas, each seeing every engine's load.
async fn start_loadlink(
    cfg: &LiveConfig,
    client: &reqwest::Client,
    (engines, pd): (&[String], Option<&PdWorkers>),
    how: (&str, &str, Option<&str>),
    extra: &[String],
) -> Result<Routers, String> {
    let (policy, signal, _) = how;
    let mut procs = Procs(Vec::new());
    let mut urls = Vec::new();
    for _ in 0..cfg.scenario.routers {
        let port = free_port_block(1)?;
        let mut args = route_args(port, (engines, pd), how);
        args.extend(extra.iter().cloned());
        procs.0.push(spawn(&cfg.exe, &args)?);
        urls.push(format!("http://127.0.0.1:{port}"));
    }
    for (u, child) in urls.iter().zip(procs.0.iter_mut()) {
        let mut ready = false;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready && Instant::now() < deadline {
            if let Some(status) = child.try_wait().ok().flatten() {
                return Err(format!(
                    "loadlink route --policy {policy} --load-signal {signal} {} exited \
                     ({status}); are the policy, signal and flags right?",
                    extra.join(" ")
                ));
            }
            ready = sees_every_engine(client, u, engines.len()).await;
            if !ready {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if !ready {
            return Err("timed out waiting for a router to see every engine's load".into());
        }
    }
    Ok(Routers {
        urls,
        own: Some(procs),
        external: Vec::new(),
    })
}

async fn sees_every_engine(client: &reqwest::Client, url: &str, engines: usize) -> bool {
    get_json(client, &format!("{url}/workers"))
        .await
        .is_some_and(|v| {
            v["workers"].as_array().is_some_and(|ws| {
                ws.len() == engines
                    && ws
                        .iter()
                        .all(|w| w["ranks"][0]["seq"].as_i64().is_some_and(|q| q >= 0))
            })
        })
}

/// Where an external replica's output goes: a file per name and replica in one directory per run.
fn log_path(name: &str, replica: usize) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("loadlink-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir.join(format!("{name}-{replica}.log")))
}

/// One external router per replica, each told every engine, each ready before traffic starts.
async fn start_external(
    cfg: &LiveConfig,
    client: &reqwest::Client,
    (engines, pd): (&[String], Option<&PdWorkers>),
    router: &ExternalRouter,
) -> Result<Routers, String> {
    let mut started = Routers {
        urls: Vec::new(),
        own: None,
        external: Vec::new(),
    };
    for replica in 0..cfg.scenario.routers {
        let ports = free_port_block(2)?;
        let slot = Slot {
            port: ports,
            metrics_port: ports + 1,
            replica,
        };
        let argv = router.command(engines, pd, slot);
        let log = log_path(&router.name, replica)?;
        started.external.push(Logged::spawn(&argv, log)?);
        started.urls.push(format!("http://127.0.0.1:{}", slot.port));
    }
    for (u, proc) in started.urls.iter().zip(started.external.iter_mut()) {
        let deadline = Instant::now() + Duration::from_secs(EXTERNAL_READY_S);
        loop {
            if let Some(status) = proc.exited() {
                return Err(format!(
                    "{} exited at start-up ({status}); the end of {}:\n{}",
                    router.name,
                    proc.log.display(),
                    proc.log_tail(20)
                ));
            }
            if external_ready(client, u, engines.len()).await {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} at {u} did not list all {} engines as healthy within {EXTERNAL_READY_S} s; \
                     the end of {}:\n{}",
                    router.name,
                    engines.len(),
                    proc.log.display(),
                    proc.log_tail(20)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(started)
}

/// `/workers` lists every engine, none unhealthy (a DP-aware router lists each rank as a worker of
/// its own, `URL@rank`: at least `engines` entries); or, without `/workers`, `/health` is 2xx.
async fn external_ready(client: &reqwest::Client, url: &str, engines: usize) -> bool {
    let Ok(r) = client.get(format!("{url}/workers")).send().await else {
        return false;
    };
    if r.status() == reqwest::StatusCode::NOT_FOUND {
        return client
            .get(format!("{url}/health"))
            .send()
            .await
            .is_ok_and(|h| h.status().is_success());
    }
    let Ok(v) = r.json::<serde_json::Value>().await else {
        return false;
    };
    v["workers"].as_array().is_some_and(|ws| {
        ws.len() >= engines && ws.iter().all(|w| w["is_healthy"].as_bool() != Some(false))
    })
}
