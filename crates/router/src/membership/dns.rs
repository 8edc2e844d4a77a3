//! DNS membership: each `--worker-dns` target is resolved every interval, all at once, and judged
//! on its own. Its A/AAAA (or SRV, then A/AAAA) records are its workers; NXDOMAIN or a name
//! without records is an empty answer (applied after the configured count, see
//! [`super::EmptyAnswers`]); a failed lookup keeps the target's last good answer, so one failing
//! name never freezes the others.

use super::{EmptyAnswers, FailureLog, MembershipConfig, Reconciler};
use crate::state::AppState;
use hickory_resolver::TokioAsyncResolver;
use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig, ResolverOpts};
use hickory_resolver::error::{ResolveError, ResolveErrorKind};
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
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

/// `http://IP:PORT`, with brackets for IPv6.
pub fn url_of(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("http://{v4}:{port}"),
        IpAddr::V6(v6) => format!("http://[{v6}]:{port}"),
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

/// Follows every configured DNS target until the router stops.
pub(super) async fn watch(st: Arc<AppState>) {
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
    fn targets_parse_with_errors_that_name_the_input() {
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
        assert_eq!(url_of("::1".parse().unwrap(), 8), "http://[::1]:8");
    }
}
