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

mod dns;
mod reconcile;

pub use dns::{DnsTarget, url_of};
pub use reconcile::Reconciler;

use crate::state::AppState;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

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

/// Starts one task per configured source; they end when the router stops.
pub fn spawn(st: &Arc<AppState>) -> Vec<tokio::task::JoinHandle<()>> {
    let m = &st.cfg.membership;
    let mut tasks = Vec::new();
    if let Some(path) = m.urls_file.clone() {
        tasks.push(tokio::spawn(watch_file(st.clone(), path)));
    }
    if !m.dns.is_empty() {
        tasks.push(tokio::spawn(dns::watch(st.clone())));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_parse_with_errors_that_name_the_line() {
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
