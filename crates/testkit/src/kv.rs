//! The two KV-events shapes tests build: the `--kv-events-config` JSON an engine is started with
//! (SGLang's `KVEventsConfig`), and the `kv_events` descriptor a worker shows in `/server_info`.
//! One builder each, so a test states the port and the one field it varies, not a JSON literal.

use loadlink_wire::descriptor::KvEventsDescriptor;
use serde_json::json;

/// An SGLang `--kv-events-config` value; [`KvEvents::json`] renders it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEvents {
    publisher: String,
    endpoint: String,
    replay_endpoint: Option<String>,
}

impl KvEvents {
    /// The usual config: a ZMQ publisher bound on every interface at `port` (`tcp://*:port`).
    pub fn zmq(port: u16) -> Self {
        Self::endpoint(format!("tcp://*:{port}"))
    }

    /// A ZMQ publisher on an arbitrary endpoint (a concrete host, `ipc://`, …).
    pub fn endpoint(endpoint: impl Into<String>) -> Self {
        KvEvents {
            publisher: "zmq".into(),
            endpoint: endpoint.into(),
            replay_endpoint: None,
        }
    }

    /// Another publisher kind (`"null"` switches KV events off).
    pub fn publisher(mut self, publisher: &str) -> Self {
        self.publisher = publisher.into();
        self
    }

    /// Adds a replay endpoint on every interface at `port`.
    pub fn replay(mut self, port: u16) -> Self {
        self.replay_endpoint = Some(format!("tcp://*:{port}"));
        self
    }

    /// The JSON text, as passed to `--kv-events-config`.
    pub fn json(&self) -> String {
        let mut v = json!({ "publisher": self.publisher, "endpoint": self.endpoint });
        if let Some(r) = &self.replay_endpoint {
            v["replay_endpoint"] = json!(r);
        }
        v.to_string()
    }
}

/// The `/server_info` descriptor of a dp-1 worker whose load socket is `load_port` and whose KV
/// port is the one before it.
pub fn advertised(load_port: u16) -> KvEventsDescriptor {
    KvEventsDescriptor {
        publisher: "zmq".into(),
        endpoint_host: "*".into(),
        endpoint_port_base: load_port - 1,
        topic: String::new(),
        block_size: 16,
        dp_size: 1,
        load_endpoint_port_base: Some(load_port),
        load_topic: None,
        replay_endpoint_port_base: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_sglang_config_json() {
        let v: serde_json::Value = serde_json::from_str(&KvEvents::zmq(5557).json()).unwrap();
        assert_eq!(v, json!({"publisher": "zmq", "endpoint": "tcp://*:5557"}));
        let v: serde_json::Value =
            serde_json::from_str(&KvEvents::zmq(1).publisher("null").replay(2).json()).unwrap();
        assert_eq!(
            v,
            json!({"publisher": "null", "endpoint": "tcp://*:1", "replay_endpoint": "tcp://*:2"})
        );
    }
}
