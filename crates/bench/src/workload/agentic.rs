//! The agentic-session generator ([`AgentSessions`]): a few agent kinds, each with a long shared
//! system-and-tools prompt; a session is one agent working one task in many turns, each turn a
//! model call whose output is a short tool call, followed by the tool's (longer) result. The
//! context therefore grows by a tool call and a tool result every turn, and a session's late
//! turns carry thousands of tokens of history that only the engine holding it has cached.
//!
//! Open-loop like [`super::ChatSessions`] by default: the next turn arrives at this turn's arrival
//! plus the tool call's tokens × `est_decode_step_s` plus an exponential tool latency. With
//! `closed_loop` the same turns carry a [`Turn`]: the simulator sends each one the tool latency
//! after the previous one finished (`sim::sessions`). Sessions start as a Poisson process at
//! `rate / mean turns`, from far enough before 0 that the mix of early and late turns is steady at
//! 0 (turns before 0 are not sent).

use super::Turn;
use super::prefix::{Gen, text};
use super::shapes::{AgentSessions, Len};
use loadlink_engine::tokenize::{OUTPUT_TEXT, render_chat};

impl Gen<'_> {
    pub(super) fn agentic(&mut self, a: &AgentSessions) {
        let max = self.traffic.max_tokens;
        let (lo, hi) = (a.min_turns.max(1), a.max_turns.max(a.min_turns.max(1)));
        let mean_turns = lognormal_mean(a.turns).clamp(lo as f64, hi as f64);
        let session_rate = self.traffic.rate / mean_turns;
        let turn_s = lognormal_mean(a.tool_call) * a.est_decode_step_s + a.tool_latency_mean_s;
        let warmup = hi as f64 * turn_s;
        let systems: Vec<String> = (0..a.kinds.max(1))
            .map(|k| self.fixed_text(k as u64, a.system))
            .collect();
        let mut start = -warmup;
        for session in 0u64.. {
            start += self.rng.exp(session_rate);
            if start >= self.traffic.duration_s || !start.is_finite() {
                return;
            }
            let kind = (self.rng.next_u64() % systems.len() as u64) as usize;
            let turns = a.turns.draw(&mut self.rng, hi).clamp(lo, hi);
            let task = a.task.draw(&mut self.rng, max);
            let mut messages: Vec<(&str, String)> = vec![
                ("system", systems[kind].clone()),
                ("user", text(&mut self.rng, task)),
            ];
            let (mut t, mut think_s) = (start, 0.0);
            for index in 0..turns as u32 {
                let call = a.tool_call.draw(&mut self.rng, max);
                if (0.0..self.traffic.duration_s).contains(&t) {
                    let prompt = render_chat(messages.iter().map(|(r, m)| (*r, m.as_str())));
                    self.push(t, prompt, call);
                    if a.closed_loop {
                        let turn = Turn {
                            session,
                            index,
                            think_s,
                        };
                        self.out.last_mut().expect("just pushed").turn = Some(turn);
                    }
                }
                messages.push(("assistant", OUTPUT_TEXT.repeat(call as usize)));
                let result = a.tool_result.draw(&mut self.rng, max);
                messages.push(("user", text(&mut self.rng, result)));
                think_s = self.rng.exp(1.0 / a.tool_latency_mean_s.max(1e-3));
                t += call as f64 * a.est_decode_step_s + think_s;
            }
        }
    }
}

/// The mean of a log-normal length: median · e^{σ²/2}.
fn lognormal_mean(l: Len) -> f64 {
    l.median * (l.sigma * l.sigma / 2.0).exp()
}

#[cfg(test)]
mod tests {
    use super::super::shapes::{Shape, Traffic};
    use super::*;
    use crate::workload::{Arrival, generate_mix};

    fn ids(a: &Arrival) -> &[u32] {
        a.prompt.as_deref().expect("token ids")
    }

    #[test]
    fn sessions_grow_their_context_turn_by_turn_and_share_a_kind_prompt() {
        let a = AgentSessions::default();
        let arrivals = generate_mix(
            &Traffic::new(3, 400.0, 6.0),
            &[(1.0, Shape::Agentic(a.clone()))],
        );
        let rate = arrivals.len() as f64 / 400.0;
        assert!((rate / 6.0 - 1.0).abs() < 0.15, "rate {rate}");
        // Every prompt opens with one of `kinds` system prompts.
        let opening: std::collections::HashSet<&[u32]> =
            arrivals.iter().map(|x| &ids(x)[..2000]).collect();
        assert_eq!(opening.len(), a.kinds);
        // A turn continues an earlier turn of its session: that prompt, then its tool call.
        let mut continued = 0;
        for (j, next) in arrivals.iter().enumerate() {
            let p = ids(next);
            let prev = arrivals[..j].iter().rev().find(|q| {
                let qp = ids(q);
                p.len() > qp.len() + q.output_tokens as usize && p.starts_with(qp)
            });
            if let Some(q) = prev {
                continued += 1;
                assert!(next.t - q.t >= q.output_tokens as f64 * a.est_decode_step_s);
                assert!(next.prompt_tokens > q.prompt_tokens + q.output_tokens);
            }
        }
        let share = continued as f64 / arrivals.len() as f64;
        assert!(share > 0.85, "{share} of turns continue a session");
        let mean =
            arrivals.iter().map(|x| x.prompt_tokens).sum::<u64>() as f64 / arrivals.len() as f64;
        assert!((4_000.0..9_000.0).contains(&mean), "mean prompt {mean}");
    }

    #[test]
    fn closed_loop_sessions_send_the_same_turns_each_after_the_previous_one() {
        let open = AgentSessions::default();
        let closed = AgentSessions {
            closed_loop: true,
            ..open.clone()
        };
        let traffic = Traffic::new(5, 120.0, 6.0);
        let a = generate_mix(&traffic, &[(1.0, Shape::Agentic(open))]);
        let b = generate_mix(&traffic, &[(1.0, Shape::Agentic(closed.clone()))]);
        assert_eq!(a.len(), b.len());
        let mut last: std::collections::HashMap<u64, (u32, &Arrival)> = Default::default();
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(
                x,
                &Arrival {
                    turn: None,
                    ..y.clone()
                },
                "only the turn differs"
            );
            let turn = y.turn.expect("every closed-loop turn carries its session");
            assert!(turn.think_s >= 0.0);
            if let Some((index, prev)) = last.insert(turn.session, (turn.index, y)) {
                assert_eq!(turn.index, index + 1, "a session's turns are consecutive");
                assert!(ids(y).starts_with(ids(prev)), "and continue its context");
                let gap = y.t - prev.t;
                let think = gap - prev.output_tokens as f64 * closed.est_decode_step_s;
                assert!(
                    (think - turn.think_s).abs() < 1e-9,
                    "nominal gap = decode + think"
                );
            }
        }
    }
}
