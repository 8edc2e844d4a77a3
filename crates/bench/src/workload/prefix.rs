//! Workloads whose prompts share prefixes, so an engine's prefix cache (and a router that knows
//! where things are cached) has something to reuse. Prompts are rendered with the engine's own
//! chat template (`loadlink_engine::tokenize`) over seeded random text, so the token ids a run
//! sends are exactly what the engine would make of the same conversation.
//!
//! * [`ChatSessions`]: multi-turn chats; turn k+1's prompt is turn k's prompt, its answer and a new
//!   user message. The generator is open-loop, so "after the answer" is estimated: the next turn
//!   arrives at this turn's arrival + `output_tokens × est_decode_step_s` (a full-batch decode
//!   step per token; prefill and queueing left out) + an exponential think time.
//! * [`SharedSystem`]: tenants with Zipf popularity, each a long system prompt, then a short
//!   question.
//! * [`GeneratedSharedPrefix`]: SGLang bench_serving's `generated-shared-prefix` shape: G groups ×
//!   P prompts, each its group's system prompt and its own question, in shuffled order.
//! * [`HotPrefix`]: one tenant sends `hot_fraction` of the traffic, the others share the rest.
//!
//! Seeded throughout: the same [`Traffic::seed`] gives the same arrivals.

use super::shapes::{GeneratedSharedPrefix, HotPrefix, Len, Shape, SharedSystem, Traffic};
use super::{Arrival, ChatSessions, Rng};
use loadlink_engine::tokenize::{CHARS_PER_TOKEN, OUTPUT_TEXT, render_chat};

/// A mix of shapes, each with its share of `traffic.rate`, merged in arrival order. Each part
/// draws from its own seed (derived from `traffic.seed` and its position), so its texts differ
/// from every other part's.
pub fn generate_mix(traffic: &Traffic, parts: &[(f64, Shape)]) -> Vec<Arrival> {
    let mut out = Vec::new();
    for (k, (share, shape)) in parts.iter().enumerate() {
        let part = Traffic {
            seed: traffic.seed ^ (k as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            rate: traffic.rate * share,
            ..traffic.clone()
        };
        let mut part_gen = Gen::new(&part);
        match shape {
            Shape::Chat(c) => part_gen.chat(c),
            Shape::SharedSystem(s) => part_gen.shared_system(s),
            Shape::GeneratedSharedPrefix(g) => part_gen.generated_shared_prefix(g),
            Shape::HotPrefix(h) => part_gen.hot_prefix(h),
            Shape::Agentic(a) => part_gen.agentic(a),
        }
        out.extend(part_gen.out);
    }
    out.sort_by(|a, b| a.t.total_cmp(&b.t));
    out
}

/// Random lowercase text of `tokens` tokens (whole 4-character chunks).
pub(super) fn text(rng: &mut Rng, tokens: u64) -> String {
    (0..tokens as usize * CHARS_PER_TOKEN)
        .map(|_| (b'a' + (rng.next_u64() % 26) as u8) as char)
        .collect()
}

/// Popularity ∝ 1 / rank^s over `n` items.
struct Zipf(Vec<f64>);

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n.max(1))
            .map(|r| {
                acc += (r as f64).powf(-s);
                acc
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= acc);
        Zipf(cdf)
    }

    fn pick(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.0.partition_point(|&c| c < u).min(self.0.len() - 1)
    }
}

/// One part's generator: its traffic, its random stream, its arrivals so far.
pub(super) struct Gen<'a> {
    pub(super) traffic: &'a Traffic,
    pub(super) rng: Rng,
    pub(super) out: Vec<Arrival>,
}

impl<'a> Gen<'a> {
    fn new(traffic: &'a Traffic) -> Self {
        Gen {
            traffic,
            rng: Rng::new(traffic.seed),
            out: Vec::new(),
        }
    }

    fn output(&mut self) -> u64 {
        self.traffic
            .output
            .draw(&mut self.rng, self.traffic.max_tokens)
    }

    pub(super) fn push(&mut self, t: f64, prompt: Vec<u32>, output_tokens: u64) {
        let tr = self.traffic;
        self.out.push(Arrival {
            t,
            prompt_tokens: prompt.len() as u64,
            output_tokens,
            stream: self.rng.unit() < tr.stream_fraction,
            direct: self.rng.unit() < tr.direct_fraction,
            prompt: Some(prompt.into()),
            turn: None,
            model: None,
        });
    }

    /// Poisson arrival times at `rate` over the duration.
    fn poisson(&mut self, rate: f64) -> Vec<f64> {
        let (mut t, mut times) = (0.0, Vec::new());
        loop {
            t += self.rng.exp(rate);
            if t >= self.traffic.duration_s || !t.is_finite() {
                return times;
            }
            times.push(t);
        }
    }

    /// Sessions start as a Poisson process at `rate / turns`, from far enough before 0 that the
    /// mix of turns is already steady at 0 (turns before 0 are not sent: those sessions' first
    /// sent turn finds nothing cached, like a session that began before the measurement).
    fn chat(&mut self, c: &ChatSessions) {
        let (turns, max) = (c.turns.max(1), self.traffic.max_tokens);
        let session_rate = self.traffic.rate / turns as f64;
        let mean_output =
            self.traffic.output.median * (self.traffic.output.sigma.powi(2) / 2.0).exp();
        let warmup = turns as f64 * (c.think_mean_s + mean_output * c.est_decode_step_s) * 2.0;
        let mut start = -warmup;
        loop {
            start += self.rng.exp(session_rate);
            if start >= self.traffic.duration_s || !start.is_finite() {
                return;
            }
            let system = c.system.draw(&mut self.rng, max);
            let mut messages = vec![("system", text(&mut self.rng, system))];
            let mut t = start;
            for _ in 0..turns {
                let user = c.user.draw(&mut self.rng, max);
                messages.push(("user", text(&mut self.rng, user)));
                let output = self.output();
                if (0.0..self.traffic.duration_s).contains(&t) {
                    let prompt = render_chat(messages.iter().map(|(r, m)| (*r, m.as_str())));
                    self.push(t, prompt, output);
                }
                messages.push(("assistant", OUTPUT_TEXT.repeat(output as usize)));
                t += output as f64 * c.est_decode_step_s + self.rng.exp(1.0 / c.think_mean_s);
            }
        }
    }

    /// Poisson arrivals, each tenant `pick(rng)`'s system prompt (of length `system(tenant)`) and
    /// a new question. Tenant texts come from their own seeds, so a tenant's prompt does not depend
    /// on who asked before.
    fn tenants(
        &mut self,
        system: impl Fn(usize) -> Len,
        question: Len,
        mut pick: impl FnMut(&mut Rng) -> usize,
    ) {
        let mut prompts: Vec<Option<String>> = Vec::new();
        for t in self.poisson(self.traffic.rate) {
            let tenant = pick(&mut self.rng);
            if prompts.len() <= tenant {
                prompts.resize(tenant + 1, None);
            }
            let sys = prompts[tenant]
                .get_or_insert_with(|| self.fixed_text(tenant as u64, system(tenant)))
                .clone();
            let q = question.draw(&mut self.rng, self.traffic.max_tokens);
            let q = text(&mut self.rng, q);
            let output = self.output();
            self.push(
                t,
                render_chat([("system", sys.as_str()), ("user", &q)]),
                output,
            );
        }
    }

    /// Text number `key` of this part, of a length drawn from `len`: the same for the same seed
    /// and key, whatever was drawn before.
    pub(super) fn fixed_text(&self, key: u64, len: Len) -> String {
        let mut rng = Rng::new(self.traffic.seed ^ 0x7e4a_4700 ^ ((key + 1) << 20));
        let n = len.draw(&mut rng, self.traffic.max_tokens);
        text(&mut rng, n)
    }

    fn shared_system(&mut self, s: &SharedSystem) {
        let zipf = Zipf::new(s.tenants, s.zipf_s);
        self.tenants(|_| s.system, s.question, |rng| zipf.pick(rng));
    }

    /// The hot tenant is number `others.tenants` (after the others).
    fn hot_prefix(&mut self, h: &HotPrefix) {
        let zipf = Zipf::new(h.others.tenants, h.others.zipf_s);
        let hot = h.others.tenants;
        let system = |i| {
            if i == hot {
                h.hot_system
            } else {
                h.others.system
            }
        };
        let pick = |rng: &mut Rng| {
            if rng.unit() < h.hot_fraction {
                hot
            } else {
                zipf.pick(rng)
            }
        };
        self.tenants(system, h.others.question, pick);
    }

    /// Every (group, prompt) once, in a shuffled order, at Poisson times (as many as fit in the
    /// duration).
    fn generated_shared_prefix(&mut self, g: &GeneratedSharedPrefix) {
        let fixed = |n: u64| Len::new(n as f64, 0.0);
        let systems: Vec<String> = (0..g.groups)
            .map(|k| self.fixed_text(k as u64, fixed(g.system_tokens)))
            .collect();
        let times = self.poisson(self.traffic.rate);
        let per_group = match g.fill {
            true => g
                .prompts_per_group
                .max(times.len().div_ceil(g.groups.max(1))),
            false => g.prompts_per_group,
        };
        let mut order: Vec<(usize, usize)> = (0..g.groups)
            .flat_map(|k| (0..per_group).map(move |p| (k, p)))
            .collect();
        for i in (1..order.len()).rev() {
            order.swap(i, (self.rng.next_u64() % (i as u64 + 1)) as usize);
        }
        for (t, (k, _)) in times.into_iter().zip(order) {
            let q = text(&mut self.rng, g.question_tokens);
            let output = match g.output {
                Some(len) => len.draw(&mut self.rng, self.traffic.max_tokens),
                None => self.output(),
            };
            let prompt = render_chat([("system", systems[k].as_str()), ("user", &q)]);
            self.push(t, prompt, output);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loadlink_engine::tokenize::{END, OUTPUT_TOKEN, ROLE_SYSTEM, START};
    use std::collections::HashMap;

    fn traffic(rate: f64, duration_s: f64) -> Traffic {
        Traffic::new(5, duration_s, rate)
    }

    fn ids(a: &Arrival) -> &[u32] {
        a.prompt
            .as_deref()
            .expect("prefix workloads carry token ids")
    }

    /// The system message: everything up to its `END`.
    fn system_of(p: &[u32]) -> &[u32] {
        &p[..=p.iter().position(|&t| t == END).unwrap()]
    }

    /// How often each system prompt leads, most frequent first.
    fn tenant_counts(a: &[Arrival]) -> Vec<usize> {
        let mut by: HashMap<&[u32], usize> = HashMap::new();
        a.iter()
            .for_each(|x| *by.entry(system_of(ids(x))).or_default() += 1);
        let mut counts: Vec<usize> = by.into_values().collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        counts
    }

    #[test]
    fn each_chat_turn_extends_the_previous_turn_and_its_answer() {
        let c = ChatSessions::default();
        let a = generate_mix(&traffic(4.0, 300.0), &[(1.0, Shape::Chat(c.clone()))]);
        let mut continued = 0;
        for (j, next) in a.iter().enumerate() {
            let p = ids(next);
            assert_eq!(p[..2], [START, ROLE_SYSTEM]);
            // The earlier turn whose prompt and answer this prompt starts with, if any.
            let prev = a[..j].iter().find(|q| {
                let (qp, n) = (ids(q), q.output_tokens as usize);
                p.len() > qp.len() + n
                    && p.starts_with(qp)
                    && p[qp.len()..qp.len() + n].iter().all(|&t| t == OUTPUT_TOKEN)
                    && p[qp.len() + n] == END
            });
            if let Some(q) = prev {
                continued += 1;
                assert!(next.t - q.t >= q.output_tokens as f64 * c.est_decode_step_s);
            }
        }
        // Four turns in five continue a session (a little less: sessions cut at the ends).
        let share = continued as f64 / a.len() as f64;
        assert!((0.72..=0.8).contains(&share), "{share} of {}", a.len());
        let rate = a.len() as f64 / 300.0;
        assert!((rate / 4.0 - 1.0).abs() < 0.1, "rate {rate}");
    }

    #[test]
    fn tenants_are_zipf_popular_and_keep_their_system_prompt() {
        let s = SharedSystem::default();
        let a = generate_mix(
            &traffic(20.0, 400.0),
            &[(1.0, Shape::SharedSystem(s.clone()))],
        );
        let counts = tenant_counts(&a);
        assert_eq!(counts.len(), s.tenants);
        let norm: f64 = (1..=s.tenants).map(|r| (r as f64).powf(-s.zipf_s)).sum();
        let n = a.len() as f64;
        for (rank, &c) in counts.iter().enumerate().take(3) {
            let want = ((rank + 1) as f64).powf(-s.zipf_s) / norm;
            assert!(
                (c as f64 / n - want).abs() < 0.02,
                "rank {rank}: {c} of {n}"
            );
        }
        // A long system prompt and a short question.
        let sys = a.iter().map(|x| system_of(ids(x)).len()).sum::<usize>() as f64 / n;
        let mean = a.iter().map(|x| x.prompt_tokens).sum::<u64>() as f64 / n;
        assert!(
            sys > 800.0 && mean - sys < 150.0,
            "system {sys}, prompt {mean}"
        );
    }

    #[test]
    fn the_hot_tenant_sends_its_share() {
        let a = generate_mix(
            &traffic(20.0, 300.0),
            &[(1.0, Shape::by_name("hot-prefix").unwrap())],
        );
        let share = tenant_counts(&a)[0] as f64 / a.len() as f64;
        assert!((share - 0.5).abs() < 0.03, "{share}");
    }

    #[test]
    fn generated_shared_prefix_sends_every_group_prompt_once() {
        let g = GeneratedSharedPrefix {
            groups: 4,
            prompts_per_group: 8,
            system_tokens: 64,
            question_tokens: 8,
            ..GeneratedSharedPrefix::default()
        };
        let a = generate_mix(
            &traffic(50.0, 100.0),
            &[(1.0, Shape::GeneratedSharedPrefix(g))],
        );
        assert_eq!(a.len(), 32);
        assert_eq!(tenant_counts(&a), vec![8; 4]);
        let distinct: std::collections::HashSet<&[u32]> = a.iter().map(ids).collect();
        assert_eq!(distinct.len(), 32);
        assert!(
            a.iter()
                .all(|x| x.prompt_tokens == 2 + 64 + 1 + 2 + 8 + 1 + 2)
        );
    }

    #[test]
    fn a_mix_is_seeded_and_keeps_the_total_rate() {
        let parts = [
            (0.5, Shape::by_name("chat").unwrap()),
            (0.5, Shape::by_name("shared-system").unwrap()),
        ];
        let a = generate_mix(&traffic(10.0, 500.0), &parts);
        assert_eq!(a, generate_mix(&traffic(10.0, 500.0), &parts));
        let other = Traffic {
            seed: 6,
            ..traffic(10.0, 500.0)
        };
        assert_ne!(a, generate_mix(&other, &parts));
        assert!(a.windows(2).all(|w| w[0].t <= w[1].t));
        let rate = a.len() as f64 / 500.0;
        assert!((rate / 10.0 - 1.0).abs() < 0.08, "rate {rate}");
    }
}
