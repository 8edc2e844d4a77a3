//! Fleet membership that follows the deployment: a watched file of worker URLs, and DNS names
//! whose records are the workers (a Kubernetes headless Service lists its ready pods as A/AAAA
//! records, and as SRV records with their ports).
//!
//! Each source periodically produces the set of URLs it wants; [`Reconciler`] adds what is new
//! (discovery and subscriptions, as `POST /workers` does) and removes what the source added
//! earlier and no longer lists. A removed worker only leaves the pick list: requests already on it
//! hold it and finish. A source that fails to answer (DNS timeout, unreadable file) changes
//! nothing: a transient resolver error must not empty a fleet. Failures are counted, logged on the
//! first occurrence and again when the source recovers.

use crate::fleet::discover;
use crate::state::AppState;
use hickory_resolver::TokioAsyncResolver;
use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig, ResolverOpts};
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// A DNS name whose records are workers (`--worker-dns NAME:PORT`, or `srv:NAME` for SRV).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsTarget {
    pub name: String,
    /// The workers' HTTP port for A/AAAA records; `None` for SRV (the records carry it).
    pub port: Option<u16>,
}

impl DnsTarget {
    /// `NAME:PORT` (A/AAAA records) or `srv:NAME` (SRV records).
    pub fn parse(s: &str) -> Result<Self, String> {
        if let Some(name) = s.strip_prefix("srv:") {
            if name.is_empty() {
                return Err(format!("--worker-dns {s:?}: expected srv:NAME"));
            }
            return Ok(DnsTarget {
                name: name.into(),
                port: None,
            });
        }
        let (name, port) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("--worker-dns {s:?}: expected NAME:PORT or srv:NAME"))?;
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("--worker-dns {s:?}: PORT must be 1-65535"))?;
        if name.is_empty() {
            return Err(format!("--worker-dns {s:?}: NAME is empty"));
        }
        Ok(DnsTarget {
            name: name.into(),
            port: Some(port),
        })
    }
}

/// How membership is configured (part of `RouterConfig`).
#[derive(Debug, Clone, Default)]
pub struct MembershipConfig {
    /// `--worker-urls-file`: one URL per line, `#` comments; re-read when it changes.
    pub urls_file: Option<PathBuf>,
    /// `--worker-dns`, each re-resolved every `dns_interval_ms`.
    pub dns: Vec<DnsTarget>,
    /// `--dns-server IP:PORT`; default: the system's resolver configuration.
    pub dns_server: Option<SocketAddr>,
    pub dns_interval_ms: u64,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct MembershipStats {
    pub refreshes: AtomicU64,
    pub errors: AtomicU64,
    pub added: AtomicU64,
    pub removed: AtomicU64,
}

/// Applies a source's wanted set to the fleet, remembering what that source added.
pub struct Reconciler {
    st: Arc<AppState>,
    managed: BTreeSet<String>,
}

impl Reconciler {
    pub fn new(st: Arc<AppState>) -> Self {
        Reconciler {
            st,
            managed: BTreeSet::new(),
        }
    }

    /// Adds the wanted workers the fleet lacks and removes the ones this source added before and
    /// no longer wants.
    pub async fn apply(&mut self, wanted: &BTreeSet<String>) {
        let stats = &self.st.membership;
        for url in wanted.difference(&self.managed.clone()) {
            if !self.st.fleet.contains(url) {
                let d = discover(&self.st.client, url, self.st.cfg.discovery_attempts).await;
                self.st.fleet.add(url, d);
                stats.added.fetch_add(1, Relaxed);
                tracing::info!(worker = %url, "membership: added");
            }
            self.managed.insert(url.clone());
        }
        let gone: Vec<String> = self.managed.difference(wanted).cloned().collect();
        for url in gone {
            self.managed.remove(&url);
            let st = self.st.clone();
            let u = url.clone();
            // Unsubscribing joins the ingest: not on the executor.
            let _ = tokio::task::spawn_blocking(move || st.fleet.remove(&u)).await;
            stats.removed.fetch_add(1, Relaxed);
            tracing::info!(worker = %url, "membership: removed");
        }
    }
}

/// The URLs listed in a worker-URLs file: one per line, blank lines and `#` comments skipped.
pub fn parse_urls_file(text: &str) -> Result<BTreeSet<String>, String> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i, l.split('#').next().unwrap_or("").trim()))
        .filter(|(_, l)| !l.is_empty())
        .map(|(i, l)| crate::fleet::validate_url(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

/// `http://IP:PORT`, with brackets for IPv6.
pub fn url_of(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("http://{v4}:{port}"),
        IpAddr::V6(v6) => format!("http://[{v6}]:{port}"),
    }
}

/// Starts one task per configured source; they end when the router stops.
pub fn spawn(st: &Arc<AppState>) -> Vec<tokio::task::JoinHandle<()>> {
    let m = &st.cfg.membership;
    let mut tasks = Vec::new();
    if let Some(path) = m.urls_file.clone() {
        tasks.push(tokio::spawn(watch_file(st.clone(), path)));
    }
    if !m.dns.is_empty() {
        tasks.push(tokio::spawn(watch_dns(st.clone())));
    }
    tasks
}

/// Logs a source's failure when it starts failing and its recovery when it stops.
struct FailureLog {
    failing: bool,
}

impl FailureLog {
    fn record(&mut self, st: &AppState, source: &str, result: &Result<(), String>) {
        match result {
            Err(e) => {
                st.membership.errors.fetch_add(1, Relaxed);
                if !self.failing {
                    tracing::warn!("membership {source}: {e}; keeping the current workers");
                }
                self.failing = true;
            }
            Ok(()) if self.failing => {
                tracing::info!("membership {source}: answering again");
                self.failing = false;
            }
            Ok(()) => {}
        }
    }
}

async fn watch_file(st: Arc<AppState>, path: PathBuf) {
    let mut rec = Reconciler::new(st.clone());
    let mut last: Option<String> = None;
    let mut log = FailureLog { failing: false };
    let source = format!("file {}", path.display());
    loop {
        let result = match tokio::fs::read_to_string(&path).await {
            Err(e) => Err(format!("cannot read it: {e}")),
            Ok(text) if last.as_deref() == Some(text.as_str()) => Ok(()),
            Ok(text) => match parse_urls_file(&text) {
                Err(e) => Err(e),
                Ok(wanted) => {
                    st.membership.refreshes.fetch_add(1, Relaxed);
                    rec.apply(&wanted).await;
                    last = Some(text);
                    Ok(())
                }
            },
        };
        log.record(&st, &source, &result);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn resolver(m: &MembershipConfig) -> Result<TokioAsyncResolver, String> {
    let mut opts = ResolverOpts::default();
    // The point is to see record changes: never serve a cached answer past one interval.
    opts.cache_size = 0;
    opts.timeout = Duration::from_secs(2);
    match m.dns_server {
        Some(addr) => {
            let group = NameServerConfigGroup::from_ips_clear(&[addr.ip()], addr.port(), true);
            let cfg = ResolverConfig::from_parts(None, vec![], group);
            Ok(TokioAsyncResolver::tokio(cfg, opts))
        }
        None => TokioAsyncResolver::tokio_from_system_conf()
            .map_err(|e| format!("reading the system resolver configuration: {e}")),
    }
}

/// Every worker URL the targets' records name now.
async fn resolve_all(
    r: &TokioAsyncResolver,
    targets: &[DnsTarget],
) -> Result<BTreeSet<String>, String> {
    let mut urls = BTreeSet::new();
    for t in targets {
        match t.port {
            Some(port) => {
                let ips = r
                    .lookup_ip(t.name.as_str())
                    .await
                    .map_err(|e| format!("{}: {e}", t.name))?;
                urls.extend(ips.iter().map(|ip| url_of(ip, port)));
            }
            None => {
                let srv = r
                    .srv_lookup(t.name.as_str())
                    .await
                    .map_err(|e| format!("srv:{}: {e}", t.name))?;
                for s in srv.iter() {
                    let ips = r
                        .lookup_ip(s.target().clone())
                        .await
                        .map_err(|e| format!("{} (SRV target of {}): {e}", s.target(), t.name))?;
                    urls.extend(ips.iter().map(|ip| url_of(ip, s.port())));
                }
            }
        }
    }
    Ok(urls)
}

async fn watch_dns(st: Arc<AppState>) {
    let m = st.cfg.membership.clone();
    let mut log = FailureLog { failing: false };
    let r = match resolver(&m) {
        Ok(r) => r,
        Err(e) => {
            log.record(&st, "dns", &Err(e));
            return;
        }
    };
    let mut rec = Reconciler::new(st.clone());
    loop {
        let result = match resolve_all(&r, &m.dns).await {
            Ok(wanted) => {
                st.membership.refreshes.fetch_add(1, Relaxed);
                rec.apply(&wanted).await;
                Ok(())
            }
            Err(e) => Err(e),
        };
        log.record(&st, "dns", &result);
        tokio::time::sleep(Duration::from_millis(m.dns_interval_ms.max(100))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_files_parse_with_errors_that_name_the_input() {
        assert_eq!(
            DnsTarget::parse("engines.ns.svc:30000").unwrap(),
            DnsTarget {
                name: "engines.ns.svc".into(),
                port: Some(30000)
            }
        );
        assert_eq!(
            DnsTarget::parse("srv:_http._tcp.engines").unwrap().port,
            None
        );
        assert!(
            DnsTarget::parse("engines")
                .unwrap_err()
                .contains("NAME:PORT")
        );
        assert!(DnsTarget::parse("e:0").unwrap_err().contains("1-65535"));
        let urls = parse_urls_file("# fleet\nhttp://a:1/\n\n  http://b:2 # second\n").unwrap();
        assert_eq!(
            urls.into_iter().collect::<Vec<_>>(),
            ["http://a:1", "http://b:2"]
        );
        assert!(
            parse_urls_file("http://a:1\nftp://x\n")
                .unwrap_err()
                .starts_with("line 2")
        );
        assert_eq!(url_of("::1".parse().unwrap(), 8), "http://[::1]:8");
    }
}
