//! The pure scheduler model of one DP rank: what SGLang's scheduler does where load is concerned.
//!
//! * a FCFS waiting queue; a running batch bounded by `max_running_requests`;
//! * a KV pool of `max_total_tokens`: admission reserves the prompt plus `new_token_ratio` of the
//!   remaining output of every running request (SGLang's optimistic reservation), so decode can
//!   overflow the pool — then the newest running request is **retracted** (its KV freed, back to
//!   the front of the queue, re-prefilling prompt + generated tokens);
//! * chunked prefill: at most `chunked_prefill_size` prompt tokens per prefill step, a long prompt
//!   continues over several steps; a prefill step emits each completed request's first token;
//! * a decode step generates one token for every running request;
//! * step time `base + a·prefill_tokens + b·batch_size + c·kv_tokens_in_batch`.
//!
//! No I/O and no clock: [`Scheduler::step`] takes `now` (seconds) and returns how long the step
//! takes and what happened, so the engine drives it in real time and benchmarks in virtual time.

use loadlink_wire::LoadSnapshot;
use loadlink_wire::snapshot::{MemoryMetrics, QueueMetrics};
use std::collections::VecDeque;

/// Step-time model coefficients (microseconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub base_us: f64,
    pub per_prefill_token_us: f64,
    pub per_batch_req_us: f64,
    pub per_kv_token_us: f64,
}

impl Default for Timing {
    /// A 7B-class model on one GPU: prefill ≈ 10k tokens/s; decode ≈ 30 ms per step at batch 64
    /// with ~1,000 KV tokens per request.
    fn default() -> Self {
        Timing {
            base_us: 8_000.0,
            per_prefill_token_us: 100.0,
            per_batch_req_us: 250.0,
            per_kv_token_us: 0.1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelConfig {
    pub max_running_requests: usize,
    pub max_total_tokens: u64,
    pub chunked_prefill_size: u64,
    /// Fraction of a running request's remaining output that admission reserves.
    pub new_token_ratio: f64,
    pub timing: Timing,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            max_running_requests: 128,
            max_total_tokens: 200_000,
            chunked_prefill_size: 8_192,
            new_token_ratio: 0.5,
            timing: Timing::default(),
        }
    }
}

/// A request as the scheduler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submit {
    pub id: u64,
    pub prompt_tokens: u64,
    pub max_new_tokens: u64,
}

/// Something a request's client should hear about; all happen at the end of the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The first output token (end of prefill).
    FirstToken { id: u64 },
    /// One more output token.
    Token { id: u64 },
    /// Done; `completion_tokens` tokens were generated.
    Finished {
        id: u64,
        prompt_tokens: u64,
        completion_tokens: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    Prefill,
    Decode,
    Idle,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub kind: StepKind,
    /// Seconds the step takes (0 when idle).
    pub duration: f64,
    pub events: Vec<Event>,
}

#[derive(Debug, Clone)]
struct Req {
    id: u64,
    prompt: u64,
    max_new: u64,
    generated: u64,
    /// Tokens of `prefill_target()` already in KV.
    prefilled: u64,
    retracted: bool,
}

impl Req {
    /// Tokens to prefill: the prompt, plus what was generated before a retraction.
    fn prefill_target(&self) -> u64 {
        self.prompt + self.generated
    }
    /// KV tokens this request holds.
    fn kv(&self) -> u64 {
        self.prefilled
    }
}

/// Cumulative counters and a sliding window for rates.
#[derive(Debug, Clone, Default)]
struct Stats {
    total_prefill_tokens: u64,
    total_prefill_busy_us: u64,
    /// count, Σb, Σt_us, Σb², Σb·t_us, Σg
    decode_moments: [f64; 6],
    /// (end time, generated tokens, busy seconds) of recent steps.
    window: VecDeque<(f64, u64, f64)>,
}

const RATE_WINDOW_S: f64 = 5.0;

/// One rank's scheduler.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: ModelConfig,
    waiting: VecDeque<Req>,
    /// The request whose prompt is being prefilled in chunks.
    chunked: Option<Req>,
    running: Vec<Req>,
    stats: Stats,
    retractions: u64,
    now: f64,
}

impl Scheduler {
    pub fn new(cfg: ModelConfig) -> Self {
        Scheduler {
            cfg,
            waiting: VecDeque::new(),
            chunked: None,
            running: Vec::new(),
            stats: Stats::default(),
            retractions: 0,
            now: 0.0,
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Queues a request (FCFS). A zero-token output finishes at its first token.
    pub fn submit(&mut self, s: Submit) {
        self.waiting.push_back(Req {
            id: s.id,
            prompt: s.prompt_tokens.max(1),
            max_new: s.max_new_tokens.max(1),
            generated: 0,
            prefilled: 0,
            retracted: false,
        });
    }

    /// Removes a request wherever it is and frees its KV. Returns whether it was known.
    pub fn abort(&mut self, id: u64) -> bool {
        if let Some(i) = self.waiting.iter().position(|r| r.id == id) {
            self.waiting.remove(i);
            return true;
        }
        if self.chunked.as_ref().is_some_and(|r| r.id == id) {
            self.chunked = None;
            return true;
        }
        if let Some(i) = self.running.iter().position(|r| r.id == id) {
            self.running.swap_remove(i);
            return true;
        }
        false
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Waiting requests, including a partly prefilled one.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len() + usize::from(self.chunked.is_some())
    }

    /// KV tokens in use.
    pub fn used_tokens(&self) -> u64 {
        self.running.iter().map(Req::kv).sum::<u64>()
            + self.chunked.as_ref().map_or(0, |r| r.prefilled)
    }

    pub fn retractions(&self) -> u64 {
        self.retractions
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty() && self.chunked.is_none()
    }

    fn reserved_tokens(&self) -> u64 {
        let r = self.cfg.new_token_ratio;
        self.running
            .iter()
            .map(|q| ((q.max_new - q.generated.min(q.max_new)) as f64 * r).ceil() as u64)
            .sum()
    }

    /// Whether `req` can be admitted: batch room and KV for its prompt plus its reservation.
    fn admits(&self, req: &Req, extra_batch: usize, extra_tokens: u64) -> bool {
        if self.running.len() + extra_batch + 1 > self.cfg.max_running_requests {
            return false;
        }
        let need = req.prefill_target()
            + ((req.max_new - req.generated.min(req.max_new)) as f64 * self.cfg.new_token_ratio)
                .ceil() as u64;
        self.used_tokens() + self.reserved_tokens() + extra_tokens + need <= self.cfg.max_total_tokens
            // A request larger than the whole pool would never run: admit it alone and let
            // retraction/decode bound it, rather than wedge the queue forever.
            || (self.running.is_empty() && extra_batch == 0 && extra_tokens == 0)
    }

    /// Runs one scheduler iteration starting at `now` (seconds).
    pub fn step(&mut self, now: f64) -> Step {
        self.now = now;
        if let Some(step) = self.prefill_step() {
            return step;
        }
        if !self.running.is_empty() {
            return self.decode_step();
        }
        Step {
            kind: StepKind::Idle,
            duration: 0.0,
            events: Vec::new(),
        }
    }

    fn prefill_step(&mut self) -> Option<Step> {
        let mut budget = self.cfg.chunked_prefill_size.max(1);
        let mut batch: Vec<Req> = Vec::new();
        let mut tokens = 0u64;
        let mut carry = self.chunked.take();
        loop {
            let mut req = match carry.take() {
                Some(r) => r,
                None => {
                    let Some(next) = self.waiting.front() else {
                        break;
                    };
                    if !self.admits(next, batch.len(), tokens) {
                        break;
                    }
                    self.waiting.pop_front().expect("front exists")
                }
            };
            let n = budget.min(req.prefill_target() - req.prefilled);
            req.prefilled += n;
            tokens += n;
            budget -= n;
            if req.prefilled < req.prefill_target() {
                self.chunked = Some(req);
                break;
            }
            batch.push(req);
            if budget == 0 {
                break;
            }
        }
        if tokens == 0 && batch.is_empty() {
            return None;
        }
        let t = &self.cfg.timing;
        let n_reqs = batch.len() + usize::from(self.chunked.is_some());
        let duration_us = t.base_us
            + t.per_prefill_token_us * tokens as f64
            + t.per_batch_req_us * n_reqs as f64
            + t.per_kv_token_us * tokens as f64;
        let duration = duration_us / 1e6;
        self.stats.total_prefill_tokens += tokens;
        self.stats.total_prefill_busy_us += duration_us as u64;
        let mut events = Vec::with_capacity(batch.len() * 2);
        for mut req in batch {
            // Prefill produces the first output token (a retracted request resumes instead).
            if !req.retracted {
                events.push(Event::FirstToken { id: req.id });
                req.generated = 1;
            }
            req.retracted = false;
            if req.generated >= req.max_new {
                events.push(Event::Finished {
                    id: req.id,
                    prompt_tokens: req.prompt,
                    completion_tokens: req.generated,
                });
            } else {
                self.running.push(req);
            }
        }
        self.record(duration, events.len() as u64);
        Some(Step {
            kind: StepKind::Prefill,
            duration,
            events,
        })
    }

    fn decode_step(&mut self) -> Step {
        // Make room for one new token per running request, retracting the newest if needed.
        while self.running.len() > 1
            && self.used_tokens() + self.running.len() as u64 > self.cfg.max_total_tokens
        {
            let mut victim = self.running.pop().expect("len > 1");
            victim.prefilled = 0;
            victim.retracted = true;
            self.retractions += 1;
            self.waiting.push_front(victim);
        }
        let t = &self.cfg.timing;
        let b = self.running.len() as f64;
        let kv = self.used_tokens() as f64;
        let duration_us = t.base_us + t.per_batch_req_us * b + t.per_kv_token_us * kv;
        let mut events = Vec::with_capacity(self.running.len());
        let mut i = 0;
        while i < self.running.len() {
            let r = &mut self.running[i];
            r.generated += 1;
            r.prefilled += 1;
            if r.generated >= r.max_new {
                events.push(Event::Finished {
                    id: r.id,
                    prompt_tokens: r.prompt,
                    completion_tokens: r.generated,
                });
                self.running.remove(i);
            } else {
                events.push(Event::Token { id: r.id });
                i += 1;
            }
        }
        let m = &mut self.stats.decode_moments;
        let g = b; // one token per request per step (no speculative decoding)
        m[0] += 1.0;
        m[1] += b;
        m[2] += duration_us;
        m[3] += b * b;
        m[4] += b * duration_us;
        m[5] += g;
        let duration = duration_us / 1e6;
        self.record(duration, b as u64);
        Step {
            kind: StepKind::Decode,
            duration,
            events,
        }
    }

    fn record(&mut self, duration: f64, tokens: u64) {
        let end = self.now + duration;
        self.stats.window.push_back((end, tokens, duration));
        while self
            .stats
            .window
            .front()
            .is_some_and(|w| w.0 < end - RATE_WINDOW_S)
        {
            self.stats.window.pop_front();
        }
    }

    /// This rank's load, as SGLang's collector reports it (`wall_ts`: wall-clock seconds).
    pub fn snapshot(&self, rank: u32, wall_ts: f64) -> LoadSnapshot {
        let used = self.used_tokens();
        let cap = self.cfg.max_total_tokens;
        let waiting_uncached: u64 = self
            .waiting
            .iter()
            .map(|r| r.prefill_target() - r.prefilled)
            .sum::<u64>()
            + self
                .chunked
                .as_ref()
                .map_or(0, |r| r.prefill_target() - r.prefilled);
        let queued: u64 = self.waiting.iter().map(Req::prefill_target).sum();
        let since = self.now - RATE_WINDOW_S;
        let (tokens, busy) = self
            .stats
            .window
            .iter()
            .filter(|w| w.0 >= since)
            .fold((0u64, 0.0), |(t, b), w| (t + w.1, b + w.2));
        let span = RATE_WINDOW_S.min(self.now);
        LoadSnapshot {
            timestamp: Some(wall_ts),
            dp_rank: rank as i64,
            num_running_reqs: self.running.len() as i64,
            num_waiting_reqs: self.num_waiting() as i64,
            num_waiting_uncached_tokens: waiting_uncached as i64,
            num_used_tokens: used as i64,
            num_total_tokens: (used + queued) as i64,
            num_active_tokens: (used + queued) as i64,
            max_total_num_tokens: cap as i64,
            max_running_requests: self.cfg.max_running_requests as i64,
            token_usage: Some(if cap == 0 {
                0.0
            } else {
                used as f64 / cap as f64
            }),
            gen_throughput: Some(if span > 0.0 {
                tokens as f64 / span
            } else {
                0.0
            }),
            cache_hit_rate: Some(0.0),
            utilization: Some(if span > 0.0 {
                (busy / span).min(1.0)
            } else {
                0.0
            }),
            total_prefill_uncached_tokens: self.stats.total_prefill_tokens as i64,
            total_prefill_busy_us: self.stats.total_prefill_busy_us as i64,
            decode_moments: Some(self.stats.decode_moments.to_vec()),
            memory: Some(MemoryMetrics {
                weight_gb: 0.0,
                kv_cache_gb: 0.0,
                graph_gb: 0.0,
                token_capacity: cap as i64,
            }),
            queues: Some(QueueMetrics {
                waiting: self.num_waiting() as i64,
                retracted: self.waiting.iter().filter(|r| r.retracted).count() as i64,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Runs the scheduler in virtual time, submitting `arrivals` (time, request) as they come;
    /// returns (TTFT per id, finish time per id, max waiting seen, retractions).
    fn simulate(
        cfg: ModelConfig,
        arrivals: &[(f64, Submit)],
        horizon: f64,
    ) -> (HashMap<u64, f64>, HashMap<u64, f64>, usize, Scheduler) {
        let mut s = Scheduler::new(cfg);
        let (mut now, mut next) = (0.0, 0);
        let (mut ttft, mut done) = (HashMap::new(), HashMap::new());
        let mut max_waiting = 0;
        let arrived_at: HashMap<u64, f64> = arrivals.iter().map(|(t, r)| (r.id, *t)).collect();
        while now < horizon {
            while next < arrivals.len() && arrivals[next].0 <= now {
                s.submit(arrivals[next].1);
                next += 1;
            }
            max_waiting = max_waiting.max(s.num_waiting());
            let step = s.step(now);
            if step.kind == StepKind::Idle {
                if next >= arrivals.len() {
                    break;
                }
                now = arrivals[next].0;
                continue;
            }
            now += step.duration;
            for e in step.events {
                match e {
                    Event::FirstToken { id } => {
                        ttft.insert(id, now - arrived_at[&id]);
                    }
                    Event::Finished { id, .. } => {
                        done.insert(id, now);
                    }
                    Event::Token { .. } => {}
                }
            }
        }
        (ttft, done, max_waiting, s)
    }

    fn req(id: u64, prompt: u64, out: u64) -> Submit {
        Submit {
            id,
            prompt_tokens: prompt,
            max_new_tokens: out,
        }
    }

    #[test]
    fn overload_grows_the_queue_and_ttft() {
        let cfg = ModelConfig {
            max_running_requests: 8,
            ..Default::default()
        };
        // 10 requests/s of 200-token outputs: far above what 8 slots at ~10 ms/step can serve.
        let arrivals: Vec<_> = (0..200)
            .map(|i| (i as f64 * 0.1, req(i, 500, 200)))
            .collect();
        let (ttft, done, max_waiting, _) = simulate(cfg, &arrivals, 10_000.0);
        assert_eq!(done.len(), 200, "every request finishes");
        assert!(
            max_waiting > 50,
            "the queue grows under overload: {max_waiting}"
        );
        let early: f64 = (0..10).map(|i| ttft[&i]).sum::<f64>() / 10.0;
        let late: f64 = (190..200).map(|i| ttft[&i]).sum::<f64>() / 10.0;
        assert!(
            late > 10.0 * early,
            "TTFT grows with the queue: early {early:.3}s, late {late:.3}s"
        );
    }

    #[test]
    fn light_load_has_no_queue() {
        let arrivals: Vec<_> = (0..50).map(|i| (i as f64 * 1.0, req(i, 200, 20))).collect();
        let (ttft, done, max_waiting, _) = simulate(ModelConfig::default(), &arrivals, 1_000.0);
        assert_eq!(done.len(), 50);
        assert!(max_waiting <= 1);
        assert!(
            ttft.values().all(|&t| t < 0.1),
            "prefill of 200 tokens ≈ 30 ms"
        );
    }

    #[test]
    fn kv_exhaustion_stops_admission_retracts_and_loses_nothing() {
        let cfg = ModelConfig {
            max_total_tokens: 4_000,
            new_token_ratio: 0.1,
            max_running_requests: 64,
            ..Default::default()
        };
        let arrivals: Vec<_> = (0..40).map(|i| (0.0, req(i, 300, 400))).collect();
        let mut s = Scheduler::new(cfg);
        for (_, r) in &arrivals {
            s.submit(*r);
        }
        let first = s.step(0.0);
        assert_eq!(first.kind, StepKind::Prefill);
        assert!(
            s.num_running() < 40 && s.num_waiting() > 0,
            "admission stops when the pool is reserved"
        );
        assert!(s.used_tokens() <= 4_000);
        let (_, done, _, s) = simulate(cfg, &arrivals, 100_000.0);
        assert_eq!(done.len(), 40, "nothing lost");
        assert!(
            s.retractions() > 0,
            "optimistic reservation leads to retraction"
        );
        assert_eq!(s.used_tokens(), 0);
    }

    #[test]
    fn chunked_prefill_spreads_a_long_prompt_over_steps() {
        let cfg = ModelConfig {
            chunked_prefill_size: 1_000,
            ..Default::default()
        };
        let mut s = Scheduler::new(cfg);
        s.submit(req(1, 3_500, 5));
        let mut prefill_steps = 0;
        let mut now = 0.0;
        loop {
            let st = s.step(now);
            now += st.duration;
            if st.kind != StepKind::Prefill {
                break;
            }
            prefill_steps += 1;
            if prefill_steps < 4 {
                assert!(st.events.is_empty(), "no first token before the last chunk");
                assert_eq!(s.num_waiting(), 1);
                assert_eq!(s.used_tokens(), 1_000 * prefill_steps);
            } else {
                assert_eq!(st.events, vec![Event::FirstToken { id: 1 }]);
            }
        }
        assert_eq!(prefill_steps, 4);
    }

    #[test]
    fn abort_frees_kv_everywhere() {
        let mut s = Scheduler::new(ModelConfig {
            chunked_prefill_size: 100,
            max_running_requests: 2,
            ..Default::default()
        });
        s.submit(req(1, 50, 100));
        s.submit(req(2, 50, 100));
        s.submit(req(3, 500, 100));
        s.step(0.0); // 1 and 2 run
        s.step(0.1); // decode
        assert!(s.used_tokens() > 100);
        assert!(s.abort(1) && s.abort(2));
        assert_eq!(s.used_tokens(), 0);
        s.step(0.2); // 3 starts chunked prefill
        assert_eq!(s.used_tokens(), 100);
        assert!(s.abort(3));
        assert_eq!(s.used_tokens(), 0);
        assert!(!s.abort(3));
        assert!(s.is_idle());
    }

    #[test]
    fn snapshot_reports_the_state() {
        let mut s = Scheduler::new(ModelConfig {
            max_running_requests: 1,
            ..Default::default()
        });
        s.submit(req(1, 100, 10));
        s.submit(req(2, 300, 10));
        s.step(0.0);
        let snap = s.snapshot(3, 123.0);
        assert_eq!(
            (snap.dp_rank, snap.num_running_reqs, snap.num_waiting_reqs),
            (3, 1, 1)
        );
        assert_eq!(snap.num_waiting_uncached_tokens, 300);
        assert_eq!(snap.num_used_tokens, 100);
        assert_eq!(snap.num_total_tokens, 400);
        assert_eq!(snap.timestamp, Some(123.0));
        assert_eq!(snap.total_prefill_uncached_tokens, 100);
    }

    #[test]
    fn decode_step_time_matches_the_calibration() {
        let mut s = Scheduler::new(ModelConfig::default());
        for i in 0..64 {
            s.submit(req(i, 1_000, 100));
        }
        let mut now = 0.0;
        let st = loop {
            let st = s.step(now);
            now += st.duration;
            if st.kind == StepKind::Decode {
                break st;
            }
        };
        assert!(
            (st.duration - 0.030).abs() < 0.004,
            "decode at batch 64 ≈ 30 ms, got {:.4}",
            st.duration
        );
    }
}
