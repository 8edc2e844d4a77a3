//! Whether the part of a prompt nobody caches yet will be wanted again before the engine that
//! computes it has indexed it ([`TailReuse`]): the evidence behind `min_ttft`'s home
//! ([`crate::policy::fleet_cost`]).
//!
//! **Why.** A request's *tail*, the part of its prompt past the deepest prefix any worker caches, is
//! computed wherever the request goes. If another request extending the same tail arrives before
//! that worker has prefilled and indexed it (a session's next turn on an overloaded fleet, the
//! requests of a group whose prefix nobody has cached yet), the index shows no holder and the tail
//! is computed twice unless both requests go to the same place. The home (a rendezvous hash every
//! replica computes alike) is that place, and leaving it is priced as the duplicate it risks. But
//! where tails are never reused (the questions of a prefix group: each is asked once), the home
//! is only a random preference that holds requests on a busier worker, and near saturation its
//! price grows into a wall that unbalances the fleet. The index cannot tell the two apart; what
//! the requests did recently can.
//!
//! **What is counted**, per request this router places, with `P` its deepest cached prefix and `T`
//! the first page of its tail (their chained page hashes, alike in every replica):
//! * `T` itself: a tail page seen recently means this request extends (or shares) a tail another
//!   request began: it belongs where that one went;
//! * under `P`, whether the tail was new, or a first repeat: the share of `P`'s tails that get
//!   reused, learned over the prefix family (every session of an agent kind sits under its system
//!   prompt; every question of a group under the group's prefix).
//!
//! [`TailReuse::expects_reuse`] then says yes when the tail was seen, when `P`'s tails were
//! repeated recently, or when there is no evidence about `P` yet (the price before this meter);
//! no when `P`'s recent tails were all new, and when nothing is cached and the tail's first page
//! is new (a prompt that shares nothing: S1's traffic prices as before, with no home).
//!
//! **Shape.** A direct-mapped table of [`SLOTS`] atomic words: a 16-bit tag of the key, a count in
//! sixteenths (saturating at 4,095), and the time of the last update in 16 ms ticks. A lookup or a
//! record is a few loads and stores, no lock, no allocation; writers racing can lose a count (an
//! estimate either way). A key whose slot holds another replaces it only when that one's decayed
//! count is at most one; otherwise the new key is not counted and the refusal is counted
//! ([`TailReuse::refused`], `/metrics`): a full table reads as "no evidence", the price before this
//! meter. Counts decay as `e^{−Δt/τ}`, τ = [`REUSE_TAU_MS`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Slots in the table (a power of two). Each placed request touches two; the live keys are the
/// tails and prefixes of the last τ or so, a few thousand at tens of requests per second.
pub const SLOTS: usize = 1 << 14;

/// τ of the counts: how recently a tail must have been seen to count as shared. It must cover a
/// request's time to be indexed on a saturated fleet (its queue wait and prefill, tens of seconds
/// in the sweeps near capacity); a count of one falls below one half after τ·ln 2 = 42 s. The
/// sweep's figures move little between 20 s and 180 s (docs/results.md).
pub const REUSE_TAU_MS: u64 = 60_000;

/// Salts that keep a prefix's two counters apart from each other and from tail keys.
const FRESH_SALT: u64 = 0x6a09_e667_f3bc_c908;
const REPEAT_SALT: u64 = 0xbb67_ae85_84ca_a73b;

/// Milliseconds per time tick of a slot (its `u32` time wraps after 795 days).
const TICK_MS: u64 = 16;
/// Count units per request.
const ONE: f64 = 16.0;
/// The count's ceiling in units (16 bits).
const MAX_UNITS: f64 = 65_535.0;

/// The meter; one per router (replica).
#[derive(Debug)]
pub struct TailReuse {
    slots: Box<[AtomicU64]>,
    tau_ms: f64,
    refused: AtomicU64,
}

impl Default for TailReuse {
    fn default() -> Self {
        TailReuse::new(REUSE_TAU_MS)
    }
}

impl TailReuse {
    /// A meter whose counts decay with time constant `tau_ms`.
    pub fn new(tau_ms: u64) -> Self {
        TailReuse {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            tau_ms: tau_ms.max(1) as f64,
            refused: AtomicU64::new(0),
        }
    }

    /// A request with page chain `chain` (`block` tokens a page), whose deepest prefix cached on
    /// any candidate is `deepest` tokens, was placed at `now_ms`.
    pub fn record(&self, chain: &[i64], block: u64, deepest: u64, now_ms: u64) {
        let Some(tail) = tail_key(chain, block, deepest) else {
            return;
        };
        let seen = self.count(tail, now_ms);
        self.add(tail, now_ms);
        if let Some(p) = deepest_page_key(chain, block, deepest) {
            match seen {
                s if s < 0.5 => self.add(p ^ FRESH_SALT, now_ms),
                s if s < 1.5 => self.add(p ^ REPEAT_SALT, now_ms),
                _ => {}
            }
        }
    }

    /// Whether the tail of a request (as in [`TailReuse::record`]) is likely to be wanted again
    /// before it is indexed, so that computing it at its home is worth a price.
    pub fn expects_reuse(&self, chain: &[i64], block: u64, deepest: u64, now_ms: u64) -> bool {
        let Some(tail) = tail_key(chain, block, deepest) else {
            return false; // the whole prompt is cached: no tail
        };
        if self.count(tail, now_ms) >= 0.5 {
            return true;
        }
        let Some(p) = deepest_page_key(chain, block, deepest) else {
            return false; // nothing cached, and nobody began this prompt recently
        };
        self.count(p ^ FRESH_SALT, now_ms) < 1.0 || self.count(p ^ REPEAT_SALT, now_ms) >= 0.5
    }

    /// Whether another request recently began a tail under this request's deepest cached prefix
    /// (as in [`TailReuse::record`]): the prefix is a family's (a system prompt, a group's
    /// prefix), not one request's own context. No whole page cached: `true` (nothing private).
    pub fn branched(&self, chain: &[i64], block: u64, deepest: u64, now_ms: u64) -> bool {
        deepest_page_key(chain, block, deepest).is_none_or(|p| {
            self.count(p ^ FRESH_SALT, now_ms) + self.count(p ^ REPEAT_SALT, now_ms) >= 0.5
        })
    }

    /// Keys not counted because their slot held another key still in use.
    pub fn refused(&self) -> u64 {
        self.refused.load(Relaxed)
    }

    /// The decayed count of `key` at `now_ms` (0 for a key not seen, or pushed out).
    #[inline]
    fn count(&self, key: u64, now_ms: u64) -> f64 {
        let w = self.slots[slot_of(key)].load(Relaxed);
        match unpack(w) {
            Some((tag, units, at)) if tag == tag_of(key) => self.decayed(units, at, now_ms) / ONE,
            _ => 0.0,
        }
    }

    #[inline]
    fn add(&self, key: u64, now_ms: u64) {
        let slot = &self.slots[slot_of(key)];
        let tag = tag_of(key);
        let units = match unpack(slot.load(Relaxed)) {
            Some((t, units, at)) if t == tag => self.decayed(units, at, now_ms) + ONE,
            Some((_, units, at)) if self.decayed(units, at, now_ms) > ONE => {
                self.refused.fetch_add(1, Relaxed);
                return;
            }
            _ => ONE,
        };
        slot.store(pack(tag, units, now_ms / TICK_MS), Relaxed);
    }

    /// `units` recorded at tick `at`, decayed to `now_ms` (a clock that went back: not decayed).
    #[inline]
    fn decayed(&self, units: u16, at: u32, now_ms: u64) -> f64 {
        let dt = now_ms.saturating_sub(u64::from(at) * TICK_MS) as f64;
        f64::from(units) * (-dt / self.tau_ms).exp()
    }
}

/// The key of a request's prefix up to its last whole page within `cached_tokens` (its chained
/// page hash); `None` below one page or beyond the chain.
#[inline]
pub fn deepest_page_key(chain: &[i64], block: u64, cached_tokens: u64) -> Option<u64> {
    let pages = cached_tokens.checked_div(block)?;
    let last = usize::try_from(pages.checked_sub(1)?).ok()?;
    chain.get(last).map(|&h| h as u64)
}

/// The key of the page holding token `cached_tokens` (the tail's first page); `None` beyond the
/// chain.
#[inline]
pub fn tail_key(chain: &[i64], block: u64, cached_tokens: u64) -> Option<u64> {
    let page = usize::try_from(cached_tokens.checked_div(block)?).ok()?;
    chain.get(page).map(|&h| h as u64)
}

#[inline]
fn slot_of(key: u64) -> usize {
    (crate::policy::mix(key) as usize) & (SLOTS - 1)
}

/// Never 0, so an empty slot (word 0) matches no key.
#[inline]
fn tag_of(key: u64) -> u16 {
    ((key >> 48) as u16).max(1)
}

#[inline]
fn pack(tag: u16, units: f64, tick: u64) -> u64 {
    let units = units.round().clamp(0.0, MAX_UNITS) as u64;
    (u64::from(tag) << 48) | (units << 32) | (tick & 0xffff_ffff)
}

#[inline]
fn unpack(w: u64) -> Option<(u16, u16, u32)> {
    let tag = (w >> 48) as u16;
    (tag != 0).then_some((tag, (w >> 32) as u16, w as u32))
}

#[cfg(test)]
#[path = "reuse_tests.rs"]
mod tests;
