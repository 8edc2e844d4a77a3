//! A worker's circuit breaker: after `threshold` failed attempts in a row it stops traffic to the
//! worker for a cooldown, then lets it through again (one success resets the count).
//!
//! Kept apart from the load belief because it answers a different question (may this worker be
//! tried at all?) and changes on the request path's outcomes, not on engine reports. Two atomics:
//! a pick reads one of them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Debug, Default)]
pub struct Breaker {
    consecutive_failures: AtomicU64,
    /// ms since the fleet's epoch when the worker reopens for traffic; 0: never opened.
    open_until_ms: AtomicU64,
}

impl Breaker {
    /// A failed attempt at `now`: opens the breaker after `threshold` in a row, for `cooldown_ms`.
    pub fn failed(&self, threshold: u64, cooldown_ms: u64, now: u64) {
        let in_a_row = self
            .consecutive_failures
            .fetch_add(1, Relaxed)
            .saturating_add(1);
        if in_a_row >= threshold {
            self.open_until_ms
                .store(now.saturating_add(cooldown_ms), Relaxed);
        }
    }

    /// A successful attempt: the run of failures is over.
    pub fn succeeded(&self) {
        self.consecutive_failures.store(0, Relaxed);
    }

    /// Whether traffic is stopped at `now`.
    #[inline]
    pub fn open_at(&self, now: u64) -> bool {
        self.open_until_ms.load(Relaxed) > now
    }

    pub fn consecutive_failures(&self) -> u64 {
        self.consecutive_failures.load(Relaxed)
    }
}
