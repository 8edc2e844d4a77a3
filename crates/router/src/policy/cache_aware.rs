//! SGLang's `cache_aware` policy, written from its documented behaviour (sglang-router 0.3.2,
//! `router_args.py` and `Router`'s docstring; the SGLang router docs):
//!
//! 1. **Balance first.** Over the available workers, if `max − min > balance_abs_threshold` and
//!    `max > balance_rel_threshold × min`, the fleet is imbalanced: pick the least-loaded worker.
//! 2. **Else affinity.** Take the worker with the longest cached prefix of this request; if its match
//!    ratio (cached / prompt tokens) exceeds `cache_threshold`, pick it.
//! 3. **Else room.** Pick the worker whose cache the router believes smallest (SGLang: the
//!    smallest approximate tree, "the worker with the most free cache").
//!
//! The load is whatever [`View::load`] says: the router's in-flight count (SGLang's choice, with
//! `--load-signal inflight`) or the engine's published load (`engine`: running + waiting, the
//! seed's #28600 consumer; `backlog`: tokens, so the absolute threshold is then in tokens). The
//! cached prefix comes from the approximate tree (SGLang) or the KV index (#28600): the policy does
//! not know which. Ties rotate with `entropy`.

use super::{View, argmin_by};

/// `cache_aware`'s thresholds; the defaults are sglang-router 0.3.2's command-line defaults
/// (`RouterArgs`: `cache_threshold = 0.3`, `balance_abs_threshold = 64`,
/// `balance_rel_threshold = 1.5`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheAware {
    /// Minimum match ratio (0–1) for affinity to win.
    pub cache_threshold: f64,
    /// Load difference (max − min) above which the fleet may be imbalanced.
    pub balance_abs_threshold: i64,
    /// Ratio max / min above which the fleet may be imbalanced.
    pub balance_rel_threshold: f64,
}

impl Default for CacheAware {
    fn default() -> Self {
        CacheAware {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
        }
    }
}

impl CacheAware {
    /// Thresholds from flags (`--cache-threshold`, `--balance-abs-threshold`,
    /// `--balance-rel-threshold`), checked: a ratio in 0–1, a non-negative difference, a finite
    /// relative threshold of at least 1.
    pub fn new(cache_threshold: f64, abs: i64, rel: f64) -> Result<Self, String> {
        if !(0.0..=1.0).contains(&cache_threshold) {
            return Err(format!("cache threshold {cache_threshold} is not in 0–1"));
        }
        if abs < 0 {
            return Err(format!("balance abs threshold {abs} is negative"));
        }
        if !(rel.is_finite() && rel >= 1.0) {
            return Err(format!(
                "balance rel threshold {rel} is not a finite number ≥ 1"
            ));
        }
        Ok(CacheAware {
            cache_threshold,
            balance_abs_threshold: abs,
            balance_rel_threshold: rel,
        })
    }

    /// Whether loads spanning `min..=max` count as imbalanced.
    pub fn imbalanced(&self, min: i64, max: i64) -> bool {
        max.saturating_sub(min) > self.balance_abs_threshold
            && max as f64 > min as f64 * self.balance_rel_threshold
    }

    /// The chosen worker, or `None` when none is available.
    pub fn pick(&self, view: &impl View, entropy: u64) -> Option<usize> {
        let (mut min, mut max) = (i64::MAX, i64::MIN);
        for i in (0..view.len()).filter(|&i| view.available(i)) {
            let l = view.load(i);
            min = min.min(l);
            max = max.max(l);
        }
        if min > max {
            return None; // nothing available
        }
        if self.imbalanced(min, max) {
            return argmin_by(view, entropy, |i| view.load(i));
        }
        let prompt = view.prompt_tokens();
        if prompt > 0 {
            // The longest match: the smallest negated match.
            let best = argmin_by(view, entropy, |i| std::cmp::Reverse(view.cached_tokens(i)))?;
            let ratio = view.cached_tokens(best).min(prompt) as f64 / prompt as f64;
            if ratio > self.cache_threshold {
                return Some(best);
            }
        }
        argmin_by(view, entropy, |i| view.cache_size(i))
    }
}
