//! Discovery as a pure function: from a worker's URL and its `/server_info` body to the load
//! sockets to dial (one per DP rank, with the wire generation), or the reason there are none.
//!
//! Why here: the router's fleet and `loadlink watch` both discover, and they used to disagree (only
//! `watch` showed the engine's own decline reason). Fetching `/server_info` is each caller's
//! business (retries, timeouts, runtime); what the body *means* is the protocol's, so it lives next
//! to the descriptor parser, with no I/O, and both callers share it. The worker-URL rules (scheme,
//! no path, the host to dial) live here too, for the same reason: the host a subscriber dials is
//! part of the discovery contract ("dial the worker URL's host, never `endpoint_host`").
//!
//! The same body also names the worker's KV-event streams ([`kv_streams`]): one PUB per DP rank
//! and, when advertised, its replay socket, plus the block size the hashes are taken over. A
//! worker without them is not an error: it simply has no precise cache view.
//!
//! KV streams dial the worker URL's host too, whatever `endpoint_host` says: the host is the
//! worker's to advertise, but the operator's to trust. A worker could otherwise point a router at
//! any internal host:port, or at another worker's publisher to claim that worker's cache. A
//! concrete advertised host is kept aside ([`KvStreams::advertised`]) so a router whose operator
//! trusts workers' advertisements can dial it ([`KvStreams::dial_advertised`]), if it is routable
//! ([`routable_host`]). (SGLang's router likewise replaces a wildcard host with the URL's.)

use crate::descriptor::{
    DescriptorError, KvEventsDescriptor, KvStreamEndpoint, LoadEndpoint, descriptor_of,
};
use std::net::IpAddr;
use thiserror::Error;

/// The `/server_info` field in which an engine says why it declined its load range (absent or
/// null when it publishes, or when publishing is simply off).
pub const DECLINE_REASON_FIELD: &str = "load_publish_decline_reason";

/// A worker URL that is not `http(s)://HOST[:PORT]`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WorkerUrlError {
    #[error("worker URL {0:?}: expected http://HOST:PORT or https://HOST:PORT")]
    Scheme(String),
    #[error("worker URL {0:?}: expected a host (and optional port) and no path")]
    HostOnly(String),
}

/// Checks a worker URL, `http(s)://HOST[:PORT]` with no path beyond `/`, and returns it without
/// the trailing `/`.
pub fn worker_url(url: &str) -> Result<String, WorkerUrlError> {
    let u = url.trim().trim_end_matches('/');
    let rest = u
        .strip_prefix("http://")
        .or_else(|| u.strip_prefix("https://"))
        .ok_or_else(|| WorkerUrlError::Scheme(url.to_string()))?;
    if rest.is_empty()
        || rest.starts_with(':')
        || rest.contains('/')
        || rest.contains(char::is_whitespace)
    {
        return Err(WorkerUrlError::HostOnly(url.to_string()));
    }
    Ok(u.to_string())
}

/// The host part of a checked worker URL (brackets kept for IPv6): the host to dial.
pub fn worker_host(url: &str) -> &str {
    let rest = url.split("://").nth(1).unwrap_or(url);
    if rest.starts_with('[') {
        return rest
            .split(']')
            .next()
            .map_or(rest, |h| &rest[..h.len() + 1]);
    }
    rest.rsplit_once(':').map_or(rest, |(h, _)| h)
}

/// Why a worker has no load sockets to dial.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NoLoad {
    /// The body is not a `/server_info` document this protocol understands.
    #[error("{0}")]
    Malformed(#[from] DescriptorError),
    #[error(
        "the worker advertises no kv_events publisher (kv_events is null), so it publishes no \
         load; start it with --kv-events-config"
    )]
    NoKvEvents,
    /// A KV publisher but no load range; `decline_reason` is the engine's own explanation.
    #[error(
        "the worker advertises no load_endpoint_port_base, so it does not report load{}",
        explain(decline_reason)
    )]
    NoLoadRange { decline_reason: Option<String> },
}

fn explain(decline_reason: &Option<String>) -> String {
    match decline_reason {
        Some(r) => format!(": {r}"),
        None => " (its --load-publish-endpoint is off, or the range was declined)".into(),
    }
}

/// The load sockets of the worker at `worker_url` (checked with [`worker_url`]) whose
/// `/server_info` body is `server_info`: one per DP rank, dialing the URL's host.
pub fn load_endpoints(worker_url: &str, server_info: &[u8]) -> Result<Vec<LoadEndpoint>, NoLoad> {
    let doc: serde_json::Value =
        serde_json::from_slice(server_info).map_err(|e| DescriptorError::Json(e.to_string()))?;
    let descriptor = descriptor_of(&doc)?.ok_or(NoLoad::NoKvEvents)?;
    let endpoints = descriptor.load_endpoints(worker_host(worker_url));
    if endpoints.is_empty() {
        let decline_reason = doc
            .get(DECLINE_REASON_FIELD)
            .and_then(serde_json::Value::as_str)
            .map(str::to_string);
        return Err(NoLoad::NoLoadRange { decline_reason });
    }
    Ok(endpoints)
}

/// A worker's KV-event streams: what a cache index subscribes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvStreams {
    /// Tokens per block (page): the hashes in the stream are taken over pages of this size.
    pub block_size: u64,
    /// The topic the PUB sockets publish on (SGLang's default: empty).
    pub topic: String,
    /// One per DP rank, rank order, dialing the worker URL's host.
    pub endpoints: Vec<KvStreamEndpoint>,
    /// The concrete host the worker advertised (`endpoint_host`) when it is not its URL's host,
    /// with the endpoints it would have them dial. Not dialled unless the caller trusts it.
    pub advertised: Option<AdvertisedKvHost>,
    /// Tokens per second the worker loads back from its host KV tier (HiCache), when it
    /// advertises one (`/server_info` `hicache_size_tokens` > 0 and `hicache_load_tokens_per_s`).
    pub host_load_tokens_per_s: Option<u64>,
}

/// A worker's advertised KV host that differs from its URL's host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdvertisedKvHost {
    /// As advertised, brackets removed.
    pub host: String,
    /// [`KvStreams::endpoints`] dialing `host` instead.
    pub endpoints: Vec<KvStreamEndpoint>,
}

impl KvStreams {
    /// Dials the advertised host ([`KvStreams::advertised`]) instead of the URL's host, when there
    /// is one and it is [`routable_host`]; says whether it switched.
    pub fn dial_advertised(&mut self) -> bool {
        match self.advertised.take() {
            Some(a) if routable_host(&a.host) => {
                self.endpoints = a.endpoints;
                true
            }
            other => {
                self.advertised = other;
                false
            }
        }
    }
}

/// Whether a subscriber may be pointed at `host` (brackets allowed): not a wildcard, loopback,
/// link-local, multicast or broadcast address, and not `localhost`. A DNS name is taken as
/// routable (it is resolved where it is dialled).
pub fn routable_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    if h.is_empty() || h == "*" || h.eq_ignore_ascii_case("localhost") {
        return false;
    }
    match h.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => {
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_broadcast())
        }
        Ok(IpAddr::V6(v6)) => {
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || v6.is_unicast_link_local())
        }
        Err(_) => h
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'),
    }
}

/// Why a worker has no KV-event stream to subscribe to.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NoKv {
    #[error("{0}")]
    Malformed(#[from] DescriptorError),
    #[error("the worker advertises no KV events (kv_events is null or absent)")]
    NoKvEvents,
    #[error("the worker's KV-event publisher is {0:?}, not zmq")]
    NotZmq(String),
    #[error("/server_info.kv_events.block_size: expected a positive integer, got {0}")]
    BlockSize(i64),
    #[error("/server_info.kv_events: a rank's KV or replay port runs past 65535")]
    PortOverflow,
}

/// The KV-event streams of the worker at `worker_url` whose `/server_info` body is `server_info`,
/// dialing the URL's host (see the module docs).
pub fn kv_streams(worker_url: &str, server_info: &[u8]) -> Result<KvStreams, NoKv> {
    let doc: serde_json::Value =
        serde_json::from_slice(server_info).map_err(|e| DescriptorError::Json(e.to_string()))?;
    let d = descriptor_of(&doc)?.ok_or(NoKv::NoKvEvents)?;
    if d.publisher != "zmq" {
        return Err(NoKv::NotZmq(d.publisher));
    }
    let block_size = u64::try_from(d.block_size)
        .ok()
        .filter(|b| *b > 0)
        .ok_or(NoKv::BlockSize(d.block_size))?;
    let url_host = worker_host(worker_url);
    let bare = |h: &str| h.trim_start_matches('[').trim_end_matches(']').to_string();
    let advertised = bare(&d.endpoint_host);
    let own = KvEventsDescriptor {
        endpoint_host: "*".into(),
        ..d.clone()
    };
    let endpoints = own.kv_endpoints(url_host).ok_or(NoKv::PortOverflow)?;
    let wildcard = matches!(advertised.as_str(), "" | "*" | "0.0.0.0" | "::");
    let advertised = if wildcard || advertised.eq_ignore_ascii_case(&bare(url_host)) {
        None
    } else {
        let endpoints = d.kv_endpoints(url_host).ok_or(NoKv::PortOverflow)?;
        Some(AdvertisedKvHost {
            host: advertised,
            endpoints,
        })
    };
    Ok(KvStreams {
        block_size,
        topic: d.topic,
        endpoints,
        advertised,
        host_load_tokens_per_s: host_load_rate(&doc),
    })
}

/// The host tier's load-back rate a `/server_info` advertises; `None` without a host tier or
/// with a rate that is not a positive number.
fn host_load_rate(doc: &serde_json::Value) -> Option<u64> {
    let size = doc.get("hicache_size_tokens")?.as_u64()?;
    let rate = doc.get("hicache_load_tokens_per_s")?.as_f64()?;
    (size > 0 && rate.is_finite() && rate >= 1.0).then_some(rate.min(1e15) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::Generation;

    #[test]
    fn a_host_tier_is_advertised_with_its_load_rate_or_not_at_all() {
        let doc = |size: &str, rate: &str| -> serde_json::Value {
            serde_json::from_str(&format!(
                r#"{{"hicache_size_tokens": {size}, "hicache_load_tokens_per_s": {rate}}}"#
            ))
            .unwrap()
        };
        assert_eq!(host_load_rate(&doc("4096", "100000.0")), Some(100_000));
        assert_eq!(host_load_rate(&doc("0", "100000.0")), None, "no host tier");
        assert_eq!(host_load_rate(&doc("4096", "0")), None, "no usable rate");
        assert_eq!(host_load_rate(&doc("4096", "-5")), None);
        assert_eq!(host_load_rate(&doc("4096", "\"fast\"")), None);
        assert_eq!(
            host_load_rate(&serde_json::json!({})),
            None,
            "an SGLang 0.5.23 server"
        );
    }

    const KV: &str = r#""publisher":"zmq","endpoint_host":"*","endpoint_port_base":5557,"topic":"","block_size":16"#;

    #[test]
    fn worker_urls_are_checked() {
        assert_eq!(
            worker_url("http://10.0.0.1:30000/").unwrap(),
            "http://10.0.0.1:30000"
        );
        assert!(
            worker_url("ftp://x")
                .unwrap_err()
                .to_string()
                .contains("expected http://")
        );
        assert!(worker_url("http://").is_err());
        assert!(worker_url("http://h:1/v1").is_err());
        assert_eq!(worker_host("http://[::1]:30000"), "[::1]");
        assert_eq!(worker_host("http://node-3:30000"), "node-3");
        assert_eq!(worker_host("https://node-3"), "node-3");
    }

    #[test]
    fn endpoints_per_rank_dial_the_worker_host() {
        let body = format!(
            r#"{{"kv_events":{{{KV},"dp_size":2,"load_endpoint_port_base":5559,"load_topic":"load"}}}}"#
        );
        let eps = load_endpoints("http://[::1]:30000", body.as_bytes()).unwrap();
        let dialed: Vec<_> = eps.iter().map(|e| (e.rank, e.endpoint.as_str())).collect();
        assert_eq!(dialed, [(0, "tcp://[::1]:5559"), (1, "tcp://[::1]:5560")]);
        assert!(eps.iter().all(|e| e.generation == Generation::LoadStat));
    }

    #[test]
    fn kv_streams_or_why_not() {
        let body =
            format!(r#"{{"kv_events":{{{KV},"dp_size":2,"replay_endpoint_port_base":6000}}}}"#);
        let s = kv_streams("http://10.0.0.2:30000", body.as_bytes()).unwrap();
        assert_eq!((s.block_size, s.topic.as_str()), (16, ""));
        let eps: Vec<_> = s
            .endpoints
            .iter()
            .map(|e| (e.endpoint.as_str(), e.replay_endpoint.as_deref()))
            .collect();
        assert_eq!(
            eps,
            [
                ("tcp://10.0.0.2:5557", Some("tcp://10.0.0.2:6000")),
                ("tcp://10.0.0.2:5558", Some("tcp://10.0.0.2:6001"))
            ]
        );
        let url = "http://h:1";
        assert_eq!(
            kv_streams(url, br#"{"kv_events":null}"#),
            Err(NoKv::NoKvEvents)
        );
        assert_eq!(
            kv_streams(url, br#"{"version":"x"}"#),
            Err(NoKv::NoKvEvents)
        );
        let null = body.replace(r#""publisher":"zmq""#, r#""publisher":"null""#);
        assert_eq!(
            kv_streams(url, null.as_bytes()),
            Err(NoKv::NotZmq("null".into()))
        );
        assert_eq!(
            s.advertised, None,
            "a wildcard host advertises nothing else"
        );
        let zero = body.replace(r#""block_size":16"#, r#""block_size":0"#);
        assert_eq!(kv_streams(url, zero.as_bytes()), Err(NoKv::BlockSize(0)));
        assert!(matches!(kv_streams(url, b"{"), Err(NoKv::Malformed(_))));
    }

    #[test]
    fn every_reason_for_no_endpoints_is_named() {
        let url = "http://h:1";
        let none = load_endpoints(url, br#"{"kv_events":null}"#).unwrap_err();
        assert_eq!(none, NoLoad::NoKvEvents);
        assert!(none.to_string().contains("kv_events is null"));
        let declined = format!(
            r#"{{"kv_events":{{{KV},"dp_size":1}},"{DECLINE_REASON_FIELD}":"needs a wildcard host"}}"#
        );
        let e = load_endpoints(url, declined.as_bytes()).unwrap_err();
        assert_eq!(
            e,
            NoLoad::NoLoadRange {
                decline_reason: Some("needs a wildcard host".into())
            }
        );
        let text = e.to_string();
        assert!(
            text.contains("does not report load: needs a wildcard host"),
            "{text}"
        );
        let quiet =
            format!(r#"{{"kv_events":{{{KV},"dp_size":1}},"{DECLINE_REASON_FIELD}":null}}"#);
        let e = load_endpoints(url, quiet.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("is off, or the range was declined"));
        assert!(matches!(
            load_endpoints(url, b"not json"),
            Err(NoLoad::Malformed(DescriptorError::Json(_)))
        ));
        assert!(matches!(
            load_endpoints(url, b"[1]"),
            Err(NoLoad::Malformed(DescriptorError::NotObject))
        ));
    }

    #[test]
    fn kv_streams_dial_the_url_host_unless_the_advertised_one_is_trusted() {
        let body = |host: &str| {
            format!(
                r#"{{"kv_events":{{"publisher":"zmq","endpoint_host":"{host}","endpoint_port_base":5557,"topic":"","block_size":16,"dp_size":1,"replay_endpoint_port_base":6000}}}}"#
            )
        };
        let url = "http://10.0.0.2:30000";
        let mut s = kv_streams(url, body("10.0.0.9").as_bytes()).unwrap();
        assert_eq!(s.endpoints[0].endpoint, "tcp://10.0.0.2:5557");
        assert_eq!(
            s.endpoints[0].replay_endpoint.as_deref(),
            Some("tcp://10.0.0.2:6000")
        );
        assert_eq!(s.advertised.as_ref().unwrap().host, "10.0.0.9");
        assert!(s.dial_advertised(), "a routable host, trusted");
        assert_eq!(s.endpoints[0].endpoint, "tcp://10.0.0.9:5557");
        assert_eq!(
            s.endpoints[0].replay_endpoint.as_deref(),
            Some("tcp://10.0.0.9:6000")
        );
        for unroutable in [
            "127.0.0.1",
            "169.254.169.254",
            "[::1]",
            "localhost",
            "224.0.0.1",
        ] {
            let mut s = kv_streams(url, body(unroutable).as_bytes()).unwrap();
            assert!(!s.dial_advertised(), "{unroutable}");
            assert_eq!(
                s.endpoints[0].endpoint, "tcp://10.0.0.2:5557",
                "{unroutable}"
            );
            assert!(s.advertised.is_some(), "{unroutable}: still reported");
        }
        let same = kv_streams(url, body("10.0.0.2").as_bytes()).unwrap();
        assert_eq!(same.advertised, None, "its own host is no other host");
        assert!(routable_host("kv-0.engines.svc"));
        assert!(!routable_host("evil host"));
    }
}
