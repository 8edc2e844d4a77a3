//! Prefill–decode disaggregation: the engine's part outside the scheduler model.
//!
//! A router sends the same request to a prefill and a decode engine, with `bootstrap_host`,
//! `bootstrap_port` and `bootstrap_room`. The decode engine dials the prefill engine's bootstrap
//! server and registers the room; the prefill engine, once its prefill is done and the room is
//! registered, "sends" the KV: it waits the transfer time (prompt tokens × bytes per token ÷ link
//! bandwidth) and then tells the decode engine on that connection, which admits the request into
//! decode. Nothing but the frames crosses the wire: the KV itself is simulated, the connection,
//! its failures and its timing are real.
//!
//! * [`frame`]: the protocol's frames and their budget;
//! * [`rooms`]: the prefill side's table of rooms (request here? decode registered? prefilled?),
//!   which starts each transfer when all three hold;
//! * [`server`]: the prefill side's bootstrap listener and its connections;
//! * [`client`]: the decode side's pooled connections and the rooms waiting on them;
//! * [`fields`]: the request's bootstrap fields;
//! * [`respond`]: what a prefill or decode engine answers, errors included.

pub(crate) mod client;
pub(crate) mod fields;
pub mod frame;
pub(crate) mod respond;
pub(crate) mod rooms;
pub(crate) mod server;

pub use crate::model::PdMode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// SGLang's default `--disaggregation-bootstrap-port`.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;
/// KV bytes per token when the model says nothing else (a 7B-class model in fp16).
pub const DEFAULT_KV_BYTES_PER_TOKEN: u64 = 131_072;
/// The fake bootstrap host SGLang's health checks and warm-ups use: no transfer happens.
pub const FAKE_BOOTSTRAP_HOST: &str = "2.2.2.2";

/// The engine's disaggregation settings (`--disaggregation-*`, `--kv-*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PdConfig {
    pub mode: PdMode,
    /// The prefill engine's bootstrap port (0: pick a free one and advertise it).
    pub bootstrap_port: u16,
    /// Simulated link bandwidth, GB/s.
    pub kv_transfer_gb_s: f64,
    pub kv_bytes_per_token: u64,
    /// How long a decode engine waits for its KV, and a prefill engine for its decode side to
    /// register.
    pub timeout: Duration,
}

impl Default for PdConfig {
    fn default() -> Self {
        PdConfig {
            mode: PdMode::Null,
            bootstrap_port: DEFAULT_BOOTSTRAP_PORT,
            kv_transfer_gb_s: 25.0,
            kv_bytes_per_token: DEFAULT_KV_BYTES_PER_TOKEN,
            timeout: Duration::from_secs(30),
        }
    }
}

impl PdConfig {
    /// KV bytes of a prompt of `tokens` tokens.
    pub fn kv_bytes(&self, tokens: u64) -> u64 {
        tokens.saturating_mul(self.kv_bytes_per_token)
    }

    /// Model seconds to move `tokens` tokens' KV over the link.
    pub fn transfer_secs(&self, tokens: u64) -> f64 {
        let rate = self.kv_transfer_gb_s.max(1e-9) * 1e9;
        self.kv_bytes(tokens) as f64 / rate
    }
}

/// How a room ended, per side (`loadlink_engine_pd_rooms_total{role,outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Transferred = 0,
    Failed = 1,
    Timeout = 2,
}

impl Outcome {
    pub(crate) const ALL: [Outcome; 3] = [Outcome::Transferred, Outcome::Failed, Outcome::Timeout];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Outcome::Transferred => "transferred",
            Outcome::Failed => "failed",
            Outcome::Timeout => "timeout",
        }
    }
}

/// What the engine's handlers share about disaggregation.
pub(crate) struct PdState {
    pub(crate) cfg: PdConfig,
    /// The bootstrap port bound (prefill only).
    pub(crate) bound_port: Option<u16>,
    /// The prefill side's rooms.
    pub(crate) rooms: std::sync::Arc<rooms::Rooms>,
    /// The decode side's connections to prefill engines.
    pub(crate) client: client::Bootstrap,
    /// Rooms ended, by [`Outcome`] (shared with the room table).
    pub(crate) outcomes: std::sync::Arc<[AtomicU64; 3]>,
    /// Time scale of the engine's model (transfer times shrink with it).
    pub(crate) time_scale: f64,
}

impl PdState {
    pub(crate) fn count(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Rooms waiting on this side: prefill, requests not yet transferred; decode, requests
    /// waiting for their KV.
    pub(crate) fn waiting(&self) -> u64 {
        match self.cfg.mode {
            PdMode::Prefill => self.rooms.requests() as u64,
            PdMode::Decode => self.client.waiting() as u64,
            PdMode::Null => 0,
        }
    }
}
