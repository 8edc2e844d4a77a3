//! The `LoadBook`: the router's one owner of belief about load.
//!
//! For worker w with ranks R(w) it merges
//! * E(w) = Σ ranks (running + waiting) from engine snapshots — valid only if **every** rank's last
//!   message is younger than the freshness bound;
//! * D(w) = requests this router dispatched to w after the oldest rank snapshot it combines with;
//! * F(w) = this router's open in-flight guards on w,
//!
//! into `Load(w) = max(F, E + D)` when E is valid, else `F` (source: fallback). Every field is an
//! atomic, so the request path reads loads without locks or allocation, and a subscriber thread
//! updates them without blocking it. Engine-reported numbers are clamped to
//! [`MAX_REPORTED`] so one lying worker cannot attract or repel traffic without bound.
//!
//! For pricing in time ([`Worker::pricing_at`]) the book also keeps each rank's measured prefill
//! speed ([`prefill_rate`]), its KV usage, and the prompt tokens this router dispatched since the
//! snapshot (counted per dispatch by [`InflightGuard::with_tokens`], [`DISPATCH_TOKENS_GUESS`] per
//! dispatch that does not say).

pub mod prefill_rate;
mod pricing;
pub mod source;

pub use pricing::Pricing;
pub use source::{LoadSourceKind, LoadSourceState};

use loadlink_wire::{FrameError, LoadSnapshot};
use prefill_rate::{PRIOR_US_PER_TOKEN, PrefillRate};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Largest per-rank request count (and 1000× that for tokens) believed from an engine.
pub const MAX_REPORTED: i64 = 1_000_000;

/// Where a worker's load figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Engine snapshots (every rank fresh), corrected by recent dispatches.
    Engine,
    /// The router's own in-flight count (no range, stale or missing snapshots, or `--load-signal inflight`).
    Fallback,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Engine => "engine",
            Source::Fallback => "fallback",
        }
    }
}

/// Which signal policies price workers on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadSignal {
    /// Engine-reported queue depth (running + waiting), with in-flight fallback.
    Engine,
    /// The router's own in-flight count only (the classic behaviour, for comparison).
    Inflight,
    /// Engine-reported prefill backlog (`num_waiting_uncached_tokens`) plus a weight per queued
    /// request, plus an estimate for what this router dispatched since: a proxy for the time a new
    /// request waits for its first token. With in-flight fallback. The default: it measured best.
    #[default]
    Backlog,
}

impl LoadSignal {
    pub fn as_str(self) -> &'static str {
        match self {
            LoadSignal::Engine => "engine",
            LoadSignal::Inflight => "inflight",
            LoadSignal::Backlog => "backlog",
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "engine" => Ok(LoadSignal::Engine),
            "inflight" => Ok(LoadSignal::Inflight),
            "backlog" => Ok(LoadSignal::Backlog),
            o => Err(format!(
                "unknown load signal {o:?}; expected engine, backlog or inflight"
            )),
        }
    }
}

/// Prompt tokens assumed per request dispatched since the last snapshot (backlog signal).
pub const DISPATCH_TOKENS_GUESS: i64 = 512;

/// Under the backlog signal, each running or waiting request also weighs this many tokens: the
/// backlog alone misses a full batch whose waiting requests wait for decode, not prefill.
/// (Chosen from 1 / 32 / 128 / 512 on S0–S2; see docs/results.md.)
pub const REQUEST_TOKENS_WEIGHT: i64 = 128;

/// A worker's load as a policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub requests: i64,
    pub tokens: i64,
    /// What policies compare: `requests`, or the backlog cost under [`LoadSignal::Backlog`].
    pub score: i64,
    pub source: Source,
    /// Age of the oldest rank snapshot, ms (`u64::MAX` when there is none).
    pub age_ms: u64,
}

/// One DP rank's latest report.
#[derive(Debug, Default)]
pub struct RankState {
    /// ms since the book's epoch when the last message arrived; 0 = never.
    received_ms: AtomicU64,
    requests: AtomicI64,
    tokens: AtomicI64,
    /// The worker's dispatch counter when that message arrived.
    dispatch_mark: AtomicU64,
    pub last_seq: AtomicI64,
    pub messages: AtomicU64,
    pub gaps: AtomicU64,
    pub restarts: AtomicU64,
    pub running: AtomicI64,
    pub waiting: AtomicI64,
    /// Prompt tokens waiting for prefill (`num_waiting_uncached_tokens`).
    pub backlog: AtomicI64,
    /// f64 bits of the KV token usage (0–1).
    pub token_usage_bits: AtomicU64,
    /// The rank's measured prefill speed.
    pub prefill: PrefillRate,
    /// The worker's dispatched-token counter when that message arrived.
    tokens_mark: AtomicU64,
}

/// Why a worker is on the fallback signal no matter what (shown in `/workers` and metrics).
pub type FallbackReason = Option<String>;

/// One upstream worker.
#[derive(Debug)]
pub struct Worker {
    pub url: String,
    pub ranks: Vec<RankState>,
    /// Set when the worker advertises no load range (or discovery failed); static per worker.
    pub no_load_reason: FallbackReason,
    /// Where its engine load comes from, and how the polls fare ([`source`]).
    pub load_source: LoadSourceState,
    inflight: AtomicI64,
    dispatched: AtomicU64,
    /// Prompt tokens this router expected each dispatch to compute, summed.
    dispatched_tokens: AtomicU64,
    /// Uncached tokens of this router's open requests here: a bound on what of its dispatches can
    /// still be queued (a request that finished is not waiting for prefill).
    inflight_tokens: AtomicU64,
    pub requests_total: AtomicU64,
    /// Prompt tokens of the requests this router sent here after a cache lookup, and how many of
    /// them it believed cached here (their ratio is the hit rate the router routed for).
    pub routed_prompt_tokens: AtomicU64,
    pub routed_cached_tokens: AtomicU64,
    pub failures_total: AtomicU64,
    pub healthy: AtomicBool,
    /// Circuit breaker: consecutive failures and the time (ms since epoch) it reopens for traffic.
    pub consecutive_failures: AtomicU64,
    pub open_until_ms: AtomicU64,
    /// What this worker sent that was refused, by reason ([`crate::budget`]).
    pub refusals: crate::budget::PeerRefusals,
    /// Frames dropped by the subscriber, indexed by [`FrameError::index`].
    pub dropped: [AtomicU64; FrameError::REASONS.len()],
    /// Σ over ranks, recomputed by the (single) subscriber thread on every message so a pick reads
    /// one cache line instead of walking the ranks: requests, tokens, oldest receive time (0 if a
    /// rank never reported), smallest dispatch mark.
    agg_requests: AtomicI64,
    agg_tokens: AtomicI64,
    agg_backlog: AtomicI64,
    agg_oldest_rx: AtomicU64,
    agg_mark: AtomicU64,
    agg_tokens_mark: AtomicU64,
    /// f64 bits: the worker's µs per prefill token (its ranks prefill in parallel), prior included.
    agg_us_per_token_bits: AtomicU64,
    /// f64 bits: the fullest rank's KV usage (0–1).
    agg_kv_usage_bits: AtomicU64,
    epoch: Instant,
}

impl Worker {
    pub fn new(
        url: String,
        dp_size: usize,
        no_load_reason: FallbackReason,
        epoch: Instant,
    ) -> Self {
        Worker {
            url,
            ranks: (0..dp_size)
                .map(|_| RankState {
                    last_seq: AtomicI64::new(-1),
                    ..Default::default()
                })
                .collect(),
            load_source: LoadSourceState::new(if dp_size > 0 {
                LoadSourceKind::Push
            } else {
                LoadSourceKind::Inflight
            }),
            no_load_reason,
            inflight: AtomicI64::new(0),
            dispatched: AtomicU64::new(0),
            dispatched_tokens: AtomicU64::new(0),
            inflight_tokens: AtomicU64::new(0),
            requests_total: AtomicU64::new(0),
            routed_prompt_tokens: AtomicU64::new(0),
            routed_cached_tokens: AtomicU64::new(0),
            failures_total: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
            consecutive_failures: AtomicU64::new(0),
            open_until_ms: AtomicU64::new(0),
            refusals: Default::default(),
            dropped: Default::default(),
            agg_requests: AtomicI64::new(0),
            agg_tokens: AtomicI64::new(0),
            agg_backlog: AtomicI64::new(0),
            agg_oldest_rx: AtomicU64::new(0),
            agg_mark: AtomicU64::new(0),
            agg_tokens_mark: AtomicU64::new(0),
            agg_us_per_token_bits: AtomicU64::new(PRIOR_US_PER_TOKEN.to_bits()),
            agg_kv_usage_bits: AtomicU64::new(0),
            epoch,
        }
    }

    /// ms since this worker's epoch (shared by every worker of a fleet); read once per request
    /// and passed to [`Worker::load_at`] / [`Worker::available_at`], so a pick reads the clock once.
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Counts a request of `prompt` tokens sent here with `cached` of them believed cached.
    pub fn count_prefix(&self, prompt: u64, cached: u64) {
        self.routed_prompt_tokens.fetch_add(prompt, Relaxed);
        self.routed_cached_tokens
            .fetch_add(cached.min(prompt), Relaxed);
    }

    /// Counts a dropped frame under its reason.
    pub fn drop_frame(&self, why: &FrameError) {
        self.dropped[why.index()].fetch_add(1, Relaxed);
    }

    pub fn inflight(&self) -> i64 {
        self.inflight.load(Relaxed)
    }

    /// Records one engine message for `rank` with sequence `seq`. Returns what the seq said.
    pub fn record(&self, rank: usize, seq: i64, snap: &LoadSnapshot) -> SeqEvent {
        self.record_at(rank, seq, snap, self.now_ms())
    }

    /// [`Worker::record`] at a given `now` (ms on the same clock as `load_at`); the simulator
    /// drives the book in virtual time through this.
    pub fn record_at(&self, rank: usize, seq: i64, snap: &LoadSnapshot, now: u64) -> SeqEvent {
        if !self.apply_at(rank, snap, now) {
            return SeqEvent::UnknownRank;
        }
        self.account_seq(rank, seq)
    }

    /// Stores `rank`'s numbers from `snap` as received at `now`, without looking at a seq (the
    /// ingest decodes only the newest of a backlog and accounts every seq with
    /// [`Worker::account_seq`]). False for an unknown rank.
    pub fn apply_at(&self, rank: usize, snap: &LoadSnapshot, now: u64) -> bool {
        let Some(r) = self.ranks.get(rank) else {
            return false;
        };
        let clamp = |v: i64, max: i64| v.clamp(0, max);
        let running = clamp(snap.num_running_reqs, MAX_REPORTED);
        let waiting = clamp(snap.num_waiting_reqs, MAX_REPORTED);
        let tokens = clamp(
            snap.num_total_tokens.max(snap.num_used_tokens),
            MAX_REPORTED * 1000,
        );
        r.running.store(running, Relaxed);
        r.waiting.store(waiting, Relaxed);
        r.requests.store(running + waiting, Relaxed);
        r.tokens.store(tokens, Relaxed);
        r.backlog.store(
            clamp(snap.num_waiting_uncached_tokens, MAX_REPORTED * 1000),
            Relaxed,
        );
        let usage = snap.token_usage();
        r.token_usage_bits.store(
            if usage.is_finite() {
                usage.clamp(0.0, 1.0)
            } else {
                0.0
            }
            .to_bits(),
            Relaxed,
        );
        r.prefill.observe(
            snap.total_prefill_uncached_tokens,
            snap.total_prefill_busy_us,
        );
        r.dispatch_mark
            .store(self.dispatched.load(Relaxed), Relaxed);
        r.tokens_mark
            .store(self.dispatched_tokens.load(Relaxed), Relaxed);
        r.received_ms.store(now.max(1), Relaxed);
        self.aggregate();
        true
    }

    /// Counts one received message of `rank` with sequence `seq` (decoded or not): message count,
    /// gaps and restarts.
    pub fn account_seq(&self, rank: usize, seq: i64) -> SeqEvent {
        let Some(r) = self.ranks.get(rank) else {
            return SeqEvent::UnknownRank;
        };
        r.messages.fetch_add(1, Relaxed);
        let prev = r.last_seq.swap(seq, Relaxed);
        if prev < 0 || seq == prev + 1 {
            SeqEvent::InOrder
        } else if seq <= prev {
            r.restarts.fetch_add(1, Relaxed);
            SeqEvent::Restart
        } else {
            r.gaps.fetch_add((seq - prev - 1) as u64, Relaxed);
            SeqEvent::Gap
        }
    }

    fn aggregate(&self) {
        let (mut e, mut tokens, mut oldest, mut mark, mut backlog) =
            (0i64, 0i64, u64::MAX, u64::MAX, 0i64);
        let (mut tokens_mark, mut tokens_per_us, mut kv_usage) = (u64::MAX, 0.0f64, 0.0f64);
        for r in &self.ranks {
            backlog += r.backlog.load(Relaxed);
            e += r.requests.load(Relaxed);
            tokens += r.tokens.load(Relaxed);
            oldest = oldest.min(r.received_ms.load(Relaxed));
            mark = mark.min(r.dispatch_mark.load(Relaxed));
            tokens_mark = tokens_mark.min(r.tokens_mark.load(Relaxed));
            tokens_per_us += 1.0 / r.prefill.us_per_token().unwrap_or(PRIOR_US_PER_TOKEN);
            kv_usage = kv_usage.max(f64::from_bits(r.token_usage_bits.load(Relaxed)));
        }
        // Receive time last: a reader that sees it fresh sees the sums that go with it.
        self.agg_requests.store(e, Relaxed);
        self.agg_tokens.store(tokens, Relaxed);
        self.agg_backlog.store(backlog, Relaxed);
        self.agg_mark.store(mark, Relaxed);
        self.agg_tokens_mark.store(tokens_mark, Relaxed);
        if tokens_per_us > 0.0 {
            self.agg_us_per_token_bits
                .store((1.0 / tokens_per_us).to_bits(), Relaxed);
        }
        self.agg_kv_usage_bits.store(kv_usage.to_bits(), Relaxed);
        self.agg_oldest_rx
            .store(oldest, std::sync::atomic::Ordering::Release);
    }

    /// The worker's load under `signal`, with snapshots valid for `freshness_ms`.
    pub fn load(&self, signal: LoadSignal, freshness_ms: u64) -> Load {
        self.load_at(signal, freshness_ms, self.now_ms())
    }

    /// [`Worker::load`] at a given `now` (from [`Worker::now_ms`]).
    #[inline]
    pub fn load_at(&self, signal: LoadSignal, freshness_ms: u64, now: u64) -> Load {
        let f = self.inflight.load(Relaxed).max(0);
        // Under the backlog signal every score is in prompt tokens, fallback included.
        let unit = if signal == LoadSignal::Backlog {
            DISPATCH_TOKENS_GUESS
        } else {
            1
        };
        let fallback = |age_ms| Load {
            requests: f,
            tokens: 0,
            score: f * unit,
            source: Source::Fallback,
            age_ms,
        };
        if self.ranks.is_empty() {
            return fallback(u64::MAX);
        }
        let oldest_rx = self
            .agg_oldest_rx
            .load(std::sync::atomic::Ordering::Acquire);
        let (e, tokens, mark) = (
            self.agg_requests.load(Relaxed),
            self.agg_tokens.load(Relaxed),
            self.agg_mark.load(Relaxed),
        );
        let age_ms = if oldest_rx == 0 {
            u64::MAX
        } else {
            now.saturating_sub(oldest_rx)
        };
        if signal == LoadSignal::Inflight || age_ms > freshness_ms {
            return fallback(age_ms);
        }
        let d = self.dispatched.load(Relaxed).saturating_sub(mark) as i64;
        let requests = f.max(e + d);
        let score = match signal {
            LoadSignal::Backlog => {
                self.agg_backlog.load(Relaxed)
                    + d * DISPATCH_TOKENS_GUESS
                    + e * REQUEST_TOKENS_WEIGHT
            }
            _ => requests,
        };
        Load {
            requests,
            score,
            tokens,
            source: Source::Engine,
            age_ms,
        }
    }

    /// Whether the breaker lets traffic through and health checks pass.
    pub fn available(&self) -> bool {
        self.available_at(self.now_ms())
    }

    #[inline]
    pub fn available_at(&self, now: u64) -> bool {
        self.healthy.load(Relaxed) && self.open_until_ms.load(Relaxed) <= now
    }

    /// A failed attempt: opens the breaker after `threshold` in a row, for `cooldown_ms`.
    pub fn failed(&self, threshold: u64, cooldown_ms: u64) {
        self.failures_total.fetch_add(1, Relaxed);
        if self.consecutive_failures.fetch_add(1, Relaxed) + 1 >= threshold {
            self.open_until_ms
                .store(self.now_ms() + cooldown_ms, Relaxed);
        }
    }

    pub fn succeeded(&self) {
        self.consecutive_failures.store(0, Relaxed);
    }

    pub fn breaker_open(&self) -> bool {
        self.open_until_ms.load(Relaxed) > self.now_ms()
    }
}

/// What a sequence number told us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqEvent {
    InOrder,
    Gap,
    /// Seq went backwards: the publisher restarted. Its message is used at once.
    Restart,
    UnknownRank,
}

/// An in-flight request on a worker; releases the count when dropped (body end or disconnect).
#[derive(Debug)]
pub struct InflightGuard {
    worker: Arc<Worker>,
    /// The uncached tokens it was dispatched with.
    tokens: u64,
}

impl InflightGuard {
    /// Counts a dispatch and an open request on `worker`, expected to prefill
    /// [`DISPATCH_TOKENS_GUESS`] tokens there.
    pub fn new(worker: Arc<Worker>) -> Self {
        Self::with_tokens(worker, DISPATCH_TOKENS_GUESS as u64)
    }

    /// [`InflightGuard::new`] for a request expected to prefill `uncached_tokens` there (its prompt
    /// minus the prefix the router believes cached), so cost policies count what was dispatched
    /// since the last snapshot in tokens.
    pub fn with_tokens(worker: Arc<Worker>, uncached_tokens: u64) -> Self {
        worker.dispatched_tokens.fetch_add(uncached_tokens, Relaxed);
        worker.inflight_tokens.fetch_add(uncached_tokens, Relaxed);
        worker.inflight.fetch_add(1, Relaxed);
        worker.dispatched.fetch_add(1, Relaxed);
        worker.requests_total.fetch_add(1, Relaxed);
        InflightGuard {
            worker,
            tokens: uncached_tokens,
        }
    }

    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.worker.inflight.fetch_sub(1, Relaxed);
        self.worker.inflight_tokens.fetch_sub(self.tokens, Relaxed);
    }
}

#[cfg(test)]
mod tests;
