//! Policy unit tests: availability, load, ties; cache_aware's three branches; min_ttft's pricing.

use super::*;

struct V(Vec<(i64, bool)>);
impl View for V {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn load(&self, i: usize) -> i64 {
        self.0[i].0
    }
    fn available(&self, i: usize) -> bool {
        self.0[i].1
    }
}

#[test]
fn each_policy_respects_availability_and_load() {
    let v = V(vec![(5, true), (1, true), (9, false), (3, true)]);
    assert_eq!(Policy::LeastLoad.pick(&v, 7), Some(1));
    for e in 0..1000 {
        for p in [
            Policy::RoundRobin,
            Policy::Random,
            Policy::PowerOfTwo,
            Policy::LeastLoad,
        ] {
            assert_ne!(p.pick(&v, e), Some(2), "{p:?} picked an unavailable worker");
        }
    }
    assert_eq!(Policy::PowerOfTwo.pick(&V(vec![(0, false); 4]), 1), None);
    assert_eq!(Policy::RoundRobin.pick(&V(vec![]), 1), None);
}

#[test]
fn power_of_two_prefers_the_lighter_of_two_and_spreads_ties() {
    let v = V(vec![(100, true), (0, true)]);
    assert!((0..100).all(|e| Policy::PowerOfTwo.pick(&v, e) == Some(1)));
    let even = V(vec![(0, true); 8]);
    let mut hits = [0; 8];
    for e in 0..8000 {
        hits[Policy::PowerOfTwo.pick(&even, e).unwrap()] += 1;
    }
    assert!(
        hits.iter().all(|&h| h > 700),
        "ties spread evenly: {hits:?}"
    );
    let rr: Vec<_> = (0..4)
        .map(|e| Policy::RoundRobin.pick(&even, e).unwrap())
        .collect();
    assert_eq!(rr, [0, 1, 2, 3]);
}

/// One worker as the cache-aware policies see it.
#[derive(Clone, Copy)]
struct W {
    load: i64,
    cached: u64,
    size: u64,
    queued_s: Option<f64>,
    requests: i64,
    s_per_token: f64,
    kv: f64,
    inflight: i64,
}

const IDLE: W = W {
    load: 0,
    cached: 0,
    size: 0,
    queued_s: Some(0.0),
    requests: 0,
    s_per_token: 1e-4,
    kv: 0.0,
    inflight: 0,
};

struct C {
    prompt: u64,
    w: Vec<W>,
}

impl View for C {
    fn len(&self) -> usize {
        self.w.len()
    }
    fn load(&self, i: usize) -> i64 {
        self.w[i].load
    }
    fn available(&self, _: usize) -> bool {
        true
    }
    fn prompt_tokens(&self) -> u64 {
        self.prompt
    }
    fn cached_tokens(&self, i: usize) -> u64 {
        self.w[i].cached
    }
    fn cache_size(&self, i: usize) -> u64 {
        self.w[i].size
    }
    fn queued_prefill_s(&self, i: usize) -> Option<f64> {
        self.w[i].queued_s
    }
    fn engine_requests(&self, i: usize) -> Option<i64> {
        self.w[i].queued_s.map(|_| self.w[i].requests)
    }
    fn prefill_s_per_token(&self, i: usize) -> f64 {
        self.w[i].s_per_token
    }
    fn kv_usage(&self, i: usize) -> f64 {
        self.w[i].kv
    }
    fn inflight(&self, i: usize) -> i64 {
        self.w[i].inflight
    }
}

fn all_picks(p: Policy, v: &C) -> std::collections::BTreeSet<usize> {
    (0..200).filter_map(|e| p.pick(v, e)).collect()
}

#[test]
fn cache_aware_balances_then_follows_the_match_then_the_smallest_tree() {
    let p = Policy::CacheAware(CacheAware::default());
    let w = |load, cached, size| W {
        load,
        cached,
        size,
        ..IDLE
    };
    // Balanced; worker 1 holds 600 of 1000 tokens (ratio 0.6 > 0.3): affinity.
    let v = C {
        prompt: 1000,
        w: vec![w(10, 100, 50), w(40, 600, 900), w(10, 0, 10)],
    };
    assert_eq!(all_picks(p, &v), [1].into());
    // Imbalanced (100 − 10 > 64 and 100 > 1.5 × 10): the least loaded, whatever is cached.
    let v = C {
        prompt: 1000,
        w: vec![w(30, 100, 50), w(100, 600, 900), w(10, 0, 10)],
    };
    assert_eq!(all_picks(p, &v), [2].into());
    // A big gap that is not relatively big (1000 vs 950) is not imbalanced.
    assert!(!CacheAware::default().imbalanced(950, 1020));
    // Balanced but the best ratio is 0.2 ≤ 0.3: the smallest tree.
    let v = C {
        prompt: 1000,
        w: vec![w(10, 200, 50), w(10, 100, 900), w(10, 0, 10)],
    };
    assert_eq!(all_picks(p, &v), [2].into());
    // Unknown prompt, equal trees: spread.
    let v = C {
        prompt: 0,
        w: vec![w(0, 0, 0); 4],
    };
    assert_eq!(all_picks(p, &v).len(), 4);
    assert_eq!(Policy::parse("cache_aware").unwrap(), p);
    assert_eq!(CacheAware::new(0.3, 64, 1.5), Ok(CacheAware::default()));
    for (t, a, r) in [
        (1.5, 64, 1.5),
        (0.3, -1, 1.5),
        (0.3, 64, 0.5),
        (0.3, 64, f64::NAN),
    ] {
        assert!(CacheAware::new(t, a, r).is_err(), "{t} {a} {r}");
    }
}

#[test]
fn min_ttft_trades_a_cache_hit_against_the_queue_in_seconds() {
    let p = Policy::MinTtft(MinTtft::default());
    let cached = |queued_s| W {
        cached: 900,
        queued_s: Some(queued_s),
        ..IDLE
    };
    // Worker 0 holds 900 of 1000 tokens: 0.01 s of prefill there vs 0.1 s elsewhere.
    let v = C {
        prompt: 1000,
        w: vec![cached(0.05), IDLE, IDLE],
    };
    assert_eq!(
        all_picks(p, &v),
        [0].into(),
        "the hit is worth 0.05 s of queue"
    );
    let v = C {
        prompt: 1000,
        w: vec![cached(0.5), IDLE, IDLE],
    };
    assert_eq!(
        all_picks(p, &v),
        [1, 2].into(),
        "not 0.5 s: idle ties spread"
    );
    // A slow engine is priced as slow: the same queue in tokens, 3× the seconds per token.
    let slow = W {
        s_per_token: 3e-4,
        ..IDLE
    };
    let v = C {
        prompt: 1000,
        w: vec![slow, IDLE],
    };
    assert_eq!(all_picks(p, &v), [1].into());
    // Stale engine load: priced on in-flight requests.
    let stale = |inflight| W {
        queued_s: None,
        inflight,
        ..IDLE
    };
    let v = C {
        prompt: 100,
        w: vec![stale(3), stale(1), stale(2)],
    };
    assert_eq!(all_picks(p, &v), [1].into());
    // A nearly full KV pool is penalised.
    let full = W { kv: 0.99, ..IDLE };
    let v = C {
        prompt: 100,
        w: vec![
            full,
            W {
                queued_s: Some(0.1),
                ..IDLE
            },
        ],
    };
    assert_eq!(all_picks(p, &v), [1].into());
    assert_eq!(Policy::parse("min_ttft").unwrap().as_str(), "min_ttft");
}
