//! The worker set: discovery from `/server_info`, one subscription per worker, add/remove at
//! runtime. The request path reads the set through an `ArcSwap` (no lock); changes build a new
//! list and swap it in.

use crate::book::{LoadSignal, Worker};
use crate::policy::View;
use arc_swap::ArcSwap;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use loadlink_wire::descriptor::{LoadEndpoint, parse_server_info};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub type HttpClient = Client<HttpConnector, Full<axum::body::Bytes>>;

/// Builds the pooled upstream client (TCP_NODELAY: no Nagle stall on small SSE events).
pub fn http_client() -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(Duration::from_secs(2)));
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .build(conn)
}

/// What discovery learned about a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    pub endpoints: Vec<LoadEndpoint>,
    /// Why the worker is priced on in-flight only (no range, no descriptor, discovery failed).
    pub no_load_reason: Option<String>,
}

/// Checks a worker URL: http(s)://HOST[:PORT] with no path beyond `/`.
pub fn validate_url(url: &str) -> Result<String, String> {
    let u = url.trim().trim_end_matches('/');
    let rest = u
        .strip_prefix("http://")
        .or_else(|| u.strip_prefix("https://"))
        .ok_or_else(|| {
            format!("worker URL {url:?}: expected http://HOST:PORT or https://HOST:PORT")
        })?;
    if rest.is_empty()
        || rest.starts_with(':')
        || rest.contains('/')
        || rest.contains(char::is_whitespace)
    {
        return Err(format!(
            "worker URL {url:?}: expected a host (and optional port) and no path"
        ));
    }
    Ok(u.to_string())
}

/// The host part of a validated worker URL (brackets kept for IPv6).
pub fn url_host(url: &str) -> &str {
    let rest = url.split("://").nth(1).unwrap_or(url);
    if rest.starts_with('[') {
        return rest
            .split(']')
            .next()
            .map_or(rest, |h| &rest[..h.len() + 1]);
    }
    rest.rsplit_once(':').map_or(rest, |(h, _)| h)
}

/// Reads `/server_info` with bounded retries and backoff; 4xx and bad JSON are not retried.
pub async fn discover(client: &HttpClient, url: &str, attempts: u32) -> Discovery {
    let mut delay = Duration::from_millis(100);
    let mut last = String::new();
    for attempt in 0..attempts.max(1) {
        if attempt > 0 {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
        let req = match hyper::Request::get(format!("{url}/server_info")).body(Full::default()) {
            Ok(r) => r,
            Err(e) => return failed(format!("bad worker URL: {e}")),
        };
        let resp = match tokio::time::timeout(Duration::from_secs(5), client.request(req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                last = format!("GET /server_info: {e}");
                continue;
            }
            Err(_) => {
                last = "GET /server_info: timed out after 5 s".into();
                continue;
            }
        };
        let status = resp.status();
        let body = match http_body_util::BodyExt::collect(resp.into_body()).await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                last = format!("GET /server_info: reading the body: {e}");
                continue;
            }
        };
        if status.is_client_error() {
            return failed(format!("GET /server_info answered {status}; not retried"));
        }
        if !status.is_success() {
            last = format!("GET /server_info answered {status}");
            continue;
        }
        return match parse_server_info(&body) {
            Err(e) => failed(format!("{e}; not retried")),
            Ok(None) => {
                failed("the worker advertises no kv_events publisher (kv_events is null)".into())
            }
            Ok(Some(d)) => {
                let endpoints = d.load_endpoints(url_host(url));
                let reason = endpoints.is_empty().then(|| {
                    "the worker advertises no load_endpoint_port_base (it does not report load)"
                        .to_string()
                });
                Discovery {
                    endpoints,
                    no_load_reason: reason,
                }
            }
        };
    }
    failed(format!(
        "discovery failed after {attempts} attempts: {last}"
    ))
}

fn failed(reason: String) -> Discovery {
    Discovery {
        endpoints: Vec::new(),
        no_load_reason: Some(reason),
    }
}

/// The live worker set.
pub struct Fleet {
    workers: ArcSwap<Vec<Arc<Worker>>>,
    subs: Mutex<HashMap<String, crate::subscribe::Subscription>>,
    ctx: zmq::Context,
    epoch: Instant,
}

impl Default for Fleet {
    fn default() -> Self {
        Fleet {
            workers: ArcSwap::from_pointee(Vec::new()),
            subs: Mutex::default(),
            ctx: zmq::Context::new(),
            epoch: Instant::now(),
        }
    }
}

impl Fleet {
    /// The current workers (a cheap snapshot of the list).
    pub fn workers(&self) -> Arc<Vec<Arc<Worker>>> {
        self.workers.load_full()
    }

    pub fn contains(&self, url: &str) -> bool {
        self.workers.load().iter().any(|w| w.url == url)
    }

    /// Adds (or replaces) a worker from its discovery result and subscribes to its ranks.
    pub fn add(&self, url: &str, d: Discovery) -> Arc<Worker> {
        let worker = Arc::new(Worker::new(
            url.to_string(),
            d.endpoints.len(),
            d.no_load_reason.clone(),
            self.epoch,
        ));
        if let Some(r) = &d.no_load_reason {
            tracing::warn!(worker = url, "routing on in-flight only: {r}");
        }
        let sub = if d.endpoints.is_empty() {
            None
        } else {
            match crate::subscribe::subscribe(&self.ctx, worker.clone(), d.endpoints) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(worker = url, "cannot subscribe to its load sockets: {e}");
                    None
                }
            }
        };
        let old = {
            let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
            let old = subs.remove(url);
            if let Some(s) = sub {
                subs.insert(url.to_string(), s);
            }
            old
        };
        drop(old);
        self.workers.rcu(|ws| {
            let mut v: Vec<Arc<Worker>> = ws.iter().filter(|w| w.url != url).cloned().collect();
            v.push(worker.clone());
            v
        });
        worker
    }

    /// Removes a worker; in-flight requests on it finish normally. Returns whether it existed.
    pub fn remove(&self, url: &str) -> bool {
        let existed = self.contains(url);
        self.workers.rcu(|ws| {
            ws.iter()
                .filter(|w| w.url != url)
                .cloned()
                .collect::<Vec<_>>()
        });
        let sub = self
            .subs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(url);
        drop(sub);
        existed
    }
}

/// The policy's view of a worker list.
pub struct FleetView<'a> {
    pub workers: &'a [Arc<Worker>],
    pub signal: LoadSignal,
    pub freshness_ms: u64,
    /// Bitmask of workers already tried for this request (first 64).
    pub tried: u64,
    /// The request's `now` ([`Worker::now_ms`]), read once per pick.
    pub now_ms: u64,
}

impl<'a> FleetView<'a> {
    pub fn new(workers: &'a [Arc<Worker>], signal: LoadSignal, freshness_ms: u64) -> Self {
        let now_ms = workers.first().map_or(0, |w| w.now_ms());
        FleetView {
            workers,
            signal,
            freshness_ms,
            tried: 0,
            now_ms,
        }
    }

    /// Leaves worker `i` out of the next picks of this request (it was tried and failed).
    pub fn exclude(&mut self, i: usize) {
        if i < 64 {
            self.tried |= 1 << i;
        }
    }
}

impl View for FleetView<'_> {
    fn len(&self) -> usize {
        self.workers.len()
    }
    #[inline]
    fn load(&self, i: usize) -> i64 {
        self.workers[i]
            .load_at(self.signal, self.freshness_ms, self.now_ms)
            .score
    }
    #[inline]
    fn available(&self, i: usize) -> bool {
        (i >= 64 || self.tried & (1 << i) == 0) && self.workers[i].available_at(self.now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_urls_are_checked() {
        assert_eq!(
            validate_url("http://10.0.0.1:30000/").unwrap(),
            "http://10.0.0.1:30000"
        );
        assert!(
            validate_url("ftp://x")
                .unwrap_err()
                .contains("expected http://")
        );
        assert!(validate_url("http://").is_err());
        assert!(validate_url("http://h:1/v1").is_err());
        assert_eq!(url_host("http://[::1]:30000"), "[::1]");
        assert_eq!(url_host("http://node-3:30000"), "node-3");
        assert_eq!(url_host("https://node-3"), "node-3");
    }
}
