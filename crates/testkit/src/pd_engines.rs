//! Prefill–decode fleets of real engines for tests: N prefill and M decode `loadlink engine`s
//! on free loopback ports (bootstrap ports picked free too), the bootstrap fields a router would
//! add for a given prefill engine, and the engines' room counters read from `/metrics`.

use crate::metrics::scrape;
use loadlink_engine::{Engine, EngineConfig, PdConfig, PdMode};
use serde_json::{Value, json};
use std::time::Duration;

/// One engine of a PD fleet.
pub struct PdEngine {
    pub engine: Engine,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The bootstrap port it bound (prefill engines; `None` for decode).
    pub bootstrap_port: Option<u16>,
}

impl PdEngine {
    /// The fields a router adds to a request it sends to this prefill engine and a decode
    /// engine: `bootstrap_host`, `bootstrap_port`, `bootstrap_room`.
    pub fn bootstrap_fields(&self, room: u64) -> Value {
        json!({
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": self.bootstrap_port,
            "bootstrap_room": room,
        })
    }
}

/// A fleet: prefill engines first, then decode engines.
pub struct PdFleet {
    pub prefill: Vec<PdEngine>,
    pub decode: Vec<PdEngine>,
}

impl PdFleet {
    /// Every engine's URL, prefill first.
    pub fn urls(&self) -> Vec<String> {
        let all = self.prefill.iter().chain(&self.decode);
        all.map(|e| e.url.clone()).collect()
    }

    /// Stops every engine.
    pub async fn stop(self) {
        for e in self.prefill.into_iter().chain(self.decode) {
            e.engine.stop().await;
        }
    }
}

/// Starts `prefill` prefill engines and `decode` decode engines on free ports, each with 16
/// running slots and a 10 s disaggregation timeout; `tweak(mode, cfg)` adjusts each config
/// (the mode tells which side it is).
pub async fn pd_engines(
    prefill: usize,
    decode: usize,
    tweak: impl Fn(PdMode, &mut EngineConfig),
) -> PdFleet {
    let start = |mode: PdMode| {
        let mut cfg = EngineConfig {
            port: 0,
            pd: PdConfig {
                mode,
                bootstrap_port: 0,
                timeout: Duration::from_secs(10),
                ..PdConfig::default()
            },
            ..EngineConfig::default()
        };
        cfg.model.max_running_requests = 16;
        tweak(mode, &mut cfg);
        async move {
            let engine = Engine::start(cfg).await.expect("PD engine starts");
            PdEngine {
                url: engine.url(),
                bootstrap_port: engine.bootstrap_port(),
                engine,
            }
        }
    };
    let mut fleet = PdFleet {
        prefill: Vec::with_capacity(prefill),
        decode: Vec::with_capacity(decode),
    };
    for _ in 0..prefill {
        fleet.prefill.push(start(PdMode::Prefill).await);
    }
    for _ in 0..decode {
        fleet.decode.push(start(PdMode::Decode).await);
    }
    fleet
}

/// `body` with `fields` merged in (both JSON objects).
pub fn with_fields(body: &Value, fields: &Value) -> Value {
    let mut out = body.clone();
    if let (Some(o), Some(f)) = (out.as_object_mut(), fields.as_object()) {
        o.extend(f.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    out
}

/// `loadlink_engine_pd_rooms_total{outcome}` of the engine at `url` (0 when absent).
pub async fn rooms_total(c: &reqwest::Client, url: &str, outcome: &str) -> f64 {
    scrape(c, url)
        .await
        .value("loadlink_engine_pd_rooms_total", &[("outcome", outcome)])
        .unwrap_or(0.0)
}

/// `loadlink_engine_requests_total` of the engine at `url`.
pub async fn requests_total(c: &reqwest::Client, url: &str) -> f64 {
    scrape(c, url)
        .await
        .value("loadlink_engine_requests_total", &[])
        .unwrap_or(0.0)
}

/// Sends `body` to `path` on a prefill and a decode engine at once, as a PD router does;
/// returns each one's (status, body text), prefill first.
pub async fn send_both(
    c: &reqwest::Client,
    prefill_url: &str,
    decode_url: &str,
    path: &str,
    body: &Value,
) -> ((u16, String), (u16, String)) {
    let send = |url: String| {
        let (c, body) = (c.clone(), body.clone());
        async move {
            let r = crate::http::post(&c, &url, &body).await;
            let status = r.status().as_u16();
            (status, r.text().await.unwrap_or_default())
        }
    };
    tokio::join!(
        send(format!("{prefill_url}{path}")),
        send(format!("{decode_url}{path}"))
    )
}
