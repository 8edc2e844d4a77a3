//! An engine rank's measured prefill speed, from the cumulative counters its snapshots carry
//! (`total_prefill_uncached_tokens`, `total_prefill_busy_us`).
//!
//! Why measured: tokens are not comparable across unequal engines, seconds are. A cost policy
//! prices a request's uncached tokens and a worker's queued prefill in seconds, so it needs each
//! engine's own µs per prefill token; a slow engine must be priced as slow.
//!
//! How: the meter keeps a baseline of both counters and, once at least [`MIN_WINDOW_TOKENS`] more
//! tokens were prefilled, turns the deltas into one sample (Δbusy µs / Δtokens) and folds it into
//! an exponentially weighted mean. Robustness:
//! * **zero deltas** (an idle engine, or repeated snapshots) change nothing: the baseline waits;
//! * **restarts** (either counter goes backwards) move the baseline to the new counters and keep
//!   the estimate (same hardware, most likely); the next full window corrects it if not;
//! * **nonsense** (busy time not advancing while tokens do, or a sample outside
//!   [`MIN_US_PER_TOKEN`, `MAX_US_PER_TOKEN`]) is dropped and the baseline moves on;
//! * **before the first sample** the meter says `None` and callers use [`PRIOR_US_PER_TOKEN`];
//! * **any counter values** (they come from a peer): differences are checked, so a jump that does
//!   not fit an `i64` rebases like a restart instead of overflowing. (The book refuses negative
//!   counters before they get here.)
//!
//! One writer (the rank's subscriber thread, or the simulator) and any number of readers: every
//! field is an atomic, so the request path reads the estimate without locks or allocation.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// µs per prefill token assumed until measured: a 7B-class model on one GPU (≈ 10k tokens/s), the
/// simulated engine's default.
pub const PRIOR_US_PER_TOKEN: f64 = 100.0;
/// Tokens a window must span before it becomes a sample (a few prefill steps: one step's fixed
/// overhead would otherwise dominate a short prompt's sample).
pub const MIN_WINDOW_TOKENS: i64 = 4096;
/// Weight of a new sample in the running estimate.
const SAMPLE_WEIGHT: f64 = 0.3;
/// Samples outside this range are dropped as nonsense (1M tokens/s … 10 tokens/s).
pub const MIN_US_PER_TOKEN: f64 = 1.0;
pub const MAX_US_PER_TOKEN: f64 = 100_000.0;

/// One rank's prefill-speed meter.
#[derive(Debug, Default)]
pub struct PrefillRate {
    base_tokens: AtomicI64,
    base_us: AtomicI64,
    last_tokens: AtomicI64,
    last_us: AtomicI64,
    /// f64 bits of the estimate in µs per token; 0 = not measured yet.
    us_per_token_bits: AtomicU64,
    samples: AtomicU64,
}

impl PrefillRate {
    /// Feeds the counters of one snapshot.
    pub fn observe(&self, tokens: i64, busy_us: i64) {
        let (last_tokens, last_us) = (self.last_tokens.load(Relaxed), self.last_us.load(Relaxed));
        self.last_tokens.store(tokens, Relaxed);
        self.last_us.store(busy_us, Relaxed);
        if tokens < last_tokens || busy_us < last_us {
            self.rebase(tokens, busy_us); // the engine restarted: its counters began again
            return;
        }
        let Some(dt) = tokens.checked_sub(self.base_tokens.load(Relaxed)) else {
            return self.rebase(tokens, busy_us);
        };
        if dt < MIN_WINDOW_TOKENS {
            return;
        }
        let du = busy_us.checked_sub(self.base_us.load(Relaxed));
        self.rebase(tokens, busy_us);
        let Some(du) = du else { return };
        let sample = du as f64 / dt as f64;
        if !(MIN_US_PER_TOKEN..=MAX_US_PER_TOKEN).contains(&sample) {
            return;
        }
        let old = self.us_per_token().unwrap_or(sample);
        let new = old + SAMPLE_WEIGHT * (sample - old);
        self.us_per_token_bits.store(new.to_bits(), Relaxed);
        self.samples.fetch_add(1, Relaxed);
    }

    fn rebase(&self, tokens: i64, busy_us: i64) {
        self.base_tokens.store(tokens, Relaxed);
        self.base_us.store(busy_us, Relaxed);
    }

    /// The measured µs per prefill token, `None` before the first sample.
    pub fn us_per_token(&self) -> Option<f64> {
        let v = f64::from_bits(self.us_per_token_bits.load(Relaxed));
        (v > 0.0).then_some(v)
    }

    /// Samples taken so far.
    pub fn samples(&self) -> u64 {
        self.samples.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_after_a_window_and_ignores_zero_deltas() {
        let m = PrefillRate::default();
        m.observe(0, 0);
        m.observe(1000, 200_000);
        assert_eq!(
            m.us_per_token(),
            None,
            "a window shorter than MIN_WINDOW_TOKENS"
        );
        m.observe(8192, 8192 * 150);
        assert_eq!(m.us_per_token(), Some(150.0));
        for _ in 0..5 {
            m.observe(8192, 8192 * 150); // idle: repeated counters
        }
        assert_eq!((m.us_per_token(), m.samples()), (Some(150.0), 1));
        m.observe(8192 * 2, 8192 * 150 + 8192 * 50);
        let v = m.us_per_token().unwrap();
        assert!(
            (v - (150.0 - 0.3 * 100.0)).abs() < 1e-9,
            "EWMA towards 50: {v}"
        );
    }

    #[test]
    fn a_restart_rebases_and_nonsense_is_dropped() {
        let m = PrefillRate::default();
        m.observe(100_000, 10_000_000);
        m.observe(110_000, 11_000_000);
        assert_eq!(m.us_per_token(), Some(100.0));
        // Restart: counters start again from small values; no negative or huge sample.
        m.observe(10, 1_000);
        assert_eq!((m.us_per_token(), m.samples()), (Some(100.0), 2));
        m.observe(10 + 5000, 1_000 + 5000 * 300);
        assert!(
            m.us_per_token().unwrap() > 100.0,
            "measured after the restart"
        );
        // Busy time that does not move while tokens do: no sample.
        let n = m.samples();
        m.observe(100_000, 1_000 + 5000 * 300);
        assert_eq!(m.samples(), n);
    }
}
