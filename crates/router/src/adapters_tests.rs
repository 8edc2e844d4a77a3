//! The adapter book: the LRU bound and the horizon, reports over history, the three prices, whole
//! workers of several ranks, and the bounds on what a peer can make it hold.

use super::*;
use crate::book::Worker;
use crate::candidate::{Candidate, Candidates};
use std::sync::Arc;
use std::time::Instant;

const LOAD: f64 = 0.05;

fn book(capacity: usize) -> (AdapterBook, Vec<AdapterId>) {
    let b = AdapterBook::new(AdapterBookConfig {
        default_capacity: capacity,
        default_load_s: LOAD,
        horizon_ms: 10_000,
        request_s_prior: 4.0,
    });
    let ids = (0..8)
        .map(|i| b.intern(&format!("a{i}")).unwrap())
        .collect();
    (b, ids)
}

#[test]
fn dispatch_history_is_a_bounded_lru_that_ages() {
    let (b, a) = book(2);
    let w = "http://w0";
    assert_eq!(b.intern("a0"), Some(a[0]), "interning is stable");
    assert_eq!(b.id("nope"), None);
    b.record_dispatch(w, Some(0), a[0], 1_000);
    b.record_dispatch(w, Some(0), a[1], 1_100);
    assert_eq!(b.resident(w, 0, 1_200), ["a0", "a1"]);
    // a0 used again: a1 becomes the least recently used, and a2 evicts it.
    b.record_dispatch(w, Some(0), a[0], 1_300);
    b.record_dispatch(w, Some(0), a[2], 1_400);
    assert_eq!(b.resident(w, 0, 1_500), ["a0", "a2"]);
    let c = &b.counters;
    assert_eq!(c.dispatches.load(Relaxed), 4);
    assert_eq!(c.predicted_loads.load(Relaxed), 3);
    assert_eq!(c.predicted_evictions.load(Relaxed), 1);
    // Past the horizon after its last use, a0 is forgotten; a2 (used later) is not yet.
    assert_eq!(b.resident(w, 0, 11_350), ["a2"]);
    assert!(!b.price(w, Some(0), a[0], 11_350).resident);
    assert!(b.price(w, Some(0), a[2], 11_350).resident);
    assert!(b.resident(w, 0, 20_000).is_empty());
    // Another rank of the same worker holds nothing of this.
    assert!(!b.price(w, Some(1), a[2], 1_500).resident);
    b.forget(w);
    assert!(b.resident(w, 0, 1_500).is_empty());
}

#[test]
fn prices_resident_absent_and_evicting() {
    let (b, a) = book(2);
    let w = "http://w0";
    // Unknown worker: a load at the default time, nothing to evict.
    let fresh = b.price(w, Some(0), a[0], 0);
    assert_eq!((fresh.resident, fresh.evicts), (false, false));
    assert!((fresh.seconds() - LOAD).abs() < 1e-12);
    // a0 three times, a1 once: the pool (2) is full.
    for t in [100, 200, 300] {
        b.record_dispatch(w, Some(0), a[0], t);
    }
    b.record_dispatch(w, Some(0), a[1], 400);
    assert_eq!(b.price(w, Some(0), a[1], 500).seconds(), 0.0);
    // All four requests finished: no adapter is in use, a load waits for nothing.
    for (ad, sent) in [(a[0], 100), (a[0], 200), (a[0], 300), (a[1], 400)] {
        b.record_done(w, Some(0), ad, (sent, 450));
    }
    // a2 would evict a0 (least recently used), which had ~3/4 of the rank's recent requests.
    let c = b.price(w, Some(0), a[2], 500);
    assert!(c.evicts && !c.resident);
    let share = c.seconds() / LOAD - 1.0;
    assert!((share - 0.75).abs() < 0.01, "evicted share {share}");
    // The worker's own load time wins over the default.
    b.configure(w, None, Some(0.2));
    assert!((b.price(w, Some(0), a[2], 500).seconds() - 0.2 * (1.0 + share)).abs() < 1e-3);
    // A larger advertised pool has room: a load, no eviction.
    b.configure(w, Some(4), Some(0.2));
    let c = b.price(w, Some(0), a[2], 500);
    assert_eq!((c.evicts, c.seconds()), (false, 0.2));
    // Nonsense advertised values count as not advertised.
    b.configure(w, Some(0), Some(f64::NAN));
    assert!((b.price(w, Some(1), a[2], 500).seconds() - LOAD).abs() < 1e-12);
}

#[test]
fn when_every_resident_adapter_is_in_use_the_price_adds_the_wait_for_one_to_drain() {
    let (b, a) = book(2);
    let w = "http://w0";
    // Two requests in flight, for a0 (sent at 0) and a1 (sent at 1 s): both slots busy.
    b.record_dispatch(w, Some(0), a[0], 0);
    b.record_dispatch(w, Some(0), a[1], 1_000);
    let c = b.price(w, Some(0), a[2], 2_000);
    assert!(c.evicts && c.waits && !c.resident);
    // No request has finished there yet: the prior (4 s) says a0's ends at 4 s, 2 s from now.
    assert!((c.wait_s - 2.0).abs() < 1e-9, "{c:?}");
    // a0's request ends after 3 s: the worker's mean is now 3 s, and a0's slot is idle, so a
    // load into it costs no wait (and reloading a0 later is priced by its share).
    b.record_done(w, Some(0), a[0], (0, 3_000));
    let c = b.price(w, Some(0), a[2], 3_000);
    assert!(c.evicts && !c.waits && c.wait_s == 0.0 && c.load_s > LOAD);
    // Busy again: a0 sent at 3 s; the soonest to drain is a1 (sent at 1 s): 3 s mean, 1 s left.
    b.record_dispatch(w, Some(0), a[0], 3_000);
    let c = b.price(w, Some(0), a[2], 3_000);
    assert!((c.wait_s - 1.0).abs() < 1e-9, "{c:?}");
    // The dispatch of a2 to the full, busy rank evicts (in belief) the least recently used.
    b.record_dispatch(w, Some(0), a[2], 3_500);
    assert_eq!(b.resident(w, 0, 3_500), ["a0", "a2"]);
    // Finishing an unknown worker's or adapter's request is ignored.
    b.record_done("http://nobody", None, a[0], (0, 1));
    b.record_done(w, Some(7), a[5], (0, 1));
}

#[test]
fn reports_override_the_history() {
    let (b, a) = book(4);
    let w = "http://w0";
    b.record_dispatch(w, Some(0), a[0], 100);
    b.record_dispatch(w, Some(0), a[1], 200);
    // The engine says rank 0 holds a1 and a3 (a0 was evicted by traffic this router never saw),
    // rank 1 holds a5, including a name the router had not seen.
    let ranks = vec![
        vec!["a1".to_string(), "a3".to_string()],
        vec!["a5".to_string(), "new".to_string()],
    ];
    b.report(w, &ranks, 300);
    assert_eq!(b.resident(w, 0, 300), ["a1", "a3"]);
    assert_eq!(b.resident(w, 1, 300), ["a5", "new"]);
    assert!(!b.price(w, Some(0), a[0], 300).resident);
    assert!(b.price(w, Some(0), a[3], 300).resident);
    assert!(b.price(w, Some(1), b.id("new").unwrap(), 300).resident);
    assert_eq!(b.counters.reports.load(Relaxed), 1);
    // History goes on from the report: a dispatch after it is believed too.
    b.record_dispatch(w, Some(0), a[0], 400);
    assert_eq!(b.resident(w, 0, 400), ["a1", "a3", "a0"]);
    // An empty report empties the rank.
    b.report(w, &[Vec::<&str>::new()], 500);
    assert!(b.resident(w, 0, 500).is_empty());
}

#[test]
fn whole_workers_are_priced_at_the_mean_over_ranks_and_candidates_in_order() {
    let (b, a) = book(4);
    let epoch = Instant::now();
    let workers: Vec<Arc<Worker>> = (0..2)
        .map(|i| Arc::new(Worker::new(format!("http://w{i}"), 2, None, epoch)))
        .collect();
    // w0 holds a0 on rank 0 only; w1 holds it on both ranks.
    b.report("http://w0", &[vec!["a0"], vec![]], 0);
    b.report("http://w1", &[vec!["a0"], vec!["a0"]], 0);
    let list = [
        Candidate {
            worker: 0,
            rank: Some(0),
        },
        Candidate {
            worker: 0,
            rank: Some(1),
        },
        Candidate {
            worker: 0,
            rank: None,
        },
        Candidate {
            worker: 1,
            rank: None,
        },
    ];
    let mut costs = vec![AdapterCost::RESIDENT; 1];
    b.fill_costs(Candidates::listed(&workers, &list), a[0], 10, &mut costs);
    let out: Vec<f64> = costs.iter().map(AdapterCost::seconds).collect();
    assert_eq!(out.len(), 4);
    assert_eq!((out[0], out[3]), (0.0, 0.0));
    assert!((out[1] - LOAD).abs() < 1e-12);
    assert!(
        (out[2] - LOAD / 2.0).abs() < 1e-12,
        "half the ranks hold it"
    );
    assert!(!b.price("http://w0", None, a[0], 10).resident);
    // A whole-worker dispatch is believed on every rank.
    b.record_dispatch("http://w0", None, a[1], 20);
    assert!(b.price("http://w0", None, a[1], 20).resident);
}

#[test]
fn the_book_is_bounded_against_what_peers_send() {
    let b = AdapterBook::new(AdapterBookConfig::default());
    for i in 0..MAX_ADAPTER_NAMES {
        assert!(b.intern(&format!("n{i}")).is_some());
    }
    assert_eq!(b.intern("one too many"), None);
    // A report of absurd size keeps the first MAX_REPORTED ranks and names of each.
    let huge = vec![
        (0..2 * MAX_REPORTED)
            .map(|i| format!("n{i}"))
            .collect::<Vec<_>>();
        2
    ];
    b.report("http://w", &huge, 0);
    assert_eq!(b.resident("http://w", 0, 0).len(), MAX_REPORTED);
    // A rank beyond the bound is not recorded.
    b.record_dispatch("http://w", Some(u32::MAX), b.id("n1").unwrap(), 0);
    assert_eq!(b.counters.dispatches.load(Relaxed), 0);
}
