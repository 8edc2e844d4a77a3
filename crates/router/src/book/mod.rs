//! The `LoadBook`: the router's one owner of belief about load.
//!
//! For worker w with ranks R(w) (its load sockets when pushed; the ranks its pages name, within a
//! bound, when polled: [`ranks`]) it merges
//! * E(w) = Σ ranks (running + waiting) from engine snapshots — valid only if **every** rank's last
//!   message is younger than the freshness bound;
//! * D(w) = requests this router dispatched to w after the oldest rank snapshot it combines with;
//! * F(w) = this router's open in-flight guards on w,
//!
//! into `Load(w) = max(F, E + D)` when E is valid, else `F` (source: fallback). Every field is an
//! atomic, so the request path reads loads without locks or allocation, and a subscriber thread
//! updates them without blocking it. Engine-reported numbers are clamped to
//! [`MAX_REPORTED`] so one lying worker cannot attract or repel traffic without bound; every
//! operation on a peer's number is checked or saturating (a debug build must not panic on any
//! report), and what is clamped or dropped is counted as a refusal ([`crate::budget`]).
//!
//! The merge itself is in [`load`] (for a worker and for one DP rank), the dispatch and open-request
//! counting in [`guard`]. Whether a worker may be tried at all is not load: its [`breaker`] and
//! [`health`] live in their own types, held by the [`Worker`].
//!
//! For pricing in time ([`Worker::pricing_at`]) the book also keeps each rank's measured prefill
//! speed ([`prefill_rate`]), its utilisation ρ ([`utilisation`]), its KV usage, and the prompt tokens this router dispatched since the
//! snapshot (counted per dispatch by [`InflightGuard::with_tokens`], [`DISPATCH_TOKENS_GUESS`] per
//! dispatch that does not say).

mod apply;
mod breaker;
mod guard;
mod health;
mod load;
pub mod prefill_rate;
mod pricing;
mod seq;
pub use seq::SeqEvent;
pub mod ranks;
pub mod source;
pub mod utilisation;

pub use breaker::Breaker;
pub use guard::InflightGuard;
pub use health::Health;
pub use pricing::Pricing;
pub use ranks::{RankOutOfRange, RankRouted, RankState, RankTable};
pub use source::{LoadSourceKind, LoadSourceState};

use loadlink_wire::{FrameError, LoadSnapshot};
use prefill_rate::PRIOR_US_PER_TOKEN;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
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

/// Why a worker is on the fallback signal no matter what (shown in `/workers` and metrics).
pub type FallbackReason = Option<String>;

/// One upstream worker.
#[derive(Debug)]
pub struct Worker {
    pub url: String,
    /// A hash of `url`, the same in every router replica ([`stable_key`]): where replicas must
    /// agree on a worker without talking (`min_ttft`'s home for a prefix nobody holds alone).
    pub url_key: u64,
    /// Its DP ranks: dense for a pushed worker, claimed on first report for a polled one
    /// ([`ranks`]).
    pub ranks: RankTable,
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
    /// Uncached tokens of this router's open streaming requests that have had no answer bytes
    /// yet: queued (or on their way to the queue) whatever a snapshot says ([`guard`]).
    unstarted_tokens: AtomicU64,
    pub requests_total: AtomicU64,
    /// Prompt tokens of the requests this router sent here after a cache lookup, and how many of
    /// them it believed cached here (their ratio is the hit rate the router routed for).
    pub routed_prompt_tokens: AtomicU64,
    pub routed_cached_tokens: AtomicU64,
    /// Failed attempts (connection, status, body), whether or not they opened the breaker.
    pub failures_total: AtomicU64,
    /// What the health checks last said ([`health`]).
    pub health: Health,
    /// Stops traffic after consecutive failures ([`breaker`]).
    pub breaker: Breaker,
    /// What this worker sent that was refused, by reason ([`crate::budget`]).
    pub refusals: crate::budget::PeerRefusals,
    /// Frames dropped by the subscriber, indexed by [`FrameError::index`].
    pub dropped: [AtomicU64; FrameError::REASONS.len()],
    /// Tokens/s its host KV tier loads back, as advertised (0: none advertised).
    pub host_load_tokens_per_s: AtomicU64,
    /// Its role in a PD fleet and its bootstrap port ([`crate::pd`]).
    pub pd: crate::pd::WorkerPd,
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
    /// f64 bits: the mean of the ranks' utilisation ρ ([`utilisation::RHO_NONE_BITS`] until every
    /// rank has one).
    agg_rho_bits: AtomicU64,
    /// KV pool tokens free on the fullest rank ([`ranks::POOL_UNKNOWN`] unless every rank says).
    agg_pool_free: AtomicU64,
    epoch: Instant,
}

/// A key of `s` that every process computes alike ([`loadlink_wire::tokenize::fnv1a`]).
pub fn stable_key(s: &str) -> u64 {
    loadlink_wire::tokenize::fnv1a(s.as_bytes())
}

impl Worker {
    /// A worker with `dp_size` fixed ranks `0..dp_size` (one per load socket; none: priced on
    /// in-flight).
    pub fn new(
        url: String,
        dp_size: usize,
        no_load_reason: FallbackReason,
        epoch: Instant,
    ) -> Self {
        let kind = if dp_size > 0 {
            LoadSourceKind::Push
        } else {
            LoadSourceKind::Inflight
        };
        Self::with_ranks(url, RankTable::dense(dp_size), kind, no_load_reason, epoch)
    }

    /// A worker whose ranks are known only from its reports (a polled one): each rank numbered
    /// below `bound` gets a slot when it first reports; others are refused.
    pub fn sparse(url: String, bound: usize, epoch: Instant) -> Self {
        let kind = LoadSourceKind::Inflight; // until the caller names its polled source
        Self::with_ranks(url, RankTable::sparse(bound), kind, None, epoch)
    }

    fn with_ranks(
        url: String,
        ranks: RankTable,
        kind: LoadSourceKind,
        no_load_reason: FallbackReason,
        epoch: Instant,
    ) -> Self {
        Worker {
            url_key: stable_key(&url),
            url,
            ranks,
            load_source: LoadSourceState::new(kind),
            no_load_reason,
            inflight: AtomicI64::new(0),
            dispatched: AtomicU64::new(0),
            dispatched_tokens: AtomicU64::new(0),
            inflight_tokens: AtomicU64::new(0),
            unstarted_tokens: AtomicU64::new(0),
            requests_total: AtomicU64::new(0),
            routed_prompt_tokens: AtomicU64::new(0),
            routed_cached_tokens: AtomicU64::new(0),
            failures_total: AtomicU64::new(0),
            health: Health::default(),
            breaker: Breaker::default(),
            refusals: Default::default(),
            dropped: Default::default(),
            host_load_tokens_per_s: AtomicU64::new(0),
            pd: Default::default(),
            agg_requests: AtomicI64::new(0),
            agg_tokens: AtomicI64::new(0),
            agg_backlog: AtomicI64::new(0),
            agg_oldest_rx: AtomicU64::new(0),
            agg_mark: AtomicU64::new(0),
            agg_tokens_mark: AtomicU64::new(0),
            agg_us_per_token_bits: AtomicU64::new(PRIOR_US_PER_TOKEN.to_bits()),
            agg_kv_usage_bits: AtomicU64::new(0),
            agg_rho_bits: AtomicU64::new(utilisation::RHO_NONE_BITS),
            agg_pool_free: AtomicU64::new(ranks::POOL_UNKNOWN),
            epoch,
        }
    }

    /// Records the load-back rate of the worker's host KV tier, when it advertises one.
    pub fn set_host_load(&self, tokens_per_s: Option<u64>) {
        self.host_load_tokens_per_s
            .store(tokens_per_s.unwrap_or(0), Relaxed);
    }

    /// ms since this worker's epoch (shared by every worker of a fleet); read once per request
    /// and passed to [`Worker::load_at`] / [`Worker::available_at`], so a pick reads the clock once.
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Counts a request of `prompt` tokens sent here with `cached` of them believed cached.
    pub fn count_prefix(&self, prompt: u64, cached: u64) {
        self.count_prefix_on(None, prompt, cached);
    }

    /// [`Worker::count_prefix`] for a request routed to `rank` (also counted on that rank).
    pub fn count_prefix_on(&self, rank: Option<u32>, prompt: u64, cached: u64) {
        self.routed_prompt_tokens.fetch_add(prompt, Relaxed);
        self.routed_cached_tokens
            .fetch_add(cached.min(prompt), Relaxed);
        if let Some(r) = rank.and_then(|r| self.ranks.get(r as usize)) {
            r.routed.prompt_tokens.fetch_add(prompt, Relaxed);
            r.routed
                .cached_tokens
                .fetch_add(cached.min(prompt), Relaxed);
        }
    }

    /// Counts a dropped frame under its reason.
    pub fn drop_frame(&self, why: &FrameError) {
        self.dropped[why.index()].fetch_add(1, Relaxed);
    }

    pub fn inflight(&self) -> i64 {
        self.inflight.load(Relaxed)
    }

    /// Uncached tokens of this router's streaming requests here with no answer bytes yet.
    pub fn unanswered_stream_tokens(&self) -> u64 {
        self.unstarted_tokens.load(Relaxed)
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

    /// The worker's utilisation ρ (the mean of its ranks') as last measured, whatever its age;
    /// `None` until every rank has one. Policies read it through [`Worker::pricing_at`], which
    /// drops it when the load is stale.
    pub fn utilisation(&self) -> Option<f64> {
        utilisation::rho_of_bits(self.agg_rho_bits.load(Relaxed))
    }

    /// Whether the breaker lets traffic through and health checks pass.
    pub fn available(&self) -> bool {
        self.available_at(self.now_ms())
    }

    #[inline]
    pub fn available_at(&self, now: u64) -> bool {
        self.health.is_healthy() && !self.breaker.open_at(now)
    }

    /// A failed attempt: counted, and the breaker opens after `threshold` in a row, for
    /// `cooldown_ms`.
    pub fn failed(&self, threshold: u64, cooldown_ms: u64) {
        self.failures_total.fetch_add(1, Relaxed);
        self.breaker.failed(threshold, cooldown_ms, self.now_ms());
    }

    pub fn succeeded(&self) {
        self.breaker.succeeded();
    }

    pub fn breaker_open(&self) -> bool {
        self.breaker.open_at(self.now_ms())
    }

    /// What the last health check said.
    pub fn is_healthy(&self) -> bool {
        self.health.is_healthy()
    }

    /// Records a health check's outcome; true when it changed.
    pub fn set_healthy(&self, ok: bool) -> bool {
        self.health.set(ok)
    }
}

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod rank_tests;
#[cfg(test)]
mod tests;
