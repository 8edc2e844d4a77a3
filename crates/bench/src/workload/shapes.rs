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

/// SGLang bench_serving's defaults (64 groups × 16 prompts, 2048 + 128 tokens, 256 output tokens:
/// `--gsp-num-groups 64 --gsp-prompts-per-group 16 --gsp-system-prompt-len 2048
/// --gsp-question-len 128 --gsp-output-len 256`).
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedSharedPrefix {
    pub groups: usize,
    pub prompts_per_group: usize,
    pub system_tokens: u64,
    pub question_tokens: u64,
    /// Output lengths; `None`: the traffic's.
    pub output: Option<Len>,
    /// Draw as many prompts per group as the rate and duration need (at least
    /// `prompts_per_group`), so the set does not run out before the run ends: bench_serving sends
    /// a fixed set once, which at a sweep's rates lasts about a minute.
    pub fill: bool,
}

impl Default for GeneratedSharedPrefix {
    fn default() -> Self {
        GeneratedSharedPrefix {
            groups: 64,
            prompts_per_group: 16,
            system_tokens: 2048,
            question_tokens: 128,
            output: None,
            fill: false,
        }
    }
}

/// Long agentic sessions: an agent of one of a few kinds (each a long shared system-and-tools
/// prompt) works a task in many short turns; each turn the model answers with a short tool call
/// and the tool's result is appended, so the context grows by a few hundred tokens a turn and a
/// session's last turns carry thousands of tokens of history. Moving a session costs recomputing
/// all of it, which is what makes placement near saturation matter.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSessions {
    /// Agent kinds, each with its own system-and-tools prompt shared by all its sessions.
    pub kinds: usize,
    pub system: Len,
    /// The task statement (the first user message).
    pub task: Len,
    /// Turns per session (model calls), drawn per session, within `min_turns..=max_turns`.
    pub turns: Len,
    pub min_turns: u64,
    pub max_turns: u64,
    /// The model's tool call: the request's output.
    pub tool_call: Len,
    /// The tool's result, appended before the next turn.
    pub tool_result: Len,
    /// Mean seconds a tool takes (exponential).
    pub tool_latency_mean_s: f64,
    /// Seconds per output token in the estimate of when an answer is done (as in chat).
    pub est_decode_step_s: f64,
    /// Send each turn when the previous one has finished plus the tool latency (an agent waits
    /// for its answer), instead of on the estimated clock.
    pub closed_loop: bool,
}

impl Default for AgentSessions {
    fn default() -> Self {
        AgentSessions {
            kinds: 4,
            system: Len::new(2048.0, 0.0),
            task: Len::new(300.0, 0.5),
            turns: Len::new(12.0, 0.5),
            min_turns: 4,
            max_turns: 40,
            tool_call: Len::new(120.0, 0.6),
            tool_result: Len::new(400.0, 0.8),
            tool_latency_mean_s: 1.5,
            est_decode_step_s: 0.03,
            closed_loop: false,
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
    Agentic(AgentSessions),
}

impl Shape {
    pub const NAMES: [&str; 5] = [
        "chat",
        "shared-system",
        "generated-shared-prefix",
        "hot-prefix",
        "agentic",
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
            "agentic" => Shape::Agentic(AgentSessions::default()),
            _ => return None,
        })
    }
}
