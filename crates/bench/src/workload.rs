//! Seeded workloads: Poisson or bursty (on/off) arrivals at a target fraction of fleet capacity,
//! log-normal prompt and output lengths (or a JSONL trace), a streaming fraction and a fraction of
//! traffic sent directly to engines, bypassing every router. Workloads whose prompts share
//! prefixes (chat sessions, tenants' system prompts) are in `shapes` (parameters) and `prefix`
//! (generation); the models and adapters requests name in `models`; what an engine's cache could reuse of them in `reuse`; JSONL traces in `trace`.

mod agentic;
pub mod burst;
mod models;
mod prefix;
mod reuse;
mod shapes;
mod trace;

pub use models::{ModelShare, adapter_name, assign_models};
pub use prefix::generate_mix;
pub use reuse::{ReuseEstimate, blind_reuse};
pub use shapes::{
    AgentSessions, ChatSessions, GeneratedSharedPrefix, HotPrefix, Len, Shape, SharedSystem,
    Traffic,
};
pub use trace::{read_trace, write_trace};

use std::sync::Arc;

/// A small, fast, seedable generator (xoshiro256** seeded by splitmix64). Own code so a seed means
/// the same numbers forever, whatever a dependency does.
#[derive(Debug, Clone)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }

    /// Uniform in (0, 1).
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    pub fn exp(&mut self, rate: f64) -> f64 {
        -self.unit().ln() / rate
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        (-2.0 * self.unit().ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
    }

    /// Log-normal with the given median and shape σ.
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }
}

/// One request of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrival {
    /// Seconds from the start.
    pub t: f64,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    pub stream: bool,
    /// Sent straight to an engine, bypassing the routers.
    pub direct: bool,
    /// The prompt's token ids, for workloads with prefix reuse; `None`: every prompt is unique
    /// (only its length matters).
    pub prompt: Option<Arc<[u32]>>,
    /// The model the request names, and the adapter of it; `None`: the fleet's one model.
    pub model: Option<ModelRef>,
    /// A closed-loop session's turn: sent when the session's previous turn has finished, after
    /// a think time; `None`: sent at `t` (open loop).
    pub turn: Option<Turn>,
}

/// Where a request sits in a closed-loop session. The simulator sends turn `index` of `session`
/// `think_s` after turn `index − 1` finished (its `t` is then only nominal); a turn whose
/// predecessor is not among the arrivals (it fell before the run) is sent at its `t`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Turn {
    pub session: u64,
    pub index: u32,
    pub think_s: f64,
}

/// What a request of a many-model fleet names: a served model, and optionally one of its LoRA
/// adapters (`None`: the base model).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModelRef {
    pub model: Arc<str>,
    pub adapter: Option<Arc<str>>,
}

impl Arrival {
    /// The token ids to send for request number `index`: the workload's own, or ids unique to
    /// this request (so an engine's prefix cache finds nothing to reuse, as the workload intends).
    pub fn prompt_ids(&self, index: usize) -> Vec<u32> {
        match &self.prompt {
            Some(p) => p.to_vec(),
            None => {
                let mut rng = Rng::new(0x1d5 ^ (index as u64).wrapping_mul(0x9e37_79b9));
                (0..self.prompt_tokens)
                    .map(|_| 16 + (rng.next_u64() % ((1 << 17) - 16)) as u32)
                    .collect()
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pattern {
    Poisson,
    /// On/off: `burst` × the mean rate for `on_s`, then idle, keeping the same mean rate.
    Bursty {
        burst: f64,
        on_s: f64,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSpec {
    pub seed: u64,
    pub duration_s: f64,
    /// Mean arrival rate, requests/s.
    pub rate: f64,
    pub pattern: Pattern,
    pub prompt_median: f64,
    pub prompt_sigma: f64,
    pub output_median: f64,
    pub output_sigma: f64,
    pub max_tokens: u64,
    pub stream_fraction: f64,
    pub direct_fraction: f64,
}

impl WorkloadSpec {
    /// Mean of a log-normal capped at `max_tokens` is close to `median·exp(σ²/2)`.
    pub fn mean_prompt(&self) -> f64 {
        self.prompt_median * (self.prompt_sigma.powi(2) / 2.0).exp()
    }
    pub fn mean_output(&self) -> f64 {
        self.output_median * (self.output_sigma.powi(2) / 2.0).exp()
    }
}

fn clamp_tokens(x: f64, max: u64) -> u64 {
    (x.round() as u64).clamp(1, max)
}

/// Generates the arrivals of `spec` (deterministic for its seed).
pub fn generate(spec: &WorkloadSpec) -> Vec<Arrival> {
    let mut rng = Rng::new(spec.seed);
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        let rate = match spec.pattern {
            Pattern::Poisson => spec.rate,
            Pattern::Bursty { burst, .. } => spec.rate * burst,
        };
        t += rng.exp(rate);
        if let Pattern::Bursty { burst, on_s } = spec.pattern {
            // Arrivals only fall in the "on" part of each period of length on_s·burst.
            let period = on_s * burst;
            let phase = t % period;
            if phase > on_s {
                t += period - phase;
            }
        }
        if t >= spec.duration_s {
            break;
        }
        out.push(Arrival {
            t,
            prompt_tokens: clamp_tokens(
                rng.lognormal(spec.prompt_median, spec.prompt_sigma),
                spec.max_tokens,
            ),
            output_tokens: clamp_tokens(
                rng.lognormal(spec.output_median, spec.output_sigma),
                spec.max_tokens,
            ),
            stream: rng.unit() < spec.stream_fraction,
            direct: rng.unit() < spec.direct_fraction,
            prompt: None,
            turn: None,
            model: None,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(pattern: Pattern) -> WorkloadSpec {
        WorkloadSpec {
            seed: 42,
            duration_s: 2000.0,
            rate: 20.0,
            pattern,
            prompt_median: 500.0,
            prompt_sigma: 0.8,
            output_median: 150.0,
            output_sigma: 0.6,
            max_tokens: 1 << 20,
            stream_fraction: 0.7,
            direct_fraction: 0.25,
        }
    }

    #[test]
    fn poisson_rate_lognormal_moments_and_fractions() {
        let s = spec(Pattern::Poisson);
        let a = generate(&s);
        let n = a.len() as f64;
        assert!(
            (n / s.duration_s - s.rate).abs() < 0.3,
            "rate {}",
            n / s.duration_s
        );
        // ln(prompt) ~ N(ln 500, 0.8²)
        let logs: Vec<f64> = a.iter().map(|x| (x.prompt_tokens as f64).ln()).collect();
        let mean = logs.iter().sum::<f64>() / n;
        let sd = (logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(
            (mean - 500f64.ln()).abs() < 0.02 && (sd - 0.8).abs() < 0.02,
            "mean {mean} sd {sd}"
        );
        let out_mean = a.iter().map(|x| x.output_tokens as f64).sum::<f64>() / n;
        assert!(
            (out_mean / s.mean_output() - 1.0).abs() < 0.03,
            "output mean {out_mean} vs {}",
            s.mean_output()
        );
        let direct = a.iter().filter(|x| x.direct).count() as f64 / n;
        let stream = a.iter().filter(|x| x.stream).count() as f64 / n;
        assert!((direct - 0.25).abs() < 0.01 && (stream - 0.7).abs() < 0.01);
        // Exponential gaps: coefficient of variation ≈ 1.
        let gaps: Vec<f64> = a.windows(2).map(|w| w[1].t - w[0].t).collect();
        let gm = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let gcv =
            (gaps.iter().map(|g| (g - gm).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt() / gm;
        assert!((gcv - 1.0).abs() < 0.05, "gap CV {gcv}");
    }

    #[test]
    fn bursty_keeps_the_mean_rate_and_is_burstier() {
        let s = spec(Pattern::Bursty {
            burst: 4.0,
            on_s: 5.0,
        });
        let a = generate(&s);
        let rate = a.len() as f64 / s.duration_s;
        assert!((rate - s.rate).abs() / s.rate < 0.05, "mean rate {rate}");
        let per_10s = |a: &[Arrival]| {
            let mut b = vec![0f64; (s.duration_s / 5.0) as usize];
            a.iter().for_each(|x| b[(x.t / 5.0) as usize] += 1.0);
            let m = b.iter().sum::<f64>() / b.len() as f64;
            (b.iter().map(|x| (x - m).powi(2)).sum::<f64>() / b.len() as f64).sqrt() / m
        };
        assert!(per_10s(&a) > 2.0 * per_10s(&generate(&spec(Pattern::Poisson))));
    }

    #[test]
    fn same_seed_same_workload_and_trace_parsing() {
        assert_eq!(
            generate(&spec(Pattern::Poisson)),
            generate(&spec(Pattern::Poisson))
        );
        let t = read_trace("{\"t\": 1.5, \"prompt_tokens\": 10, \"output_tokens\": 3}\n\n{\"t\": 0.5, \"prompt_tokens\": 7, \"output_tokens\": 2, \"direct\": true}").unwrap();
        assert_eq!((t[0].t, t[0].direct, t[1].prompt_tokens), (0.5, true, 10));
        assert!(
            read_trace("{\"t\": 1}")
                .unwrap_err()
                .contains("prompt_tokens")
        );
    }
}
