//! Prefill–decode disaggregation (`loadlink route --pd`).
//!
//! A PD fleet runs a request's prefill on one engine and its decode on another; the engines move
//! the KV between themselves, keyed by a *room* the router draws. So a PD request is sent, with the
//! same body, to one prefill and one decode engine at once, the body carrying where the prefill
//! engine's bootstrap server is (`bootstrap_host`, `bootstrap_port`) and the room
//! (`bootstrap_room`) — SGLang's request fields, which loadlink's engines read too. The client gets
//! the decode engine's answer.
//!
//! Why each side has its own candidate set and policy: a prefill engine's cost is its prefill
//! backlog and what of the prompt it has cached (`min_ttft` prices exactly that); a decode engine
//! never prefills a transferred prompt, so its cost is the requests it runs, its KV usage and the
//! transfers it is waiting for ([`crate::policy::DecodeLoad`]). The sides are the roster split by
//! role ([`PdSides`]): each is a roster of its own over the same workers, so the model table, the
//! cache lookup, admission and the in-flight guards work per side unchanged.
//!
//! This module: each worker's role and bootstrap port ([`WorkerPd`], from `/server_info` or the
//! command line), the configuration ([`PdConfig`]); [`body`] writes the bootstrap fields,
//! [`forward`] runs one request over a pair, [`stream`] keeps a decode stream whole when its
//! prefill fails, [`metrics`] counts outcomes.

pub mod body;
pub mod forward;
pub mod metrics;
mod pair;
pub mod sides;
pub mod stream;

use crate::policy::Policy;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;

/// SGLang's default `disaggregation_bootstrap_port`.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// What a worker does in a PD fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// Not disaggregated (`disaggregation_mode` "null"): not a PD candidate.
    #[default]
    Regular,
    Prefill,
    Decode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Regular => "regular",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }

    /// `disaggregation_mode` as SGLang spells it ("null", "prefill", "decode").
    pub fn parse_mode(s: &str) -> Option<Self> {
        match s {
            "null" | "" => Some(Role::Regular),
            "prefill" => Some(Role::Prefill),
            "decode" => Some(Role::Decode),
            _ => None,
        }
    }
}

/// Where a prefill engine's bootstrap server listens, as the router sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootstrapPort {
    Port(u16),
    /// `none`: the router sends no `bootstrap_port` (the engines find it otherwise).
    Omitted,
}

/// A worker's role and bootstrap port, set when it is added (discovery, overridden by the command
/// line) and read by every PD request: two atomics, so the worker stays shareable as it is.
#[derive(Debug, Default)]
pub struct WorkerPd {
    /// [`Role`] as 0 regular, 1 prefill, 2 decode.
    role: AtomicU32,
    /// 0..=65535: the port; [`NO_PORT`]: omitted.
    port: AtomicU32,
}

const NO_PORT: u32 = u32::MAX;

impl WorkerPd {
    pub fn set(&self, role: Role, port: BootstrapPort) {
        self.role.store(role as u32, Relaxed);
        let p = match port {
            BootstrapPort::Port(p) => u32::from(p),
            BootstrapPort::Omitted => NO_PORT,
        };
        self.port.store(p, Relaxed);
    }

    pub fn role(&self) -> Role {
        match self.role.load(Relaxed) {
            1 => Role::Prefill,
            2 => Role::Decode,
            _ => Role::Regular,
        }
    }

    /// The bootstrap port (meaningful for a prefill worker).
    pub fn port(&self) -> BootstrapPort {
        match u16::try_from(self.port.load(Relaxed)) {
            Ok(p) => BootstrapPort::Port(p),
            Err(_) => BootstrapPort::Omitted,
        }
    }

    /// The port for `/workers` (`None`: not a prefill worker, or omitted).
    pub fn shown_port(&self) -> Option<u16> {
        match (self.role(), self.port()) {
            (Role::Prefill, BootstrapPort::Port(p)) => Some(p),
            _ => None,
        }
    }
}

/// What a worker's `/server_info` says of its PD role: `disaggregation_mode` and
/// `disaggregation_bootstrap_port` (absent or `null`: [`DEFAULT_BOOTSTRAP_PORT`]). A missing mode
/// is a regular worker; an unknown mode or a port outside 0–65535 is an error naming the field.
pub fn advertised(server_info: &[u8]) -> Result<(Role, BootstrapPort), String> {
    #[derive(serde::Deserialize)]
    struct Info {
        #[serde(default)]
        disaggregation_mode: Option<serde_json::Value>,
        #[serde(default)]
        disaggregation_bootstrap_port: Option<serde_json::Value>,
    }
    let info: Info = serde_json::from_slice(server_info)
        .map_err(|e| format!("/server_info: expected a JSON object: {e}"))?;
    let role = match &info.disaggregation_mode {
        None | Some(serde_json::Value::Null) => Role::Regular,
        Some(serde_json::Value::String(s)) => Role::parse_mode(s).ok_or_else(|| {
            format!(
                "/server_info disaggregation_mode: expected \"null\", \"prefill\" or \"decode\", got {:?}",
                clip(s)
            )
        })?,
        Some(o) => {
            return Err(format!(
                "/server_info disaggregation_mode: expected a string, got {}",
                kind(o)
            ));
        }
    };
    let port = match &info.disaggregation_bootstrap_port {
        None | Some(serde_json::Value::Null) => DEFAULT_BOOTSTRAP_PORT,
        Some(v) => v
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| {
                format!(
                    "/server_info disaggregation_bootstrap_port: expected a port 0–65535, got {}",
                    clip(&v.to_string())
                )
            })?,
    };
    Ok((role, BootstrapPort::Port(port)))
}

/// At most 64 characters of a peer's value, for an error message.
fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
        _ => "a string",
    }
}

/// `loadlink route --pd`: the command line's prefill and decode workers and each side's policy.
#[derive(Debug, Clone, PartialEq)]
pub struct PdConfig {
    /// `--prefill URL [BOOTSTRAP_PORT|none]`: the port given wins over the advertised one.
    pub prefill: Vec<(String, Option<BootstrapPort>)>,
    /// `--decode URL`.
    pub decode: Vec<String>,
    pub prefill_policy: Policy,
    pub decode_policy: Policy,
}

impl Default for PdConfig {
    fn default() -> Self {
        PdConfig {
            prefill: Vec::new(),
            decode: Vec::new(),
            prefill_policy: Policy::MinTtft(Default::default()),
            decode_policy: Policy::DecodeLoad(Default::default()),
        }
    }
}

impl PdConfig {
    /// The role and port a worker at `url` gets: the command line's, else what it advertised
    /// (`advertised`), else regular.
    pub fn resolve(
        &self,
        url: &str,
        advertised: Option<(Role, BootstrapPort)>,
    ) -> (Role, BootstrapPort) {
        let found =
            advertised.unwrap_or((Role::Regular, BootstrapPort::Port(DEFAULT_BOOTSTRAP_PORT)));
        if let Some((_, port)) = self.prefill.iter().find(|(u, _)| u == url) {
            let from_info = match found {
                (Role::Prefill, p) => p,
                _ => BootstrapPort::Port(DEFAULT_BOOTSTRAP_PORT),
            };
            return (Role::Prefill, port.unwrap_or(from_info));
        }
        if self.decode.iter().any(|u| u == url) {
            return (Role::Decode, found.1);
        }
        found
    }

    /// Every command-line PD worker URL (prefill first).
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        let p = self.prefill.iter().map(|(u, _)| u.as_str());
        p.chain(self.decode.iter().map(String::as_str))
    }
}

/// The role and port of the worker at `url`: `cfg`'s when the router runs `--pd`, else what it
/// advertised (shown in `/workers`; such a fleet routes every worker alike).
pub fn role_of(
    cfg: Option<&PdConfig>,
    url: &str,
    advertised: Option<(Role, BootstrapPort)>,
) -> (Role, BootstrapPort) {
    match cfg {
        Some(c) => c.resolve(url, advertised),
        None => advertised.unwrap_or((Role::Regular, BootstrapPort::Port(DEFAULT_BOOTSTRAP_PORT))),
    }
}

/// The routes a PD request takes the pair path on: the generation routes SGLang's engines read the
/// bootstrap fields on. Every other route is forwarded as in a regular fleet.
pub fn pd_route(path: &str) -> bool {
    matches!(
        path,
        "/generate" | "/v1/completions" | "/v1/chat/completions"
    )
}

/// A fresh room in `[0, 2^63)`: splitmix64 (a bijection) over a per-process random seed plus a
/// counter, top bit dropped: rooms of one router repeat only by a 2^-63 chance per pair, and
/// routers (or restarts) do not share a sequence. No RNG state on the request path.
pub fn fresh_room() -> u64 {
    use std::hash::BuildHasher;
    use std::sync::OnceLock;
    use std::sync::atomic::AtomicU64;
    static SEED: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0u64));
    let n = NEXT.fetch_add(1, Relaxed);
    crate::policy::mix(seed.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15))) >> 1
}

#[cfg(test)]
mod tests;
