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
//! * a **prefix cache** ([`crate::radix`]) when requests carry token ids: a request's longest
//!   cached prefix skips prefill, its path is locked while it runs, a prefilled request that runs
//!   on publishes its prompt at once (SGLang's `checkpoint_kv_cache`: a session's next turn
//!   matches a turn still decoding), a finished one inserts its prompt and output, and the pool
//!   evicts unlocked LRU pages before it retracts anyone (`pool.rs`). Token-count-only requests
//!   never match and are never cached;
//! * a **host tier** when `host_tier.tokens > 0` (SGLang's HiCache, [`crate::host_tier`]):
//!   evicted pages are demoted to a host pool; a request whose prefix continues there has those
//!   pages loaded back at admission, and its prefill step pays `loaded / load_tokens_per_s`
//!   instead of computing them;
//! * **LoRA adapters** when `lora.max_loaded > 0` (`lora.rs`): a request runs only while its
//!   adapter is resident; a load pauses the step for `lora.load_time_s` and evicts the least
//!   recently used adapter no admitted request uses;
//! * step time `base + a·prefill_tokens + b·batch_size + c·kv_tokens_in_batch` (+ load-back and
//!   adapter-load time), prefill tokens being the uncached ones;
//! * **prefill–decode disaggregation** (`pd.rs`): a prefill engine's request, once prefilled,
//!   holds its KV in the transfer queue until the KV has been sent, and then finishes with its
//!   first token; a decode engine's request waits without KV until its KV has arrived, and is
//!   then admitted straight into decode (its prompt counted in KV usage, no prefill compute).
//!
//! No I/O and no clock: [`Scheduler::step`] takes `now` (seconds) and returns how long the step
//! takes and what happened, so the engine drives it in real time and benchmarks in virtual time.

mod lora;
mod pd;
mod pool;
mod request;
mod snapshot;

pub use lora::LoraConfig;
pub use pd::PdMode;
pub use request::{Disagg, Event, Step, StepKind, Submit};

use crate::host_tier::HostTierConfig;
use crate::radix::{PageChain, PathLock, PrefixCache};
use std::collections::VecDeque;
use std::sync::Arc;

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

/// vLLM's default block size; SGLang's page size is a server flag too.
pub const DEFAULT_PAGE_SIZE: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelConfig {
    pub max_running_requests: usize,
    pub max_total_tokens: u64,
    pub chunked_prefill_size: u64,
    /// Fraction of a running request's remaining output that admission reserves.
    pub new_token_ratio: f64,
    /// Tokens per KV page: the prefix cache's unit, and the KV-event block size.
    pub page_size: usize,
    pub timing: Timing,
    /// The host tier (off by default).
    pub host_tier: HostTierConfig,
    /// LoRA adapters' residency (off by default).
    pub lora: LoraConfig,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            max_running_requests: 128,
            max_total_tokens: 200_000,
            chunked_prefill_size: 8_192,
            new_token_ratio: 0.5,
            page_size: DEFAULT_PAGE_SIZE,
            timing: Timing::default(),
            host_tier: HostTierConfig::default(),
            lora: LoraConfig::default(),
        }
    }
}

#[derive(Debug, Clone)]
struct Req {
    id: u64,
    prompt: u64,
    max_new: u64,
    generated: u64,
    /// Tokens of `prefill_target()` in KV, the cached prefix included.
    prefilled: u64,
    retracted: bool,
    /// Prompt token ids and the page hashes of all but its last token (at least one token is
    /// always computed, as SGLang does, so the step has logits to sample from).
    tokens: Option<Arc<[u32]>>,
    chain: PageChain,
    /// Cached tokens when queued: what `num_waiting_uncached_tokens` leaves out.
    queued_hit: u64,
    /// Its locked cached prefix while admitted (0 while waiting); its prompt once prefilled.
    shared: u64,
    /// The cached prefix it was admitted with (tokens it did not prefill).
    admitted_hit: u64,
    lock: PathLock,
    /// Tokens of `shared` loaded back from the host tier, paid by its next prefill step.
    loaded: u64,
    /// Its LoRA adapter (an index into the engine's table), `None` for the base model.
    adapter: Option<u32>,
    /// Its part in prefill–decode disaggregation.
    disagg: Disagg,
    /// A prefill request: whether its decode side has registered for the KV.
    registered: bool,
}

impl Req {
    /// Tokens to prefill: the prompt, plus what was generated before a retraction.
    fn prefill_target(&self) -> u64 {
        self.prompt + self.generated
    }
    /// KV tokens this request holds outside the cache (its own pages).
    fn private_kv(&self) -> u64 {
        self.prefilled - self.shared
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
    /// (time, cached tokens, prompt tokens) of recent admissions, for the hit rate.
    hits: VecDeque<(f64, u64, u64)>,
    /// Cumulative cached and prompt tokens of every admission (retractions' re-admissions not
    /// counted).
    hit_tokens: u64,
    prompt_tokens: u64,
}

const RATE_WINDOW_S: f64 = 5.0;
/// SGLang's `SGLANG_CACHE_HIT_RATE_WINDOW_SECONDS` default.
const HIT_RATE_WINDOW_S: f64 = 15.0;

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
    cache: PrefixCache,
    adapters: lora::Adapters,
    /// The disaggregation queues (empty unless requests ask for it).
    pd: pd::PdQueues,
}

impl Scheduler {
    pub fn new(cfg: ModelConfig) -> Self {
        Self::build(cfg, false)
    }

    /// A scheduler whose cache records KV events for [`Scheduler::take_kv_events`].
    pub fn with_kv_events(cfg: ModelConfig) -> Self {
        Self::build(cfg, true)
    }

    fn build(cfg: ModelConfig, record_events: bool) -> Self {
        Scheduler {
            cfg,
            waiting: VecDeque::new(),
            chunked: None,
            running: Vec::new(),
            stats: Stats::default(),
            retractions: 0,
            now: 0.0,
            cache: PrefixCache::new(cfg.page_size, record_events)
                .with_host_tier(cfg.host_tier.tokens),
            adapters: lora::Adapters::default(),
            pd: pd::PdQueues::default(),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Queues a request (FCFS), matching its prompt against the cache as SGLang does when it
    /// queues one. A zero-token output finishes at its first token.
    pub fn submit(&mut self, s: Submit) {
        let chain = s.page_chain(self.cfg.page_size);
        self.submit_hashed(s, chain);
    }

    /// [`Scheduler::submit`] with the prompt's pages already hashed: `chain` must be
    /// `s.page_chain(page_size)` at this scheduler's page size (who submits one request to many
    /// copies of a scheduler hashes it once).
    pub fn submit_hashed(&mut self, s: Submit, chain: PageChain) {
        let tokens = s.prompt.filter(|t| !t.is_empty());
        let prompt = tokens.as_ref().map_or(s.prompt_tokens, |t| t.len() as u64);
        let queued_hit = self.cache.matched_tokens(&chain);
        let req = Req {
            id: s.id,
            prompt: prompt.max(1),
            // A prefill engine generates the first token only: nothing more to reserve for.
            max_new: match s.disagg {
                Disagg::Prefill => 1,
                _ => s.max_new_tokens.max(1),
            },
            generated: 0,
            prefilled: 0,
            retracted: false,
            tokens,
            chain,
            queued_hit,
            shared: 0,
            admitted_hit: 0,
            lock: PathLock::default(),
            loaded: 0,
            adapter: s.adapter,
            disagg: s.disagg,
            registered: false,
        };
        match req.disagg {
            Disagg::Decode => self.pd.awaiting.push(req),
            Disagg::Local | Disagg::Prefill => self.waiting.push_back(req),
        }
    }

    /// Removes a request wherever it is and frees its KV. Returns whether it was known.
    pub fn abort(&mut self, id: u64) -> bool {
        if let Some(i) = self.waiting.iter().position(|r| r.id == id) {
            self.waiting.remove(i);
            return true;
        }
        if let Some(found) = self.pd.remove(id) {
            self.cache.unlock(found.lock);
            return true;
        }
        let req = if self.chunked.as_ref().is_some_and(|r| r.id == id) {
            self.chunked.take()
        } else {
            let i = self.running.iter().position(|r| r.id == id);
            i.map(|i| self.running.swap_remove(i))
        };
        match req {
            Some(r) => {
                self.cache.unlock(r.lock);
                true
            }
            None => false,
        }
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// The cached prefix request `id` was admitted with (tokens it did not prefill); `None` for
    /// a request not admitted here (waiting, finished, or another engine's).
    pub fn admitted_hit(&self, id: u64) -> Option<u64> {
        (self.running.iter().chain(self.chunked.as_ref()))
            .find(|r| r.id == id)
            .map(|r| r.admitted_hit)
    }

    /// Waiting requests, including a partly prefilled one and those whose KV arrived from a
    /// prefill engine but that wait for room (SGLang's decode waiting queue).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len() + usize::from(self.chunked.is_some()) + self.pd.arrived.len()
    }

    pub fn retractions(&self) -> u64 {
        self.retractions
    }

    /// Nothing to compute (requests waiting for a KV transfer need an outside event first).
    pub fn is_idle(&self) -> bool {
        self.running.is_empty()
            && self.waiting.is_empty()
            && self.chunked.is_none()
            && self.pd.arrived.is_empty()
    }

    /// Runs one scheduler iteration starting at `now` (seconds). Requests whose KV arrived from
    /// a prefill engine are admitted first (their first token is announced with this step).
    pub fn step(&mut self, now: f64) -> Step {
        self.now = now;
        let admitted = self.admit_arrived();
        let mut step = if let Some(step) = self.prefill_step() {
            step
        } else if !self.running.is_empty() {
            self.decode_step()
        } else {
            Step {
                kind: StepKind::Idle,
                duration: 0.0,
                events: Vec::new(),
            }
        };
        if !admitted.is_empty() {
            if step.kind == StepKind::Idle {
                // Admissions that finished at once: a step of no compute that carries them.
                step.kind = StepKind::Decode;
            }
            step.events.splice(0..0, admitted);
        }
        step
    }

    /// The next request to prefill, with the µs its adapter's load costs: the chunked one, else
    /// the first queued one whose adapter can be made resident, if it is admitted.
    fn next_prefill(&mut self, batch: &[Req], tokens: u64) -> Option<(Req, f64)> {
        if let Some(r) = self.chunked.take() {
            return Some((r, 0.0));
        }
        let i = self.next_runnable(batch)?;
        let mut next = self.waiting.remove(i)?;
        if self.admit(&mut next, batch.len(), tokens) {
            let load_us = self.use_adapter(&next, batch);
            Some((next, load_us))
        } else {
            self.waiting.insert(i, next);
            None
        }
    }

    fn prefill_step(&mut self) -> Option<Step> {
        let mut budget = self.cfg.chunked_prefill_size.max(1);
        let mut batch: Vec<Req> = Vec::new();
        let mut tokens = 0u64;
        // Own KV of the requests taken out of the queues for this step (not counted by the pool).
        let mut held = 0u64;
        let mut loaded = 0u64;
        let mut adapter_load_us = 0.0;
        while let Some((mut req, load_us)) = self.next_prefill(&batch, tokens) {
            adapter_load_us += load_us;
            loaded += std::mem::take(&mut req.loaded);
            let n = budget.min(req.prefill_target() - req.prefilled);
            self.make_room(held + req.private_kv() + n);
            req.prefilled += n;
            held += req.private_kv();
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
            + t.per_kv_token_us * tokens as f64
            + self.load_back_us(loaded)
            + adapter_load_us;
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
            if req.disagg == Disagg::Prefill {
                // Its KV now waits for the transfer to its decode engine.
                self.pd.transfer.push(req);
                continue;
            }
            self.finish_or_run(req, &mut events);
        }
        self.record(duration, events.len() as u64);
        Some(Step {
            kind: StepKind::Prefill,
            duration,
            events,
        })
    }

    fn decode_step(&mut self) -> Step {
        // Room for one new token per running request: evict cached pages first, then retract
        // the newest request while that is not enough.
        self.make_room(self.running.len() as u64);
        while self.running.len() > 1 && self.free_tokens() < self.running.len() as u64 {
            let victim = self.running.pop().expect("len > 1");
            self.retract(victim);
            self.make_room(self.running.len() as u64);
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
                let done = self.running.remove(i);
                self.finish(done);
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

    /// Microseconds to copy `tokens` back from the host tier.
    fn load_back_us(&self, tokens: u64) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        tokens as f64 * 1e6 / self.cfg.host_tier.load_tokens_per_s.max(1.0)
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
}

#[cfg(test)]
mod cache_tests;
mod cache_view;
#[cfg(test)]
mod host_tier_tests;
#[cfg(test)]
mod lora_tests;
#[cfg(test)]
mod namespace_tests;
#[cfg(test)]
mod pd_tests;
#[cfg(test)]
mod tests;
