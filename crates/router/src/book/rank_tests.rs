//! Per-rank accounting: each DP rank of a worker is priced on its own snapshot, its own
//! freshness and what this router routed to it by name.

use super::*;
use crate::candidate::CandidateList;
use crate::fleet_view::FleetView;
use crate::policy::{MinTtft, View};
use std::sync::Arc;

fn snap(running: i64, waiting: i64, backlog: i64) -> LoadSnapshot {
    LoadSnapshot {
        num_running_reqs: running,
        num_waiting_reqs: waiting,
        num_waiting_uncached_tokens: backlog,
        ..Default::default()
    }
}

#[test]
fn a_rank_is_priced_on_its_own_snapshot_and_its_own_dispatches() {
    let w = Arc::new(Worker::new("http://a".into(), 2, None, Instant::now()));
    w.record_at(0, 0, &snap(4, 2, 3000), 10);
    w.record_at(1, 0, &snap(1, 0, 0), 10);
    let e = LoadSignal::Engine;
    assert_eq!(w.rank_load_at(0, e, 1000, 20).requests, 6);
    assert_eq!(w.rank_load_at(1, e, 1000, 20).requests, 1);
    assert_eq!(
        w.load_at(e, 1000, 20).requests,
        7,
        "the worker sums its ranks"
    );
    let g = InflightGuard::to_target(w.clone(), Some(1), 400);
    assert_eq!(g.rank(), Some(1));
    assert_eq!(
        (
            w.rank_load_at(1, e, 1000, 20).requests,
            w.rank_load_at(0, e, 1000, 20).requests
        ),
        (2, 6),
        "a dispatch routed to rank 1 counts there only"
    );
    assert_eq!(w.load_at(e, 1000, 20).requests, 8, "and on the worker");
    let p1 = w.rank_pricing_at(1, LoadSignal::Backlog, 1000, 20);
    assert_eq!((p1.queued_tokens, p1.inflight), (Some(400), 1));
    let p0 = w.rank_pricing_at(0, LoadSignal::Backlog, 1000, 20);
    assert_eq!((p0.queued_tokens, p0.inflight), (Some(3000), 0));
    w.record_at(1, 1, &snap(2, 0, 0), 30);
    assert_eq!(
        w.rank_pricing_at(1, LoadSignal::Backlog, 1000, 40)
            .queued_tokens,
        Some(0),
        "rank 1's next snapshot includes the dispatch"
    );
    drop(g);
    let r1 = w.ranks.get(1).unwrap();
    assert_eq!(
        (
            r1.routed().inflight(),
            r1.routed().requests_total.load(Relaxed)
        ),
        (0, 1)
    );
    assert_eq!(w.inflight(), 0);
    assert_eq!(
        w.rank_load_at(7, e, 1000, 40),
        w.load_at(e, 1000, 40),
        "no such rank: the worker"
    );
}

#[test]
fn a_stale_rank_falls_back_alone() {
    let w = Arc::new(Worker::new("http://a".into(), 2, None, Instant::now()));
    w.record_at(0, 0, &snap(1, 0, 0), 10);
    w.record_at(1, 0, &snap(9, 9, 0), 5_000);
    let _g = InflightGuard::to_target(w.clone(), Some(0), 100);
    let e = LoadSignal::Engine;
    let (r0, r1) = (
        w.rank_load_at(0, e, 1000, 5_100),
        w.rank_load_at(1, e, 1000, 5_100),
    );
    assert_eq!(
        (r0.source, r0.requests),
        (Source::Fallback, 1),
        "rank 0: its own in-flight"
    );
    assert_eq!(
        (r1.source, r1.requests),
        (Source::Engine, 18),
        "rank 1 is still fresh"
    );
    assert_eq!(
        w.load_at(e, 1000, 5_100).source,
        Source::Fallback,
        "the worker needs every rank"
    );
    assert_eq!(w.rank_pricing_at(0, e, 1000, 5_100).queued_tokens, None);
}

#[test]
fn min_ttft_over_ranks_follows_the_rank_that_holds_the_prefix_until_its_queue_costs_more() {
    let epoch = Instant::now();
    let ws = vec![
        Arc::new(Worker::new("http://a".into(), 4, None, epoch)),
        Arc::new(Worker::new("http://b".into(), 1, None, epoch)),
    ];
    for r in 0..4 {
        ws[0].record_at(r, 0, &snap(0, 0, 0), 10);
    }
    ws[1].record_at(0, 0, &snap(0, 0, 0), 10);
    let list = CandidateList::of(&ws, crate::candidate::RankField::Both);
    assert_eq!(list.ranked.len(), 5);
    // The prompt's 4,000 tokens are cached on a's rank 2 only (candidate 2).
    let cached = [0, 0, 4000, 0, 0];
    let mut view = FleetView::new(&ws, LoadSignal::Backlog, 1000)
        .with_candidates(&list.ranked)
        .with_prefix(4096, &cached);
    view.now_ms = 20;
    let p = MinTtft::default();
    for e in 0..32 {
        assert_eq!(p.pick(&view, e), Some(2), "the rank that holds the prefix");
    }
    // A direct client's backlog on rank 2: the other ranks of the same engine are cheaper now.
    ws[0].record_at(2, 1, &snap(8, 40, 200_000), 30);
    view.now_ms = 40;
    let picked = p.pick(&view, 1).unwrap();
    assert_ne!(picked, 2);
    assert!(view.queued_prefill_s(2).unwrap() > view.queued_prefill_s(picked).unwrap());
    // A pinned client rank: only that rank (and whole workers) qualify.
    view.pinned_rank = Some(3);
    assert!(!view.available(2) && view.available(3) && view.available(4));
    // A failed worker leaves with every rank.
    view.pinned_rank = None;
    view.exclude(1);
    assert!((0..4).all(|i| !view.available(i)) && view.available(4));
}

#[test]
fn what_a_pick_reads_of_a_rank_sits_in_its_first_two_cache_lines() {
    use super::ranks::RankRouted;
    use std::mem::offset_of;
    let end = |at: usize| at + 8;
    let routed = offset_of!(RankState, routed);
    let hot = [
        end(offset_of!(RankState, tokens)),
        end(offset_of!(RankState, rho_bits)),
        end(offset_of!(RankState, pool_free)),
        end(routed + offset_of!(RankRouted, dispatched)),
        end(routed + offset_of!(RankRouted, inflight_tokens)),
    ];
    assert!(hot.iter().all(|&e| e <= 128), "{hot:?}");
    assert_eq!(std::mem::align_of::<RankState>(), 64);
}

#[test]
fn a_streaming_request_not_yet_answered_stays_queued_past_a_snapshot_that_missed_it() {
    let w = Arc::new(Worker::new("http://a".into(), 2, None, Instant::now()));
    w.record_at(0, 0, &snap(0, 0, 0), 10);
    w.record_at(1, 0, &snap(0, 0, 0), 10);
    let b = LoadSignal::Backlog;
    let mut streaming = InflightGuard::to_target(w.clone(), Some(1), 700).awaiting_first_bytes();
    let plain = InflightGuard::to_target(w.clone(), Some(1), 300);
    // Both ranks report again before either request reached the engine's queue (still being
    // tokenized): the marks move past both dispatches.
    w.record_at(0, 1, &snap(0, 0, 0), 30);
    w.record_at(1, 1, &snap(0, 0, 0), 30);
    let queued = |w: &Worker| {
        (
            w.rank_pricing_at(1, b, 1000, 40).queued_tokens,
            w.pricing_at(b, 1000, 40).queued_tokens,
        )
    };
    assert_eq!(
        queued(&w),
        (Some(700), Some(700)),
        "the unanswered streaming request is a floor on the rank and the worker"
    );
    streaming.started();
    assert_eq!(queued(&w), (Some(0), Some(0)), "its first bytes end it");
    streaming.started();
    drop(streaming);
    let again = InflightGuard::to_target(w.clone(), Some(0), 200).awaiting_first_bytes();
    w.record_at(0, 2, &snap(0, 0, 0), 50);
    w.record_at(1, 2, &snap(0, 0, 0), 50);
    assert_eq!(w.pricing_at(b, 1000, 60).queued_tokens, Some(200));
    drop(again);
    assert_eq!(
        w.pricing_at(b, 1000, 60).queued_tokens,
        Some(0),
        "a drop without an answer (a failure, a disconnect) ends it too, once"
    );
    drop(plain);
}
