//! The one place that decides whether an engine has a load port range, and where.
//!
//! Both the binder (the publisher factory) and the `/server_info` advertisement call
//! [`resolve_load_range`], so an engine can never advertise a range it did not bind. A decline is a
//! supported outcome, not an error: the router then uses its own in-flight signal for that worker.
//!
//! Two rules (PROTOCOL.md §4):
//! * **Generation A** (snapshot map, empty topic) is on whenever a usable KV-events config exists:
//!   base = kv_port + dp_size; it *declines* rather than moves when the replay range overlaps.
//!   loadlink adds two operator controls to the original design: `off`, and an explicit
//!   `tcp://*:PORT` (checked exactly like generation B's).
//! * **Generation B** (SGLang 0.5.23 `LoadStat`) is opt-in: unset/`off` → none; `auto` packs after
//!   the KV range and moves past an overlapping replay range; an explicit address sets the base.

use crate::endpoint::TcpEndpoint;
use serde::{Deserialize, Serialize};

/// Which wire generation a load socket speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Generation {
    /// Full `LoadSnapshot` map on the empty topic (loadlink's first-class design).
    #[default]
    Snapshot,
    /// SGLang 0.5.23's `LoadStat` on topic `load`.
    LoadStat,
}

impl Generation {
    pub fn topic(self) -> &'static [u8] {
        match self {
            Generation::Snapshot => crate::frame::SNAPSHOT_TOPIC,
            Generation::LoadStat => crate::frame::LOAD_TOPIC,
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "a" | "snapshot" => Ok(Generation::Snapshot),
            "b" | "loadstat" | "load-stat" => Ok(Generation::LoadStat),
            other => Err(format!(
                "unknown generation {other:?}; expected snapshot (A) or loadstat (B)"
            )),
        }
    }
}

/// The subset of SGLang's `--kv-events-config` JSON that decides ports and discovery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KvEventsConfig {
    pub publisher: String,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub topic: String,
    pub buffer_steps: u64,
    pub hwm: u64,
    pub max_queue_size: u64,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        KvEventsConfig {
            publisher: "null".into(),
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            topic: String::new(),
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
        }
    }
}

impl KvEventsConfig {
    /// Parses the `--kv-events-config` JSON; the error names the flag and the problem.
    pub fn from_json(json: &str) -> Result<Self, String> {
        serde_json::from_str(json).map_err(|e| format!("--kv-events-config: invalid JSON ({e})"))
    }

    /// A config that actually publishes KV events (publisher not "null", endpoint set).
    pub fn is_active(&self) -> bool {
        self.publisher != "null" && !self.endpoint.is_empty()
    }
}

/// A resolved load range: rank r binds `tcp://host:(base + r)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadRange {
    /// The wildcard host to bind (never concrete).
    pub host: String,
    pub base: u16,
    pub dp_size: u16,
    pub generation: Generation,
}

impl LoadRange {
    /// The endpoint rank `rank` binds.
    pub fn bind_endpoint(&self, rank: u16) -> String {
        crate::endpoint::tcp_endpoint(&self.host, self.base + rank)
    }
}

/// Why no range exists. `reason` is `None` when the decline is unremarkable (feature off or no
/// KV publisher) and a sentence for the operator otherwise; log it once, at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declined {
    pub reason: Option<String>,
}

impl Declined {
    fn quiet() -> Self {
        Declined { reason: None }
    }
    fn because(reason: String) -> Self {
        Declined {
            reason: Some(reason),
        }
    }
}

/// Everything the resolver looks at.
#[derive(Debug, Clone, Copy)]
pub struct RangeRequest<'a> {
    /// `None`: no `--kv-events-config`.
    pub kv: Option<&'a KvEventsConfig>,
    pub dp_size: u32,
    /// `--load-publish-endpoint`: unset, `off`, `auto` or `tcp://*:PORT`.
    pub load_publish_endpoint: Option<&'a str>,
    pub generation: Generation,
}

fn port_of(endpoint: Option<&str>) -> Option<u32> {
    endpoint
        .and_then(|e| TcpEndpoint::parse(e).ok())
        .map(|e| e.port as u32)
}

fn bindable(endpoint: &str) -> Option<TcpEndpoint> {
    TcpEndpoint::parse(endpoint)
        .ok()
        .filter(TcpEndpoint::is_wildcard)
}

fn overlaps(a: u32, b: u32, n: u32) -> bool {
    a < b + n && b < a + n
}

/// Decides the load range. The only function that does; see the module docs for the rules.
pub fn resolve_load_range(req: RangeRequest<'_>) -> Result<LoadRange, Declined> {
    let mode = req.load_publish_endpoint.unwrap_or("").trim();
    let off = mode.eq_ignore_ascii_case("off");
    let auto = mode.eq_ignore_ascii_case("auto")
        || (mode.is_empty() && req.generation == Generation::Snapshot);
    if req.dp_size < 1 || off || mode.is_empty() && !auto {
        return Err(Declined::quiet());
    }
    let kv = req.kv.filter(|k| k.is_active());
    let endpoints = KvPorts {
        kv: kv.map(|k| k.endpoint.as_str()),
        replay: kv.and_then(|k| k.replay_endpoint.as_deref()),
        dp: req.dp_size,
    };
    let (host, base) = if auto {
        endpoints.auto_range(req.generation)?
    } else {
        endpoints.explicit_range(mode)?
    };
    let dp = req.dp_size;
    if base + dp - 1 > 65535 {
        return Err(Declined::because(format!(
            "load port range from {base} would run past the u16 ceiling (dp_size {dp})"
        )));
    }
    Ok(LoadRange {
        host,
        base: base as u16,
        dp_size: dp as u16,
        generation: req.generation,
    })
}

/// The KV-events and replay endpoints a load range must be placed beside.
struct KvPorts<'a> {
    kv: Option<&'a str>,
    replay: Option<&'a str>,
    dp: u32,
}

impl KvPorts<'_> {
    /// `auto` (and generation A's default): pack the range after the KV-events range.
    fn auto_range(&self, generation: Generation) -> Result<(String, u32), Declined> {
        let dp = self.dp;
        let Some(kv_endpoint) = self.kv else {
            return Err(match generation {
                // Generation A is on by default: no KV publisher simply means no range.
                Generation::Snapshot => Declined::quiet(),
                Generation::LoadStat => Declined::because(
                    "--load-publish-endpoint=auto needs a bindable wildcard-host tcp:// \
                     --kv-events-config endpoint to pack after; --kv-events-config is not set"
                        .into(),
                ),
            });
        };
        let Some(kv_ep) = bindable(kv_endpoint) else {
            return Err(Declined::because(format!(
                "the load range packs after the KV-events range, which needs a bindable \
                 wildcard-host tcp:// endpoint (tcp://*:PORT); {kv_endpoint:?} is not one"
            )));
        };
        let mut base = kv_ep.port as u32 + dp;
        if let Some(replay) = port_of(self.replay).filter(|&r| overlaps(base, r, dp)) {
            match generation {
                Generation::LoadStat => base = replay + dp,
                Generation::Snapshot => {
                    return Err(Declined::because(format!(
                        "load range [{base}, {}) overlaps the replay range [{replay}, {}); \
                         move the replay endpoint or set --load-publish-endpoint tcp://*:PORT",
                        base + dp,
                        replay + dp
                    )));
                }
            }
        }
        Ok((kv_ep.host, base))
    }

    /// An explicit `tcp://*:PORT`: the range starts there, clear of the KV and replay ranges.
    fn explicit_range(&self, mode: &str) -> Result<(String, u32), Declined> {
        let dp = self.dp;
        if port_of(self.kv).is_none() {
            let absent = match self.kv {
                None => "without --kv-events-config".to_string(),
                Some(e) => format!("for endpoint {e:?}"),
            };
            return Err(Declined::because(format!(
                "--load-publish-endpoint={mode:?} needs a routable tcp:// --kv-events-config \
                 endpoint: routers discover the load range through /server_info's kv_events \
                 block, absent {absent}, so the socket would be bound but never advertised"
            )));
        }
        let Some(ep) = bindable(mode) else {
            return Err(Declined::because(format!(
                "--load-publish-endpoint={mode:?} is not a bindable tcp:// address \
                 (expected tcp://*:PORT; a concrete host would be connected to, not bound)"
            )));
        };
        let base = ep.port as u32;
        for (what, port) in [
            ("kv-events", port_of(self.kv)),
            ("replay", port_of(self.replay)),
        ] {
            if let Some(p) = port.filter(|&p| overlaps(base, p, dp)) {
                return Err(Declined::because(format!(
                    "--load-publish-endpoint range [{base}, {}) overlaps the {what} range [{p}, {})",
                    base + dp,
                    p + dp
                )));
            }
        }
        Ok((ep.host, base))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(endpoint: &str, replay: Option<&str>) -> KvEventsConfig {
        KvEventsConfig {
            publisher: "zmq".into(),
            endpoint: endpoint.into(),
            replay_endpoint: replay.map(Into::into),
            ..Default::default()
        }
    }

    fn resolve(
        k: Option<&KvEventsConfig>,
        dp: u32,
        mode: Option<&str>,
        g: Generation,
    ) -> Result<u16, Option<String>> {
        resolve_load_range(RangeRequest {
            kv: k,
            dp_size: dp,
            load_publish_endpoint: mode,
            generation: g,
        })
        .map(|r| r.base)
        .map_err(|d| d.reason)
    }

    #[test]
    fn protocol_examples() {
        let k = kv("tcp://*:5557", Some("tcp://*:5558"));
        // Generation B auto moves past the replay range; A declines instead.
        assert_eq!(
            resolve(Some(&k), 2, Some("auto"), Generation::LoadStat),
            Ok(5560)
        );
        assert!(
            resolve(Some(&k), 2, None, Generation::Snapshot)
                .unwrap_err()
                .unwrap()
                .contains("overlaps the replay")
        );
        let k = kv("tcp://*:5557", None);
        assert_eq!(resolve(Some(&k), 2, None, Generation::Snapshot), Ok(5559));
        assert_eq!(resolve(Some(&k), 2, None, Generation::LoadStat), Err(None));
        assert_eq!(
            resolve(Some(&k), 2, Some("off"), Generation::Snapshot),
            Err(None)
        );
        assert_eq!(resolve(None, 2, None, Generation::Snapshot), Err(None));
        let null = KvEventsConfig::default();
        assert_eq!(
            resolve(Some(&null), 2, None, Generation::Snapshot),
            Err(None)
        );
        let k = kv("tcp://*:65530", None);
        assert!(
            resolve(Some(&k), 8, None, Generation::Snapshot)
                .unwrap_err()
                .unwrap()
                .contains("u16")
        );
        let k = kv("tcp://10.0.0.1:5557", None);
        assert!(
            resolve(Some(&k), 1, None, Generation::Snapshot)
                .unwrap_err()
                .unwrap()
                .contains("wildcard")
        );
        let k = kv("tcp://*:5557", None);
        assert_eq!(
            resolve(Some(&k), 4, Some("tcp://*:7000"), Generation::Snapshot),
            Ok(7000)
        );
        assert!(
            resolve(Some(&k), 4, Some("tcp://*:5555"), Generation::LoadStat)
                .unwrap_err()
                .unwrap()
                .contains("overlaps")
        );
    }
}
