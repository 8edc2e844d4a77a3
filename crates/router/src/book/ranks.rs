//! A worker's DP ranks: one slot per rank that exists, never one per rank number a peer names.
//!
//! Why: a polled worker names its ranks in its own pages (`dp_rank`, vLLM's `engine="N"`). Sizing
//! a dense table by the largest name let one page with `dp_rank` 2^40 ask for terabytes, and left
//! a vLLM DP rank 3 running alone with ranks 0–2 that never report (so the worker was priced on
//! in-flight for ever). So:
//! * a **pushed** worker's table is dense and fixed: rank `r` is slot `r`, one per advertised
//!   load socket, and the rank comes from the socket, not from the peer;
//! * a **polled** worker's table is sparse: a slot is claimed the first time a rank reports, up to
//!   the worker's bound (its advertised `dp_size`, else `--max-ranks`); a rank number at or beyond
//!   the bound is refused (the caller counts [`crate::budget::Refusal::RankOutOfRange`]).
//!
//! The book's E(w) is over the slots that exist. Readers (the pick, `/workers`, `/metrics`) never
//! lock: the slot array is allocated once at the bound (a pointer each, the states themselves on
//! first report) and a slot count published with release ordering says how many are set. Claims,
//! rare (once per rank in a worker's life), take a mutex so two writers cannot claim one slot.

use super::prefill_rate::PrefillRate;
use super::utilisation::{RHO_NONE_BITS, Utilisation};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// [`RankState::pool_free`] when the pool's size is not reported.
pub const POOL_UNKNOWN: u64 = u64::MAX;

/// One DP rank's latest report.
///
/// Laid out for the pick, which reads every rank of the fleet per request: what pricing a rank as
/// a candidate reads sits in the first two cache lines (`repr(C)`, aligned to a line), the
/// counters only `/workers` and `/metrics` read come after.
#[derive(Debug)]
#[repr(C, align(64))]
pub struct RankState {
    /// The rank's number, as the engine names it.
    pub rank: usize,
    /// ms since the book's epoch when the last message arrived; 0 = never.
    pub(super) received_ms: AtomicU64,
    pub(super) requests: AtomicI64,
    /// Prompt tokens waiting for prefill (`num_waiting_uncached_tokens`).
    pub backlog: AtomicI64,
    /// f64 bits of the KV token usage (0–1).
    pub token_usage_bits: AtomicU64,
    /// f64 bits of the measured µs per prefill token (the prior until measured): [`Self::prefill`]'s
    /// figure, copied here by each message so the pick reads it beside the rest.
    pub(super) us_per_token_bits: AtomicU64,
    pub(super) tokens: AtomicI64,
    /// f64 bits of the rank's utilisation ρ ([`u64::MAX`]: unknown): the meter's
    /// figure, copied here by each message so the pick reads it beside the rest.
    pub(super) rho_bits: AtomicU64,
    /// KV pool tokens not in use (`max_total_num_tokens − num_used_tokens`; cached pages nobody
    /// uses count as free), [`POOL_UNKNOWN`] when the rank reports no pool size.
    pub(super) pool_free: AtomicU64,
    /// What this router routed to this rank by name (rank-routed candidates), as the worker's
    /// counters do for the whole worker: dispatches, their uncached tokens, the open requests and
    /// their tokens, and the rank's own counters when its last message arrived.
    pub(super) routed: RankRouted,
    /// The worker's dispatch counter when that message arrived.
    pub(super) dispatch_mark: AtomicU64,
    /// The worker's dispatched-token counter when that message arrived.
    pub(super) tokens_mark: AtomicU64,
    pub last_seq: AtomicI64,
    pub messages: AtomicU64,
    pub gaps: AtomicU64,
    pub restarts: AtomicU64,
    pub running: AtomicI64,
    pub waiting: AtomicI64,
    /// Requests waiting for their KV (a PD engine's transfer queues, [`crate::pd`]).
    pub pd_pending: AtomicI64,
    /// The rank's measured prefill speed.
    pub prefill: PrefillRate,
    /// The rank's measured utilisation ([`super::utilisation`]).
    pub utilisation: Utilisation,
}

/// This router's accounting of the requests it routed to one rank by name.
#[derive(Debug, Default)]
#[repr(C)]
pub struct RankRouted {
    pub(super) dispatched: AtomicU64,
    /// `dispatched` and `dispatched_tokens` when the rank's last message arrived.
    pub(super) dispatch_mark: AtomicU64,
    pub(super) dispatched_tokens: AtomicU64,
    pub(super) tokens_mark: AtomicU64,
    pub(super) inflight: AtomicI64,
    pub(super) inflight_tokens: AtomicU64,
    /// As [`super::Worker`]'s: streaming requests routed here with no answer bytes yet.
    pub(super) unstarted_tokens: AtomicU64,
    /// Requests routed here, their prompt tokens and how many of those the router believed cached
    /// here (shown per rank in `/workers` and `/metrics`).
    pub requests_total: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
}

impl RankRouted {
    /// This router's open requests routed to this rank.
    #[inline]
    pub fn inflight(&self) -> i64 {
        self.inflight.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl RankState {
    /// What this router routed to this rank by name.
    #[inline]
    pub fn routed(&self) -> &RankRouted {
        &self.routed
    }

    /// The rank's utilisation ρ as last measured, whatever its age (`None`: not measured).
    #[inline]
    pub fn rho(&self) -> Option<f64> {
        super::utilisation::rho_of_bits(self.rho_bits.load(Ordering::Relaxed))
    }

    /// KV pool tokens not in use as last reported, whatever its age (`None`: no pool size).
    #[inline]
    pub fn pool_free(&self) -> Option<u64> {
        let v = self.pool_free.load(Ordering::Relaxed);
        (v != POOL_UNKNOWN).then_some(v)
    }

    /// ms since the book's epoch of the last message (0: never).
    #[inline]
    pub fn received_ms(&self) -> u64 {
        self.received_ms.load(Ordering::Acquire)
    }

    fn new(rank: usize) -> Self {
        RankState {
            rank,
            received_ms: AtomicU64::new(0),
            requests: AtomicI64::new(0),
            tokens: AtomicI64::new(0),
            dispatch_mark: AtomicU64::new(0),
            last_seq: AtomicI64::new(-1),
            messages: AtomicU64::new(0),
            gaps: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            running: AtomicI64::new(0),
            waiting: AtomicI64::new(0),
            pd_pending: AtomicI64::new(0),
            backlog: AtomicI64::new(0),
            token_usage_bits: AtomicU64::new(0),
            us_per_token_bits: AtomicU64::new(super::prefill_rate::PRIOR_US_PER_TOKEN.to_bits()),
            prefill: PrefillRate::default(),
            rho_bits: AtomicU64::new(RHO_NONE_BITS),
            pool_free: AtomicU64::new(POOL_UNKNOWN),
            utilisation: Utilisation::default(),
            tokens_mark: AtomicU64::new(0),
            routed: RankRouted::default(),
        }
    }
}

/// Why a rank has no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankOutOfRange {
    pub rank: usize,
    /// Rank numbers must be below this.
    pub bound: usize,
}

/// A worker's rank slots (see the module docs).
#[derive(Debug)]
pub struct RankTable {
    slots: Box<[OnceLock<Box<RankState>>]>,
    /// Slots set, a prefix of `slots`.
    len: AtomicUsize,
    /// Whether ranks are claimed on first report (polled) or fixed at creation (pushed).
    sparse: bool,
    claim: Mutex<()>,
    /// Bumped on every claim: the fleet rebuilds its candidate list when a polled worker's ranks
    /// change ([`crate::fleet::Fleet::roster`]).
    claims: OnceLock<Arc<AtomicU64>>,
}

impl RankTable {
    /// Ranks `0..n`, fixed.
    pub fn dense(n: usize) -> Self {
        let slots: Box<[_]> = (0..n)
            .map(|r| OnceLock::from(Box::new(RankState::new(r))))
            .collect();
        RankTable {
            slots,
            len: AtomicUsize::new(n),
            sparse: false,
            claim: Mutex::new(()),
            claims: OnceLock::new(),
        }
    }

    /// No rank yet; ranks numbered below `bound` get a slot when they first report.
    pub fn sparse(bound: usize) -> Self {
        RankTable {
            slots: (0..bound).map(|_| OnceLock::new()).collect(),
            len: AtomicUsize::new(0),
            sparse: true,
            claim: Mutex::new(()),
            claims: OnceLock::new(),
        }
    }

    /// Counts every later claim on `epoch` (set once, by the fleet that holds the worker).
    pub fn notify_claims(&self, epoch: Arc<AtomicU64>) {
        let _ = self.claims.set(epoch);
    }

    /// Rank numbers must be below this.
    pub fn bound(&self) -> usize {
        self.slots.len()
    }

    /// Ranks with a slot.
    #[inline]
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ranks with a slot, in the order they got it (rank order for a pushed worker).
    pub fn iter(&self) -> impl Iterator<Item = &RankState> + '_ {
        self.slots[..self.len()]
            .iter()
            .filter_map(|s| s.get().map(|b| &**b))
    }

    /// Rank number `rank`'s slot, if it has one.
    #[inline]
    pub fn get(&self, rank: usize) -> Option<&RankState> {
        let len = self.len();
        // Pushed workers, and polled ones whose ranks came in order: rank r sits in slot r.
        if let Some(s) = self.slots[..len].get(rank).and_then(OnceLock::get)
            && s.rank == rank
        {
            return Some(s);
        }
        if !self.sparse {
            return None;
        }
        self.iter().find(|s| s.rank == rank)
    }

    /// Rank number `rank`'s slot, claimed now if the table is sparse and `rank` is in bound.
    pub fn get_or_claim(&self, rank: usize) -> Result<&RankState, RankOutOfRange> {
        if let Some(s) = self.get(rank) {
            return Ok(s);
        }
        let out = RankOutOfRange {
            rank,
            bound: self.bound(),
        };
        if !self.sparse || rank >= self.bound() {
            return Err(out);
        }
        let _claiming = self.claim.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = self.get(rank) {
            return Ok(s); // claimed by another writer meanwhile
        }
        let i = self.len.load(Ordering::Relaxed);
        // Distinct ranks below the bound never outnumber the slots; refuse rather than trust it.
        let slot = self.slots.get(i).ok_or(out)?;
        let _ = slot.set(Box::new(RankState::new(rank)));
        self.len.store(i + 1, Ordering::Release);
        if let Some(epoch) = self.claims.get() {
            epoch.fetch_add(1, Ordering::Release);
        }
        slot.get().map(|b| &**b).ok_or(out)
    }
}
