//! The parameters of the prefix-sharing workloads (generated in `prefix`): what each shape is,
//! its defaults, and the traffic all of them share. Kept apart from the generator so a scenario
//! can name a mix of shapes without reading how they are drawn.

use super::Rng;

/// What every prefix workload shares: the arrival rate and the output lengths.
#[derive(Debug, Clone, PartialEq)]
pub struct Traffic {
    pub seed: u64,
    pub duration_s: f64,
    /// Mean requests/s over the whole mix.
    pub rate: f64,
    pub output: Len,
    pub max_tokens: u64,
    pub stream_fraction: f64,
    pub direct_fraction: f64,
}

impl Traffic {
    /// Outputs median 128 (σ 0.8) as in S0–S2, all streaming, nothing direct.
    pub fn new(seed: u64, duration_s: f64, rate: f64) -> Self {
        Traffic {
            seed,
            duration_s,
            rate,
            output: Len::new(128.0, 0.8),
            max_tokens: 8192,
            stream_fraction: 1.0,
            direct_fraction: 0.0,
        }
    }
}

/// A log-normal length in tokens: its median and shape σ (σ = 0: always the median).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Len {
    pub median: f64,
    pub sigma: f64,
}

impl Len {
    pub const fn new(median: f64, sigma: f64) -> Self {
        Len { median, sigma }
    }

    pub(super) fn draw(self, rng: &mut Rng, max: u64) -> u64 {
        (rng.lognormal(self.median, self.sigma).round() as u64).clamp(1, max)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatSessions {
    pub turns: usize,
    /// Each session's own system prompt.
    pub system: Len,
    pub user: Len,
    pub think_mean_s: f64,
    /// Seconds per output token in the estimate of when an answer is done.
    pub est_decode_step_s: f64,
}

impl Default for ChatSessions {
    fn default() -> Self {
        ChatSessions {
            turns: 5,
            system: Len::new(256.0, 0.3),
            user: Len::new(96.0, 0.6),
            think_mean_s: 5.0,
            est_decode_step_s: 0.03,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SharedSystem {
    pub tenants: usize,
    /// Tenant i (from 0) is picked with probability ∝ 1 / (i + 1)^zipf_s.
    pub zipf_s: f64,
    pub system: Len,
    pub question: Len,
}

impl Default for SharedSystem {
    fn default() -> Self {
        SharedSystem {
            tenants: 16,
            zipf_s: 1.1,
            system: Len::new(1024.0, 0.4),
            question: Len::new(64.0, 0.5),
        }
    }
}

/// SGLang bench_serving's defaults (64 groups × 16 prompts, 2048 + 128 tokens).
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedSharedPrefix {
    pub groups: usize,
    pub prompts_per_group: usize,
    pub system_tokens: u64,
    pub question_tokens: u64,
}

impl Default for GeneratedSharedPrefix {
    fn default() -> Self {
        GeneratedSharedPrefix {
            groups: 64,
            prompts_per_group: 16,
            system_tokens: 2048,
            question_tokens: 128,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct HotPrefix {
    /// The hot tenant's share of this workload's requests.
    pub hot_fraction: f64,
    /// Its system prompt length; questions are `others.question`.
    pub hot_system: Len,
    /// Everyone else.
    pub others: SharedSystem,
}

impl Default for HotPrefix {
    fn default() -> Self {
        HotPrefix {
            hot_fraction: 0.5,
            hot_system: Len::new(1024.0, 0.0),
            others: SharedSystem::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    Chat(ChatSessions),
    SharedSystem(SharedSystem),
    GeneratedSharedPrefix(GeneratedSharedPrefix),
    HotPrefix(HotPrefix),
}

impl Shape {
    pub const NAMES: [&str; 4] = [
        "chat",
        "shared-system",
        "generated-shared-prefix",
        "hot-prefix",
    ];

    /// A shape by name, with its defaults.
    pub fn by_name(name: &str) -> Option<Shape> {
        Some(match name {
            "chat" => Shape::Chat(ChatSessions::default()),
            "shared-system" => Shape::SharedSystem(SharedSystem::default()),
            "generated-shared-prefix" => {
                Shape::GeneratedSharedPrefix(GeneratedSharedPrefix::default())
            }
            "hot-prefix" => Shape::HotPrefix(HotPrefix::default()),
            _ => return None,
        })
    }
}
