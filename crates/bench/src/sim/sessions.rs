//! Closed-loop sessions: an agent cannot send its next turn before it has read the answer to this
//! one and run the tool it asked for. Open-loop turns keep arriving on their nominal clock however
//! slow the fleet is, so under a backlog a session's turns pile up behind each other, and the
//! offered load never yields. Closed-loop, a session slows down with its engine instead; what grows
//! is the number of sessions alive at once, and with it the KV working set, which is the way long
//! agentic sessions overload a real fleet.
//!
//! [`ClosedLoop`] links each turn ([`Turn`]) to the next one of its session among the arrivals.

use crate::workload::{Arrival, Turn};
use std::collections::HashMap;

#[derive(Debug, Default)]
pub(crate) struct ClosedLoop {
    /// Per arrival: its session's next turn among the arrivals, and the think time before it.
    next: Vec<Option<(usize, f64)>>,
    /// Per arrival: it waits for its session's previous turn.
    held: Vec<bool>,
}

impl ClosedLoop {
    pub(crate) fn new(arrivals: &[Arrival]) -> ClosedLoop {
        let mut c = ClosedLoop {
            next: vec![None; arrivals.len()],
            held: vec![false; arrivals.len()],
        };
        let by_turn: HashMap<(u64, u32), usize> = arrivals
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.turn.map(|t| ((t.session, t.index), i)))
            .collect();
        for (i, a) in arrivals.iter().enumerate() {
            let Some(Turn {
                session,
                index,
                think_s,
            }) = a.turn
            else {
                continue;
            };
            let prev = index
                .checked_sub(1)
                .and_then(|p| by_turn.get(&(session, p)));
            if let Some(&p) = prev {
                c.next[p] = Some((i, think_s));
                c.held[i] = true;
            }
        }
        c
    }

    /// Arrival `i` is sent only when its session's previous turn finishes.
    pub(crate) fn held(&self, i: usize) -> bool {
        self.held[i]
    }

    /// The turn that `i` finishing releases, and after how long.
    pub(crate) fn next(&self, i: usize) -> Option<(usize, f64)> {
        self.next[i]
    }

    /// `i` was refused: its session ends, so its later turns are never sent. How many they are.
    pub(crate) fn abandon(&self, i: usize) -> usize {
        std::iter::successors(self.next[i], |&(j, _)| self.next[j]).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(t: f64) -> Arrival {
        Arrival {
            t,
            prompt_tokens: 100,
            output_tokens: 10,
            stream: true,
            direct: false,
            prompt: None,
            model: None,
            turn: None,
        }
    }

    fn turn(t: f64, session: u64, index: u32) -> Arrival {
        let think_s = 0.5 + index as f64;
        Arrival {
            turn: Some(Turn {
                session,
                index,
                think_s,
            }),
            ..open(t)
        }
    }

    #[test]
    fn each_turn_waits_for_its_predecessor_and_a_missing_one_frees_it() {
        // Session 7's turn 0 fell before the run: its turn 1 is sent on time.
        let a = vec![
            turn(0.0, 3, 0),
            turn(0.1, 7, 1),
            turn(1.0, 3, 1),
            turn(1.5, 7, 2),
            turn(2.0, 3, 2),
            open(2.5),
        ];
        let c = ClosedLoop::new(&a);
        let held: Vec<bool> = (0..a.len()).map(|i| c.held(i)).collect();
        assert_eq!(held, [false, false, true, true, true, false]);
        assert_eq!(c.next(0), Some((2, 1.5)));
        assert_eq!(c.next(2), Some((4, 2.5)));
        assert_eq!(c.next(1), Some((3, 2.5)));
        assert_eq!(c.next(4), None);
        assert_eq!(c.next(5), None);
        assert_eq!(c.abandon(0), 2);
        assert_eq!(c.abandon(3), 0);
    }

    #[test]
    fn the_simulator_sends_a_turn_only_after_its_predecessor_finished_and_the_think_time() {
        let mut s = crate::scenario::by_name("s0").expect("s0");
        s.duration_s = 10.0;
        // Three turns nominally 10 ms apart; each takes 40 decode steps, far longer than that.
        let a: Vec<Arrival> = (0..3)
            .map(|k| Arrival {
                output_tokens: 40,
                ..turn(0.01 * k as f64, 1, k)
            })
            .collect();
        let v = &crate::scenario::CACHE_VARIANTS[1];
        let (out, _) = crate::scenario::run_arrivals(&s, &a, v);
        assert_eq!(out.completed, 3);
        for k in 1..3 {
            let done = out.arrived[k - 1] + out.e2e[k - 1];
            let think = 0.5 + k as f64;
            assert!(
                (out.arrived[k] - (done + think)).abs() < 1e-9,
                "turn {k} sent at {} not {done} + {think}",
                out.arrived[k]
            );
        }
    }
}
