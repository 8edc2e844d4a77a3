//! Fleet membership that follows the deployment: a watched file of worker URLs, and DNS names
//! whose records are the workers (a Kubernetes headless Service lists its ready pods as A/AAAA
//! records, and as SRV records with their ports).
//!
//! Each source periodically produces the set of URLs it wants; its [`Reconciler`] adds what is new
//! (discovery and subscriptions, as `POST /workers` does) and removes what *it* added earlier and
//! no longer lists. A URL already in the fleet when a source first lists it (a `--worker-urls`
//! worker, one added through the admin API or by another source) is not the source's, and the
//! source never removes it.
//!
//! Adds run concurrently (at most `discovery_concurrency` discoveries per source, each bounded by
//! the discovery budget) in their own tasks, so removals, and the next refresh, never wait behind
//! an unreachable record. A removed worker only leaves the pick list: requests already on it hold
//! it and finish.
//!
//! A source that fails to answer (DNS timeout, SERVFAIL, unreadable file) changes nothing: a
//! transient resolver error must not empty a fleet. An *empty* answer (NXDOMAIN, no records, a file
//! without URLs) is an answer: "no workers", applied once it has been given
//! `Budgets::membership_empty_answers` times in a row (a Service scaled to zero loses its pods;
//! one odd answer does not empty the fleet). DNS names are resolved and judged one by one: a
//! failing name keeps its last good answer while the others update. Failures are counted, logged
//! on the first occurrence and again when the source recovers.

use crate::discovery::DiscoveryLimits;
use crate::fleet::discover;
use crate::state::AppState;
use hickory_resolver::TokioAsyncResolver;
use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig, ResolverOpts};
use hickory_resolver::error::{ResolveError, ResolveErrorKind};
use std::collections::{BTreeSet, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
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

/// What one source owns: the workers it added, and the adds still discovering.
#[derive(Debug, Default)]
struct Owned {
    /// In the fleet because this source added them.
    added: BTreeSet<String>,
    /// Adds in flight; taking a URL out of this set cancels its add.
    adding: BTreeSet<String>,
}

/// Applies a source's wanted set to the fleet, remembering what that source added. Dropping it
/// (the router stops) cancels the adds in flight.
pub struct Reconciler {
    st: Arc<AppState>,
    owned: Arc<Mutex<Owned>>,
    adds: tokio::task::JoinSet<()>,
    discoveries: Arc<tokio::sync::Semaphore>,
}

impl Reconciler {
    pub fn new(st: Arc<AppState>) -> Self {
        let discoveries = Arc::new(tokio::sync::Semaphore::new(
            st.cfg.discovery_concurrency.max(1),
        ));
        Reconciler {
            st,
            owned: Arc::default(),
            adds: tokio::task::JoinSet::new(),
            discoveries,
        }
    }

    /// Starts adding the wanted workers the fleet lacks (without waiting for them) and removes
    /// the ones this source added and no longer wants; adds of URLs no longer wanted are
    /// cancelled. Workers this source did not add are left alone.
    pub async fn apply(&mut self, wanted: &BTreeSet<String>) {
        while self.adds.try_join_next().is_some() {}
        let present: HashSet<String> = self
            .st
            .fleet
            .workers()
            .iter()
            .map(|w| w.url.clone())
            .collect();
        let (new, gone) = {
            let mut o = self.owned.lock().unwrap_or_else(|p| p.into_inner());
            // Removed by someone else (the admin API): no longer ours; listed again, added again.
            o.added.retain(|u| present.contains(u));
            let gone: Vec<String> = o.added.difference(wanted).cloned().collect();
            for u in &gone {
                o.added.remove(u);
            }
            o.adding.retain(|u| wanted.contains(u));
            let new: Vec<String> = wanted
                .iter()
                .filter(|u| !present.contains(*u) && !o.adding.contains(*u))
                .cloned()
                .collect();
            o.adding.extend(new.iter().cloned());
            (new, gone)
        };
        for url in new {
            self.adds.spawn(add(
                self.st.clone(),
                self.owned.clone(),
                self.discoveries.clone(),
                url,
            ));
        }
        if gone.is_empty() {
            return;
        }
        let st = self.st.clone();
        // Unsubscribing joins the ingest: not on the executor.
        let _ = tokio::task::spawn_blocking(move || {
            for url in gone {
                st.fleet.remove(&url);
                st.membership.removed.fetch_add(1, Relaxed);
                tracing::info!(worker = %url, "membership: removed");
            }
        })
        .await;
    }

    /// The workers this source added and still wants (for tests and diagnostics).
    pub fn owned(&self) -> BTreeSet<String> {
        let o = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        o.added.clone()
    }
}

/// Discovers `url` and adds it, unless the add was cancelled meanwhile or someone else added the
/// URL first (then it is theirs).
async fn add(
    st: Arc<AppState>,
    owned: Arc<Mutex<Owned>>,
    discoveries: Arc<tokio::sync::Semaphore>,
    url: String,
) {
    let Ok(_permit) = discoveries.acquire_owned().await else {
        return;
    };
    let d = discover(&st.client, &url, &DiscoveryLimits::of(&st)).await;
    let mut o = owned.lock().unwrap_or_else(|p| p.into_inner());
    if !o.adding.remove(&url) || st.fleet.contains(&url) {
        return;
    }
    // Under the lock, so a concurrent `apply` sees the worker either adding or added.
    st.fleet.add(&url, d);
    o.added.insert(url.clone());
    st.membership.added.fetch_add(1, Relaxed);
    tracing::info!(worker = %url, "membership: added");
}

/// Turns a source's answers into the set to apply: a non-empty answer at once, an empty one after
/// `needed` in a row (until then the last non-empty answer stands).
#[derive(Debug, Clone, Default)]
pub struct EmptyAnswers {
    current: BTreeSet<String>,
    empties: u32,
}

impl EmptyAnswers {
    /// Records `answer`; the set the source wants now.
    pub fn answer(&mut self, answer: BTreeSet<String>, needed: u32) -> &BTreeSet<String> {
        if answer.is_empty() {
            self.empties = self.empties.saturating_add(1);
            if self.empties >= needed {
                self.current.clear();
            }
        } else {
            self.empties = 0;
            self.current = answer;
        }
        &self.current
    }

    /// The set the source wants now.
    pub fn current(&self) -> &BTreeSet<String> {
        &self.current
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
    let mut answers = EmptyAnswers::default();
    let needed = st.cfg.budgets.membership_empty_answers;
    let mut log = FailureLog { failing: false };
    let source = format!("file {}", path.display());
    loop {
        let result = match tokio::fs::read_to_string(&path).await {
            Err(e) => Err(format!("cannot read it: {e}")),
            Ok(text) => match parse_urls_file(&text) {
                Err(e) => Err(e),
                Ok(listed) => {
                    st.membership.refreshes.fetch_add(1, Relaxed);
                    let wanted = answers.answer(listed, needed).clone();
                    rec.apply(&wanted).await;
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

/// Whether a resolver error is an answer with no records (NXDOMAIN, or the name exists without
/// records of the type): "no workers", not a failure.
fn is_empty_answer(e: &ResolveError) -> bool {
    matches!(e.kind(), ResolveErrorKind::NoRecordsFound { response_code, .. }
        if matches!(*response_code, hickory_resolver::proto::op::ResponseCode::NXDomain
            | hickory_resolver::proto::op::ResponseCode::NoError))
}

/// The IPs `name` has; none for an empty answer.
async fn ips_of(r: &TokioAsyncResolver, name: &str) -> Result<Vec<IpAddr>, String> {
    match r.lookup_ip(name).await {
        Ok(ips) => Ok(ips.iter().collect()),
        Err(e) if is_empty_answer(&e) => Ok(Vec::new()),
        Err(e) => Err(format!("{name}: {e}")),
    }
}

/// Every worker URL one target's records name now (empty for an empty answer).
async fn resolve_one(r: &TokioAsyncResolver, t: &DnsTarget) -> Result<BTreeSet<String>, String> {
    match t.port {
        Some(port) => Ok(ips_of(r, &t.name)
            .await?
            .into_iter()
            .map(|ip| url_of(ip, port))
            .collect()),
        None => {
            let srv = match r.srv_lookup(t.name.as_str()).await {
                Ok(srv) => srv,
                Err(e) if is_empty_answer(&e) => return Ok(BTreeSet::new()),
                Err(e) => return Err(format!("srv:{}: {e}", t.name)),
            };
            let mut urls = BTreeSet::new();
            for s in srv.iter() {
                let target = s.target().to_utf8();
                let ips = ips_of(r, &target)
                    .await
                    .map_err(|e| format!("{e} (SRV target of {})", t.name))?;
                urls.extend(ips.into_iter().map(|ip| url_of(ip, s.port())));
            }
            Ok(urls)
        }
    }
}

/// One DNS target's standing: its answers so far and whether it is failing.
struct NameState {
    answers: EmptyAnswers,
    log: FailureLog,
}

async fn watch_dns(st: Arc<AppState>) {
    let m = st.cfg.membership.clone();
    let needed = st.cfg.budgets.membership_empty_answers;
    let mut log = FailureLog { failing: false };
    let r = match resolver(&m) {
        Ok(r) => r,
        Err(e) => {
            log.record(&st, "dns", &Err(e));
            return;
        }
    };
    let mut names: Vec<NameState> = m
        .dns
        .iter()
        .map(|_| NameState {
            answers: EmptyAnswers::default(),
            log: FailureLog { failing: false },
        })
        .collect();
    let mut rec = Reconciler::new(st.clone());
    loop {
        // Every name at once: a slow name does not delay the others' answers.
        let results =
            futures_util::future::join_all(m.dns.iter().map(|t| resolve_one(&r, t))).await;
        let mut wanted = BTreeSet::new();
        for ((t, name), result) in m.dns.iter().zip(&mut names).zip(results) {
            let logged = match result {
                Ok(urls) => {
                    name.answers.answer(urls, needed);
                    Ok(())
                }
                // A failing name keeps its last good answer.
                Err(e) => Err(e),
            };
            name.log
                .record(&st, &format!("dns {}", describe(t)), &logged);
            wanted.extend(name.answers.current().iter().cloned());
        }
        st.membership.refreshes.fetch_add(1, Relaxed);
        rec.apply(&wanted).await;
        tokio::time::sleep(Duration::from_millis(m.dns_interval_ms.max(100))).await;
    }
}

/// A target as it was configured (`NAME:PORT` or `srv:NAME`).
fn describe(t: &DnsTarget) -> String {
    match t.port {
        Some(p) => format!("{}:{p}", t.name),
        None => format!("srv:{}", t.name),
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

    #[test]
    fn an_empty_answer_applies_after_the_configured_count() {
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let mut a = EmptyAnswers::default();
        assert_eq!(a.answer(set(&["http://a:1"]), 3), &set(&["http://a:1"]));
        assert_eq!(a.answer(set(&[]), 3), &set(&["http://a:1"]));
        assert_eq!(a.answer(set(&[]), 3), &set(&["http://a:1"]));
        assert_eq!(
            a.answer(set(&[]), 3),
            &set(&[]),
            "the third empty answer applies"
        );
        assert_eq!(a.answer(set(&["http://b:2"]), 3), &set(&["http://b:2"]));
        assert_eq!(
            a.answer(set(&[]), 3),
            &set(&["http://b:2"]),
            "the count restarts"
        );
        assert_eq!(a.answer(set(&[]), 0), &set(&[]), "0: at once");
    }
}
