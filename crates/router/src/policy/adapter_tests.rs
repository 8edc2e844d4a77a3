//! Adapter pricing: `min_ttft` prefers the worker holding the request's adapter at equal load,
//! and stops when that worker's queue costs more than a load elsewhere; adapter-blind `min_ttft`,
//! `cache_aware` and the load policies ignore the term.

use super::*;
use crate::adapters::AdapterCost;

/// Idle-but-for-a-queue workers; the request's adapter costs `adapter[i]` seconds on worker i.
#[derive(Clone, Copy)]
struct Adapters {
    queued: [f64; 3],
    /// The adapter's load seconds on each worker (0: resident).
    adapter: [f64; 3],
    /// The wait for a slot on each worker.
    wait: [f64; 3],
    requests: [i64; 3],
}

const IDLE: Adapters = Adapters {
    queued: [0.0; 3],
    adapter: [0.0; 3],
    wait: [0.0; 3],
    requests: [0; 3],
};

impl View for Adapters {
    fn len(&self) -> usize {
        3
    }
    fn load(&self, i: usize) -> i64 {
        (self.queued[i] * 1e4) as i64
    }
    fn available(&self, _: usize) -> bool {
        true
    }
    fn prompt_tokens(&self) -> u64 {
        500
    }
    fn queued_prefill_s(&self, i: usize) -> Option<f64> {
        Some(self.queued[i])
    }
    fn engine_requests(&self, i: usize) -> Option<i64> {
        Some(self.requests[i])
    }
    fn prefill_s_per_token(&self, _: usize) -> f64 {
        1e-4
    }
    fn adapter_cost(&self, i: usize) -> AdapterCost {
        match self.adapter[i] {
            0.0 => AdapterCost::RESIDENT,
            load_s => AdapterCost {
                resident: false,
                evicts: false,
                waits: false,
                load_s,
                wait_s: self.wait[i],
            },
        }
    }
}

fn picks(p: Policy, v: &Adapters) -> std::collections::BTreeSet<usize> {
    (0..200).filter_map(|e| p.pick(v, e)).collect()
}

const LOAD: f64 = 0.05;

#[test]
fn min_ttft_goes_where_the_adapter_is_until_the_queue_costs_more_than_a_load() {
    let aware = Policy::MinTtft(MinTtft::default());
    // Equal load: worker 1 holds the adapter.
    let v = Adapters {
        adapter: [LOAD, 0.0, LOAD],
        ..IDLE
    };
    assert_eq!(picks(aware, &v), [1].into());
    // Worker 1 is busier by less than a load: still there.
    let v = Adapters {
        queued: [0.0, 0.03, 0.0],
        ..v
    };
    assert_eq!(picks(aware, &v), [1].into());
    // Busier by more than a load: the idle workers (which tie) win.
    let v = Adapters {
        queued: [0.0, 0.08, 0.0],
        ..v
    };
    assert_eq!(picks(aware, &v), [0, 2].into());
    // An eviction's expected reload makes a load dearer: a load that evicts a popular adapter
    // (share 0.6: 1.6 loads) loses to one into a free slot at a slightly longer queue.
    let v = Adapters {
        queued: [0.0, 0.0, 0.02],
        adapter: [LOAD * 1.6, LOAD * 1.6, LOAD],
        ..IDLE
    };
    assert_eq!(picks(aware, &v), [2].into());
    // A load pauses the engine's batch: with 5 requests on the only worker lacking the adapter,
    // it costs 6 loads there, more than a 0.2 s queue where the adapter is.
    let v = Adapters {
        queued: [0.2, 0.0, 0.0],
        adapter: [0.0, LOAD, LOAD],
        requests: [0, 5, 5],
        ..IDLE
    };
    assert_eq!(picks(aware, &v), [0].into());
    // Every slot busy: the wait for one to drain counts in full.
    let v = Adapters {
        queued: [0.0, 0.3, 0.0],
        adapter: [LOAD, 0.0, LOAD],
        wait: [1.0, 0.0, 0.4],
        ..IDLE
    };
    assert_eq!(picks(aware, &v), [1].into());
}

#[test]
fn a_load_is_priced_for_the_requests_present_and_as_many_arriving_before_they_leave() {
    let aware = Policy::MinTtft(MinTtft::default());
    // Workers 1 and 2 lack the adapter and run 3 requests each: a load there delays this request,
    // those 3, and 3 more arriving meanwhile: 7 loads (0.35 s), plus 3 requests' queue weight.
    let lacking = |queued: f64| Adapters {
        queued: [queued, 0.0, 0.0],
        adapter: [0.0, LOAD, LOAD],
        requests: [0, 3, 3],
        ..IDLE
    };
    let weight = 3.0 * crate::book::REQUEST_TOKENS_WEIGHT as f64 * 1e-4;
    let load = LOAD * (1.0 + min_ttft::PAUSED_LIFETIMES * 3.0) + weight;
    // A queue where the adapter is between one lifetime's price (4 loads) and two's stays there.
    let between = LOAD * 4.0 + weight + 0.05;
    assert!(between < load, "{between} < {load}");
    assert_eq!(picks(aware, &lacking(between)), [0].into());
    // A queue longer than the load's full price: the load is cheaper.
    assert_eq!(picks(aware, &lacking(load + 0.05)), [1, 2].into());
}

#[test]
fn blind_min_ttft_cache_aware_and_load_policies_ignore_adapters() {
    let blind = Policy::MinTtft(MinTtft {
        adapter_pricing: AdapterPricing::Blind,
        ..MinTtft::default()
    });
    let v = Adapters {
        queued: [0.0, 0.01, 0.0],
        adapter: [LOAD, 0.0, LOAD],
        ..IDLE
    };
    assert_eq!(
        picks(blind, &v),
        [0, 2].into(),
        "the shorter queues, adapter or not"
    );
    let same = Adapters {
        adapter: [LOAD, 0.0, LOAD],
        ..IDLE
    };
    let free = Adapters {
        adapter: [0.0; 3],
        ..same
    };
    for p in [
        Policy::CacheAware(CacheAware::default()),
        Policy::LeastLoad,
        Policy::PowerOfTwo,
        Policy::RoundRobin,
    ] {
        for e in 0..64 {
            assert_eq!(p.pick(&same, e), p.pick(&free, e), "{p:?}");
        }
    }
    assert_eq!(AdapterPricing::parse("blind"), Ok(AdapterPricing::Blind));
    assert!(
        AdapterPricing::parse("x")
            .unwrap_err()
            .contains("aware or blind")
    );
    assert_eq!(MinTtft::default().adapter_pricing.as_str(), "aware");
}
