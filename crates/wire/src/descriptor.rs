//! The `kv_events` block of `/server_info`: how an engine tells routers where its load sockets are.
//!
//! Built from the engine's settings through the same resolver the binder uses, so the advertised
//! `load_endpoint_port_base` exists exactly when the range was bound. Parsed by routers in both
//! forms: generation A (no `load_topic`, snapshot maps on the empty topic) and generation B
//! (`load_topic: "load"`). A missing `load_endpoint_port_base` means "this engine does not report
//! load" — a supported outcome, not an error.
//!
//! Host rule for subscribers: a load PUB always binds a wildcard, so subscribers dial the worker
//! URL's host, never `endpoint_host` (which is usually `*`).

use crate::endpoint::{TcpEndpoint, tcp_endpoint};
use crate::ports::{Generation, KvEventsConfig, LoadRange, RangeRequest, resolve_load_range};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The `kv_events` descriptor as it appears in `/server_info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEventsDescriptor {
    pub publisher: String,
    pub endpoint_host: String,
    pub endpoint_port_base: u16,
    pub topic: String,
    pub block_size: i64,
    pub dp_size: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_endpoint_port_base: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_topic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_endpoint_port_base: Option<u16>,
}

/// What an engine says, beside the descriptor's fields, about KV snapshots: `"snapshot":
/// "snapshot-v1"` (the request its replay sockets answer; absent without replay sockets) and
/// `"epochs": [one per rank]` (each rank's publisher lifetime; a larger one means the rank
/// restarted and its seqs began anew).
///
/// Kept apart from [`KvEventsDescriptor`] (read from and written into the same `kv_events`
/// object) so the descriptor's struct literals elsewhere stay valid; absent on engines that do not
/// serve snapshots (SGLang 0.5.23).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvSnapshotSupport {
    pub snapshot: Option<String>,
    pub epochs: Vec<u64>,
}

impl KvSnapshotSupport {
    /// Adds `snapshot` and `epochs` to a serialized `kv_events` object (no-op on anything else).
    pub fn insert_into(&self, kv_events: &mut serde_json::Value) {
        if let Some(o) = kv_events.as_object_mut() {
            if let Some(s) = &self.snapshot {
                o.insert("snapshot".into(), s.clone().into());
            }
            o.insert("epochs".into(), self.epochs.clone().into());
        }
    }
}

/// Reads [`KvSnapshotSupport`] from a parsed `/server_info`: `Ok(None)` when `kv_events` is
/// absent/null or has neither `snapshot` nor `epochs`; an error names the field when present but
/// malformed.
pub fn snapshot_support_of(
    server_info: &serde_json::Value,
) -> Result<Option<KvSnapshotSupport>, DescriptorError> {
    let Some(kv) = server_info.get("kv_events").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let snapshot = match kv.get("snapshot") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(DescriptorError::Field(format!(
                "snapshot: expected a string such as \"snapshot-v1\", got {other}"
            )));
        }
    };
    let epochs = match kv.get("epochs") {
        None | Some(serde_json::Value::Null) if snapshot.is_none() => return Ok(None),
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(v) => Vec::<u64>::deserialize(v).map_err(|e| {
            DescriptorError::Field(format!(
                "epochs: expected a list of u64, one per rank ({e})"
            ))
        })?,
    };
    Ok(Some(KvSnapshotSupport { snapshot, epochs }))
}

/// One rank's KV-event stream a subscriber should dial: the PUB (`endpoint_port_base + rank`) and,
/// when the engine advertises one, its replay ROUTER (`replay_endpoint_port_base + rank`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvStreamEndpoint {
    pub rank: u32,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
}

/// One load socket a subscriber should dial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadEndpoint {
    pub rank: u32,
    pub endpoint: String,
    pub generation: Generation,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DescriptorError {
    #[error("/server_info is not valid JSON: {0}")]
    Json(String),
    #[error("/server_info: expected a JSON object")]
    NotObject,
    #[error("/server_info.kv_events: {0}")]
    Field(String),
    #[error("/server_info.kv_events.load_topic: expected \"load\" (or absent), got {0:?}")]
    UnknownLoadTopic(String),
    #[error("/server_info.kv_events: load range [{base}, {base}+{dp_size}) runs past port 65535")]
    RangeOverflow { base: u16, dp_size: u32 },
}

/// Builds the descriptor an engine advertises; `None` when there is no usable KV publisher.
///
/// `range` must be the result of [`resolve_load_range`] for the same settings (use
/// [`describe_engine`] to do both in one call).
pub fn describe(
    kv: Option<&KvEventsConfig>,
    block_size: i64,
    dp_size: u32,
    range: Option<&LoadRange>,
) -> Option<KvEventsDescriptor> {
    let kv = kv.filter(|k| k.is_active())?;
    if block_size <= 0 {
        return None;
    }
    let ep = TcpEndpoint::parse(&kv.endpoint).ok()?;
    Some(KvEventsDescriptor {
        publisher: kv.publisher.clone(),
        endpoint_host: ep.url_host(),
        endpoint_port_base: ep.port,
        topic: kv.topic.clone(),
        block_size,
        dp_size,
        load_endpoint_port_base: range.map(|r| r.base),
        load_topic: range
            .filter(|r| r.generation == Generation::LoadStat)
            .map(|_| "load".to_string()),
        replay_endpoint_port_base: kv
            .replay_endpoint
            .as_deref()
            .and_then(|r| TcpEndpoint::parse(r).ok())
            .map(|r| r.port),
    })
}

/// Resolves the range and describes it, the way `/server_info` must.
pub fn describe_engine(req: RangeRequest<'_>, block_size: i64) -> Option<KvEventsDescriptor> {
    let range = resolve_load_range(req).ok();
    describe(req.kv, block_size, req.dp_size, range.as_ref())
}

/// Reads the `kv_events` descriptor from a `/server_info` body; `Ok(None)` when it is null/absent.
pub fn parse_server_info(body: &[u8]) -> Result<Option<KvEventsDescriptor>, DescriptorError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| DescriptorError::Json(e.to_string()))?;
    descriptor_of(&v)
}

/// [`parse_server_info`] on an already parsed `/server_info` document.
pub fn descriptor_of(
    server_info: &serde_json::Value,
) -> Result<Option<KvEventsDescriptor>, DescriptorError> {
    let obj = server_info.as_object().ok_or(DescriptorError::NotObject)?;
    match obj.get("kv_events") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(d) => {
            let d = KvEventsDescriptor::deserialize(d)
                .map_err(|e| DescriptorError::Field(e.to_string()))?;
            d.validate()?;
            Ok(Some(d))
        }
    }
}

impl KvEventsDescriptor {
    fn validate(&self) -> Result<(), DescriptorError> {
        if let Some(t) = self.load_topic.as_deref().filter(|t| *t != "load") {
            return Err(DescriptorError::UnknownLoadTopic(t.to_string()));
        }
        if let Some(base) = self.load_endpoint_port_base
            && base as u64 + self.dp_size as u64 > 65536
        {
            return Err(DescriptorError::RangeOverflow {
                base,
                dp_size: self.dp_size,
            });
        }
        Ok(())
    }

    /// The generation the load sockets speak: B when `load_topic` is advertised, else A.
    pub fn load_generation(&self) -> Generation {
        if self.load_topic.is_some() {
            Generation::LoadStat
        } else {
            Generation::Snapshot
        }
    }

    /// The host a KV-event subscriber dials: `endpoint_host` when the engine bound a concrete
    /// host (it listens there only), else — a wildcard — the worker URL's host.
    fn kv_host<'a>(&'a self, worker_host: &'a str) -> &'a str {
        let advertised = self
            .endpoint_host
            .trim_start_matches('[')
            .trim_end_matches(']');
        match advertised {
            "" | "*" | "0.0.0.0" | "::" => {
                worker_host.trim_start_matches('[').trim_end_matches(']')
            }
            concrete => concrete,
        }
    }

    /// One KV-event stream per DP rank (see [`KvStreamEndpoint`]); `None` when a rank's port
    /// would run past 65535.
    pub fn kv_endpoints(&self, worker_host: &str) -> Option<Vec<KvStreamEndpoint>> {
        let host = self.kv_host(worker_host);
        let port = |base: u16, rank: u32| u16::try_from(base as u32 + rank).ok();
        (0..self.dp_size)
            .map(|rank| {
                let replay = match self.replay_endpoint_port_base {
                    Some(b) => Some(tcp_endpoint(host, port(b, rank)?)),
                    None => None,
                };
                Some(KvStreamEndpoint {
                    rank,
                    endpoint: tcp_endpoint(host, port(self.endpoint_port_base, rank)?),
                    replay_endpoint: replay,
                })
            })
            .collect()
    }

    /// One endpoint per DP rank, dialing `worker_host` (the worker URL's host); empty when the
    /// engine does not report load.
    pub fn load_endpoints(&self, worker_host: &str) -> Vec<LoadEndpoint> {
        let Some(base) = self.load_endpoint_port_base else {
            return Vec::new();
        };
        let host = worker_host.trim_start_matches('[').trim_end_matches(']');
        (0..self.dp_size)
            .map(|rank| LoadEndpoint {
                rank,
                endpoint: tcp_endpoint(host, base + rank as u16),
                generation: self.load_generation(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_parse_and_dial_the_worker_host() {
        let a = br#"{"version":"x","kv_events":{"publisher":"zmq","endpoint_host":"*","endpoint_port_base":5557,
            "topic":"","block_size":16,"dp_size":2,"load_endpoint_port_base":5559}}"#;
        let d = parse_server_info(a).unwrap().unwrap();
        assert_eq!(d.load_generation(), Generation::Snapshot);
        let eps = d.load_endpoints("[::1]");
        assert_eq!(eps[1].endpoint, "tcp://[::1]:5560");
        let b = br#"{"kv_events":{"publisher":"zmq","endpoint_host":"0.0.0.0","endpoint_port_base":5557,
            "topic":"","block_size":16,"dp_size":1,"load_endpoint_port_base":5558,"load_topic":"load"}}"#;
        let d = parse_server_info(b).unwrap().unwrap();
        assert_eq!(
            d.load_endpoints("10.1.2.3")[0].endpoint,
            "tcp://10.1.2.3:5558"
        );
        assert_eq!(d.load_generation(), Generation::LoadStat);
        assert_eq!(parse_server_info(br#"{"kv_events":null}"#).unwrap(), None);
        let none = br#"{"kv_events":{"publisher":"zmq","endpoint_host":"*","endpoint_port_base":5557,"topic":"","block_size":16,"dp_size":2}}"#;
        assert!(
            parse_server_info(none)
                .unwrap()
                .unwrap()
                .load_endpoints("h")
                .is_empty()
        );
        assert!(matches!(
            parse_server_info(b"[1]"),
            Err(DescriptorError::NotObject)
        ));
        let bad = br#"{"kv_events":{"publisher":"zmq","endpoint_host":"*","endpoint_port_base":"x","topic":"","block_size":16,"dp_size":2}}"#;
        let e = parse_server_info(bad).unwrap_err().to_string();
        assert!(e.contains("kv_events") && e.contains("u16"), "{e}");
    }

    #[test]
    fn kv_streams_per_rank_with_replay() {
        let body =
            br#"{"kv_events":{"publisher":"zmq","endpoint_host":"*","endpoint_port_base":5557,
            "topic":"","block_size":16,"dp_size":2,"replay_endpoint_port_base":5600}}"#;
        let d = parse_server_info(body).unwrap().unwrap();
        let eps = d.kv_endpoints("[::1]").unwrap();
        assert_eq!(eps[1].endpoint, "tcp://[::1]:5558");
        assert_eq!(eps[1].replay_endpoint.as_deref(), Some("tcp://[::1]:5601"));
        let concrete = KvEventsDescriptor {
            endpoint_host: "10.0.0.7".into(),
            replay_endpoint_port_base: None,
            ..d.clone()
        };
        let eps = concrete.kv_endpoints("node-1").unwrap();
        assert_eq!(eps[0].endpoint, "tcp://10.0.0.7:5557");
        assert_eq!(eps[0].replay_endpoint, None);
        let edge = KvEventsDescriptor {
            endpoint_port_base: 65535,
            ..d
        };
        assert_eq!(edge.kv_endpoints("h"), None, "rank 1 would be port 65536");
    }

    #[test]
    fn snapshot_support_round_trips_beside_the_descriptor() {
        let body =
            br#"{"kv_events":{"publisher":"zmq","endpoint_host":"*","endpoint_port_base":5557,
            "topic":"","block_size":16,"dp_size":2}}"#;
        let info: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(snapshot_support_of(&info).unwrap(), None);
        let support = KvSnapshotSupport {
            snapshot: Some("snapshot-v1".into()),
            epochs: vec![u64::MAX, 1_790_000_000_000_000_000],
        };
        let mut info = info;
        support.insert_into(&mut info["kv_events"]);
        assert_eq!(snapshot_support_of(&info).unwrap(), Some(support));
        // The descriptor still parses with the extra fields.
        assert_eq!(descriptor_of(&info).unwrap().unwrap().dp_size, 2);
        info["kv_events"]["epochs"] = serde_json::json!([-1]);
        let e = snapshot_support_of(&info).unwrap_err().to_string();
        assert!(e.contains("epochs"), "{e}");
        info["kv_events"]["snapshot"] = serde_json::json!(1);
        let e = snapshot_support_of(&info).unwrap_err().to_string();
        assert!(e.contains("snapshot"), "{e}");
        assert_eq!(
            snapshot_support_of(&serde_json::json!({"kv_events": null})).unwrap(),
            None
        );
    }

    #[test]
    fn advertisement_follows_the_resolver() {
        let kv = KvEventsConfig {
            publisher: "zmq".into(),
            replay_endpoint: Some("tcp://*:5600".into()),
            ..Default::default()
        };
        for g in [Generation::Snapshot, Generation::LoadStat] {
            for mode in [None, Some("auto"), Some("off")] {
                let req = RangeRequest {
                    kv: Some(&kv),
                    dp_size: 4,
                    load_publish_endpoint: mode,
                    generation: g,
                };
                let d = describe_engine(req, 16).unwrap();
                assert_eq!(
                    d.load_endpoint_port_base,
                    resolve_load_range(req).ok().map(|r| r.base)
                );
                assert_eq!(
                    d.load_topic.is_some(),
                    g == Generation::LoadStat && d.load_endpoint_port_base.is_some()
                );
                assert_eq!(d.replay_endpoint_port_base, Some(5600));
            }
        }
    }
}
