//! Host-tier pricing: `min_ttft` ranks a host-tier hit between a device hit and a miss (aware),
//! or with the device hit (blind); `cache_aware` counts it as a hit either way.

use super::*;

/// Three idle workers holding the same 8,000-token prefix of a 10,000-token prompt: on the
/// device, on the host only, not at all.
struct Tiers {
    /// Tokens of the hit on the host only, per worker.
    host: [u64; 3],
    cached: [u64; 3],
    /// The workers' advertised load time per token (`None`: the policy's default).
    load_s: Option<f64>,
    /// Seconds of prefill queued on each worker.
    queued: [f64; 3],
    /// How many of the three workers are candidates.
    len: usize,
}

const PROMPT: u64 = 10_000;
const S_PER_TOKEN: f64 = 1e-4;

impl View for Tiers {
    fn len(&self) -> usize {
        self.len
    }
    fn load(&self, _: usize) -> i64 {
        0
    }
    fn available(&self, _: usize) -> bool {
        true
    }
    fn prompt_tokens(&self) -> u64 {
        PROMPT
    }
    fn cached_tokens(&self, i: usize) -> u64 {
        self.cached[i]
    }
    fn host_cached_tokens(&self, i: usize) -> u64 {
        self.host[i]
    }
    fn host_load_s_per_token(&self, _: usize) -> Option<f64> {
        self.load_s
    }
    fn queued_prefill_s(&self, i: usize) -> Option<f64> {
        Some(self.queued[i])
    }
    fn engine_requests(&self, _: usize) -> Option<i64> {
        Some(0)
    }
    fn prefill_s_per_token(&self, _: usize) -> f64 {
        S_PER_TOKEN
    }
}

const FLEET: Tiers = Tiers {
    host: [0, 8_000, 0],
    cached: [8_000, 8_000, 0],
    load_s: None,
    queued: [0.0; 3],
    len: 3,
};

#[test]
fn a_host_tier_hit_is_priced_at_its_load_back_time() {
    let aware = MinTtft::default();
    let t: Vec<f64> = (0..3).map(|i| aware.predicted_ttft_s(&FLEET, i)).collect();
    let recompute = 2_000.0 * S_PER_TOKEN;
    let load = 8_000.0 / DEFAULT_HOST_LOAD_TOKENS_PER_S;
    assert!((t[0] - recompute).abs() < 1e-9, "device hit: the rest only");
    assert!(
        (t[1] - (recompute + load)).abs() < 1e-9,
        "host hit: plus its load"
    );
    assert!(
        (t[2] - PROMPT as f64 * S_PER_TOKEN).abs() < 1e-9,
        "miss: all"
    );
    assert!(
        t[0] < t[1] && t[1] < t[2],
        "between a device hit and a miss: {t:?}"
    );
    // The worker's advertised bandwidth wins over the default; a load slower than recomputing is
    // priced as recomputing (never worse than a miss).
    let slow = Tiers {
        load_s: Some(10.0 * S_PER_TOKEN),
        ..FLEET
    };
    assert!((aware.predicted_ttft_s(&slow, 1) - t[2]).abs() < 1e-9);
    let fast = Tiers {
        load_s: Some(1e-6),
        ..FLEET
    };
    assert!((aware.predicted_ttft_s(&fast, 1) - (recompute + 8_000.0 * 1e-6)).abs() < 1e-9);
}

#[test]
fn blind_pricing_takes_a_host_hit_for_a_device_hit_and_other_policies_count_it() {
    let blind = MinTtft {
        tier_pricing: TierPricing::Blind,
        ..MinTtft::default()
    };
    assert_eq!(
        blind.predicted_ttft_s(&FLEET, 1),
        blind.predicted_ttft_s(&FLEET, 0)
    );
    // The device worker is busier by less than the host hit's load time: aware keeps the
    // request on the device hit, blind sees two equal hits and takes the idle host one.
    let v = Tiers {
        queued: [0.04, 0.0, 0.0],
        len: 2,
        ..FLEET
    };
    for e in 0..64 {
        assert_eq!(MinTtft::default().pick(&v, e), Some(0));
        assert_eq!(blind.pick(&v, e), Some(1));
    }
    // cache_aware reads `cached_tokens`: a host-tier hit matches like a device one.
    let ca = Policy::CacheAware(CacheAware::default());
    let only_host = Tiers {
        host: [0, 8_000, 0],
        cached: [0, 8_000, 0],
        ..FLEET
    };
    assert!((0..64).all(|e| ca.pick(&only_host, e) == Some(1)));
    assert_eq!(TierPricing::parse("blind"), Ok(TierPricing::Blind));
    assert!(
        TierPricing::parse("x")
            .unwrap_err()
            .contains("aware, blind or miss")
    );
    // `miss` prices the host-tier part as recomputed: the host worker costs what a miss does.
    let miss = MinTtft {
        tier_pricing: TierPricing::Miss,
        ..MinTtft::default()
    };
    assert!((miss.predicted_ttft_s(&FLEET, 1) - miss.predicted_ttft_s(&FLEET, 2)).abs() < 1e-9);
}
