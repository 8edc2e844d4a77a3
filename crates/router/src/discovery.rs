//! Worker discovery: `GET /server_info` with bounded retries (its meaning is in
//! `loadlink_wire::discovery`), and the choice of each worker's load source. Push (the load
//! sockets `/server_info` advertises) is preferred; a worker without them is probed for an HTTP
//! load source ([`crate::poll::probe`]: `/v1/loads`, then `/metrics`); with neither it is priced on
//! in-flight, and the reasons say why.
//!
//! Every fetch is bounded in total time and body size ([`crate::peer_http`], the
//! `Budgets::discovery_*` values): a worker that stalls after its headers, dribbles or sends an
//! oversized body is given up on with a reason (counted fleet-wide as a refusal, and shown as the
//! worker's `no_load_reason`), never waited on for ever.

use crate::budget::{Budgets, RefusalCounts};
use crate::peer_http::{FetchBudget, HttpClient, PeerFetchError, bounded_get};
use crate::poll::Polled;
use axum::body::Bytes;
use loadlink_wire::descriptor::LoadEndpoint;
use loadlink_wire::discovery::{KvStreams, NoLoad, kv_streams, load_endpoints, worker_url};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What discovery learned about a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Discovery {
    pub endpoints: Vec<LoadEndpoint>,
    /// Why the worker is priced on in-flight only (no range — with the engine's own reason when it
    /// gives one —, no descriptor, or discovery failed).
    pub no_load_reason: Option<String>,
    /// Its KV-event streams, or why it has none (then its cache is not indexed).
    pub kv: Result<KvStreams, String>,
    /// Without load sockets: the HTTP load source it serves (`/v1/loads` or `/metrics`), if any.
    /// `no_load_reason` still says why there is no push; the fleet polls unless polling is off.
    pub poll: Option<Polled>,
    /// What it serves ([`crate::models`]), or why that is not known.
    pub models: Result<crate::models::ServedModels, crate::models::fetch::ModelsError>,
    /// Its PD role and bootstrap port, as `/server_info` advertises them ([`crate::pd::advertised`];
    /// `None`: not said, or unreadable).
    pub pd: Option<(crate::pd::Role, crate::pd::BootstrapPort)>,
}

impl Discovery {
    /// A discovery that found nothing, for `reason`.
    pub fn nothing(reason: String) -> Self {
        Discovery {
            endpoints: Vec::new(),
            kv: Err(reason.clone()),
            no_load_reason: Some(reason.clone()),
            poll: None,
            models: Err(reason.into()),
            pd: None,
        }
    }

    /// libzmq sockets its subscriptions may hold: one per load rank, and per KV rank a SUB and,
    /// while a replay runs, a DEALER.
    pub fn sockets(&self) -> usize {
        self.endpoints.len() + self.kv.as_ref().map_or(0, |k| 2 * k.endpoints.len())
    }

    /// Its KV-event streams (ranks), 0 without.
    pub fn kv_ranks(&self) -> usize {
        self.kv.as_ref().map_or(0, |k| k.endpoints.len())
    }
}

/// How discovery may fetch: attempts, the budget of each attempt, and where refusals count.
#[derive(Debug, Clone)]
pub struct DiscoveryLimits {
    /// Attempts at `GET /server_info` (`--discovery-attempts`).
    pub attempts: u32,
    /// One attempt: connect to last body byte, and the body's size
    /// ([`Budgets::discovery_timeout`], [`Budgets::discovery_body_bytes`]).
    pub fetch: FetchBudget,
    /// Fleet-wide refusal counts (there is no `Worker` yet during discovery).
    pub refusals: Option<Arc<RefusalCounts>>,
    /// The load-source probe of a worker without load sockets: [`PROBE_TIMEOUT`] per request,
    /// the poll body budget ([`Budgets::poll_body_bytes`]).
    pub probe: crate::poll::PollConfig,
}

impl DiscoveryLimits {
    /// `attempts` attempts within `budgets`, counting refusals nowhere.
    pub fn new(attempts: u32, budgets: &Budgets) -> Self {
        DiscoveryLimits {
            attempts,
            fetch: FetchBudget {
                timeout: budgets.discovery_timeout,
                max_body: budgets.discovery_body_bytes,
            },
            refusals: None,
            probe: crate::poll::PollConfig {
                timeout: PROBE_TIMEOUT,
                max_body_bytes: budgets.poll_body_bytes,
                max_ranks: budgets.max_ranks,
                ..Default::default()
            },
        }
    }
}

/// Why `GET /server_info` gave no body to interpret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// A 4xx, an oversized body or an unusable URL: asking again will not help.
    #[error("{0}; not retried")]
    Final(String),
    #[error("discovery failed after {attempts} attempts: {last}")]
    GaveUp { attempts: u32, last: String },
}

/// Fetches `url`'s `/server_info` body with up to `limits.attempts` tries and exponential
/// backoff, each try bounded in time and size ([`crate::peer_http`]). 4xx answers and oversized
/// bodies are not retried; a refused answer is counted in `limits.refusals`.
pub async fn fetch_server_info(
    client: &HttpClient,
    url: &str,
    limits: &DiscoveryLimits,
) -> Result<Bytes, FetchError> {
    let attempts = limits.attempts.max(1);
    let mut delay = Duration::from_millis(100);
    let mut last = String::new();
    for attempt in 0..attempts {
        if attempt > 0 {
            // ±50% jitter: workers that failed together do not retry together.
            let h = (url.len() as u64 ^ attempt as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ Instant::now().elapsed().subsec_nanos() as u64;
            let ms = delay.as_millis() as u64;
            tokio::time::sleep(Duration::from_millis(ms / 2 + (h >> 33) % ms.max(1))).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
        match fetch_once(client, url, limits).await {
            Ok(body) => return Ok(body),
            Err(Retry::No(why)) => return Err(FetchError::Final(why)),
            Err(Retry::Yes(why)) => last = why,
        }
    }
    Err(FetchError::GaveUp { attempts, last })
}

/// Whether a failed fetch is worth another try, and what went wrong.
enum Retry {
    Yes(String),
    No(String),
}

async fn fetch_once(
    client: &HttpClient,
    url: &str,
    limits: &DiscoveryLimits,
) -> Result<Bytes, Retry> {
    let answer = match bounded_get(client, &format!("{url}/server_info"), limits.fetch).await {
        Ok(a) => a,
        Err(e) => {
            let refusal = e.refusal();
            if let (Some(r), Some(counts)) = (refusal, &limits.refusals) {
                counts.add(r, 1);
            }
            return Err(match (&e, refusal) {
                (PeerFetchError::BadUrl { .. }, _) => Retry::No(format!("GET /server_info: {e}")),
                (PeerFetchError::TooLarge { .. }, Some(r)) => {
                    Retry::No(format!("GET /server_info refused ({}): {e}", r.as_str()))
                }
                (_, Some(r)) => {
                    Retry::Yes(format!("GET /server_info refused ({}): {e}", r.as_str()))
                }
                _ => Retry::Yes(format!("GET /server_info: {e}")),
            });
        }
    };
    let status = answer.status;
    if status.is_client_error() {
        return Err(Retry::No(format!("GET /server_info answered {status}")));
    }
    if !status.is_success() {
        return Err(Retry::Yes(format!("GET /server_info answered {status}")));
    }
    Ok(answer.body)
}

/// Bound on each request of a load-source probe at discovery.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Discovers `url`'s load source: fetches `/server_info` (bounded retries) and reads it with the
/// protocol's one discovery function (a malformed body is not retried). Push (load sockets) is
/// preferred; without them the worker is probed for `/v1/loads`, then `/metrics`
/// ([`crate::poll::probe`]); with neither it is priced on in-flight, with every reason.
pub async fn discover(client: &HttpClient, url: &str, limits: &DiscoveryLimits) -> Discovery {
    let (mut d, info) = discover_push(client, url, limits).await;
    use crate::models::fetch::{ServerInfo, served_models};
    // A worker that answered /server_info with a 4xx may still list its models (vLLM has no
    // /server_info); one that stalled, failed or was refused is not asked again.
    let models = match &info {
        Info::Body(b) => served_models(client, url, ServerInfo::Body(b), limits.fetch).await,
        Info::Absent => served_models(client, url, ServerInfo::Failed, limits.fetch).await,
        Info::Failed(why) => Err(why.clone().into()),
    };
    d.models = models;
    if d.endpoints.is_empty() {
        match crate::poll::probe_with(client, url, &limits.probe).await {
            Ok(p) => d.poll = Some(p),
            Err((why, refused)) => {
                if let Some(counts) = &limits.refusals {
                    refused.into_iter().for_each(|r| counts.add(r, 1));
                }
                let push = d.no_load_reason.take().unwrap_or_default();
                d.no_load_reason = Some(format!("{push}; no HTTP load source: {why}"));
            }
        }
    }
    d
}

/// The load sockets `/server_info` advertises, or why none.
/// What discovery's `/server_info` gave.
enum Info {
    Body(Bytes),
    /// A 4xx: the worker has no such route.
    Absent,
    /// Anything else (the reason).
    Failed(String),
}

async fn discover_push(
    client: &HttpClient,
    url: &str,
    limits: &DiscoveryLimits,
) -> (Discovery, Info) {
    let body = match fetch_server_info(client, url, limits).await {
        Ok(b) => b,
        Err(e) => {
            let info = match &e {
                FetchError::Final(why) if why.contains(" answered 4") => Info::Absent,
                _ => Info::Failed(e.to_string()),
            };
            return (Discovery::nothing(e.to_string()), info);
        }
    };
    let kv = kv_streams(url, &body).map_err(|e| e.to_string());
    let (endpoints, no_load_reason) = match load_endpoints(url, &body) {
        Ok(endpoints) => (endpoints, None),
        Err(e @ NoLoad::Malformed(_)) => (Vec::new(), Some(format!("{e}; not retried"))),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let pd = crate::pd::advertised(&body)
        .inspect_err(|e| tracing::warn!(worker = url, "PD role not read: {e}"))
        .ok();
    let d = Discovery {
        endpoints,
        no_load_reason,
        kv,
        poll: None,
        models: Err(String::from("not read").into()),
        pd,
    };
    (d, Info::Body(body))
}

/// Checks a worker URL (see [`loadlink_wire::discovery::worker_url`]).
pub fn validate_url(url: &str) -> Result<String, String> {
    worker_url(url).map_err(|e| e.to_string())
}
