//! The book's unit tests: load merging, clamps, the backlog signal, seqs, the breaker, and the
//! prefill-rate meter.

use super::*;
use std::sync::Arc;

fn snap(running: i64, waiting: i64) -> LoadSnapshot {
    LoadSnapshot {
        num_running_reqs: running,
        num_waiting_reqs: waiting,
        ..Default::default()
    }
}

#[test]
fn load_combines_engine_dispatches_and_inflight() {
    let w = Arc::new(Worker::new("http://a".into(), 2, None, Instant::now()));
    assert_eq!(
        w.load(LoadSignal::Engine, 3000).source,
        Source::Fallback,
        "no snapshot yet"
    );
    w.record(0, 0, &snap(3, 2));
    assert_eq!(
        w.load(LoadSignal::Engine, 3000).source,
        Source::Fallback,
        "rank 1 never reported"
    );
    w.record(1, 0, &snap(1, 0));
    let l = w.load(LoadSignal::Engine, 3000);
    assert_eq!((l.requests, l.source), (6, Source::Engine));
    let g1 = InflightGuard::new(w.clone());
    let g2 = InflightGuard::new(w.clone());
    assert_eq!(
        w.load(LoadSignal::Engine, 3000).requests,
        8,
        "E + D: dispatches since the snapshot"
    );
    assert_eq!(w.load(LoadSignal::Inflight, 3000).requests, 2);
    w.record(0, 1, &snap(5, 2));
    w.record(1, 1, &snap(1, 0));
    assert_eq!(
        w.load(LoadSignal::Engine, 3000).requests,
        8,
        "the snapshot now includes them"
    );
    drop((g1, g2));
    assert_eq!(w.inflight(), 0);
    std::thread::sleep(std::time::Duration::from_millis(3));
    assert_eq!(
        w.load(LoadSignal::Engine, 1).source,
        Source::Fallback,
        "stale beyond the freshness bound"
    );
}

#[test]
fn max_of_inflight_and_engine_and_clamps() {
    let w = Arc::new(Worker::new("http://a".into(), 1, None, Instant::now()));
    w.record(0, 0, &snap(-50, i64::MAX));
    assert_eq!(w.load(LoadSignal::Engine, 3000).requests, MAX_REPORTED);
    w.record(0, 1, &snap(0, 0));
    let guards: Vec<_> = (0..4).map(|_| InflightGuard::new(w.clone())).collect();
    w.record(0, 2, &snap(1, 0));
    assert_eq!(
        w.load(LoadSignal::Engine, 3000).requests,
        4,
        "F wins when the engine under-reports"
    );
    drop(guards);
}

#[test]
fn backlog_signal_prices_prefill_work_in_tokens() {
    let a = Arc::new(Worker::new("http://a".into(), 1, None, Instant::now()));
    let b = Arc::new(Worker::new("http://b".into(), 1, None, Instant::now()));
    // A: one request with a long prompt still to prefill. B: three short ones decoding.
    a.record(
        0,
        0,
        &LoadSnapshot {
            num_waiting_reqs: 1,
            num_waiting_uncached_tokens: 6000,
            ..Default::default()
        },
    );
    b.record(0, 0, &snap(3, 0));
    let score = |w: &Worker, s| w.load(s, 3000).score;
    assert!(
        score(&a, LoadSignal::Engine) < score(&b, LoadSignal::Engine),
        "by counts A looks idle"
    );
    assert!(
        score(&a, LoadSignal::Backlog) > score(&b, LoadSignal::Backlog),
        "by backlog A is the slow one"
    );
    assert_eq!(score(&a, LoadSignal::Backlog), 6000 + REQUEST_TOKENS_WEIGHT);
    let _g = InflightGuard::new(b.clone());
    assert_eq!(
        score(&b, LoadSignal::Backlog),
        3 * REQUEST_TOKENS_WEIGHT + DISPATCH_TOKENS_GUESS
    );
}

#[test]
fn seq_tracking() {
    let w = Worker::new("http://a".into(), 1, None, Instant::now());
    assert_eq!(w.record(0, 5, &snap(0, 0)), SeqEvent::InOrder);
    assert_eq!(w.record(0, 6, &snap(0, 0)), SeqEvent::InOrder);
    assert_eq!(w.record(0, 9, &snap(0, 0)), SeqEvent::Gap);
    assert_eq!(w.ranks.get(0).unwrap().gaps.load(Relaxed), 2);
    assert_eq!(w.record(0, 0, &snap(0, 0)), SeqEvent::Restart);
    assert_eq!(w.record(0, 1, &snap(0, 0)), SeqEvent::InOrder);
    assert_eq!(w.record(3, 1, &snap(0, 0)), SeqEvent::UnknownRank);
}

#[test]
fn breaker_opens_after_threshold() {
    let w = Worker::new("http://a".into(), 0, None, Instant::now());
    w.failed(3, 60_000);
    w.failed(3, 60_000);
    assert!(w.available());
    w.failed(3, 60_000);
    assert!(!w.available() && w.breaker_open());
}

#[test]
fn pricing_counts_dispatched_tokens_since_the_snapshot_and_the_measured_speed() {
    let w = Arc::new(Worker::new("http://a".into(), 2, None, Instant::now()));
    let p = |w: &Worker, s| w.pricing_at(s, 3000, w.now_ms());
    assert_eq!(
        p(&w, LoadSignal::Backlog).queued_tokens,
        None,
        "no snapshot yet"
    );
    let snap = |backlog, tokens, busy_us| LoadSnapshot {
        num_waiting_uncached_tokens: backlog,
        total_prefill_uncached_tokens: tokens,
        total_prefill_busy_us: busy_us,
        token_usage: Some(0.5),
        ..Default::default()
    };
    w.record(0, 0, &snap(1000, 0, 0));
    w.record(1, 0, &snap(500, 0, 0));
    let g = InflightGuard::with_tokens(w.clone(), 300);
    let got = p(&w, LoadSignal::Backlog);
    assert_eq!(got.queued_tokens, Some(1800));
    assert_eq!(got.inflight, 1);
    assert_eq!(
        got.us_per_token,
        prefill_rate::PRIOR_US_PER_TOKEN / 2.0,
        "two ranks"
    );
    assert!((got.kv_usage - 0.5).abs() < 1e-9);
    assert_eq!(p(&w, LoadSignal::Inflight).queued_tokens, None);
    // Both ranks measured at 200 µs/token: 100 µs/token for the worker; the snapshot now
    // includes the dispatch.
    w.record(0, 1, &snap(1300, 10_000, 2_000_000));
    w.record(1, 1, &snap(500, 10_000, 2_000_000));
    let got = p(&w, LoadSignal::Engine);
    assert_eq!(got.queued_tokens, Some(1800));
    assert!(
        (got.us_per_token - 100.0).abs() < 1e-9,
        "{}",
        got.us_per_token
    );
    drop(g);
}

#[test]
fn utilisation_reaches_the_price_per_rank_and_whole_and_not_when_stale() {
    use crate::policy::View;
    let w = Arc::new(Worker::new("http://a".into(), 2, None, Instant::now()));
    let at = |busy_us: i64| LoadSnapshot {
        total_prefill_busy_us: busy_us,
        decode_moments: Some(vec![0.0; 6]),
        max_running_requests: 64,
        ..Default::default()
    };
    w.record_at(0, 0, &at(1_000_000), 1);
    w.record_at(1, 0, &at(0), 1);
    w.record_at(0, 1, &at(1_400_000), 1_001); // 40% of the second
    let price = |now| w.pricing_at(LoadSignal::Backlog, 3000, now).utilisation;
    assert_eq!(
        price(1_001),
        None,
        "a rank not measured yet: the worker's ρ is unknown"
    );
    w.record_at(1, 1, &at(200_000), 1_001); // 20%
    let close = |v: Option<f64>, want: f64| v.is_some_and(|v| (v - want).abs() < 1e-9);
    assert!(
        close(price(1_001), 0.3),
        "the ranks' mean: {:?}",
        price(1_001)
    );
    let rank = |r, now| {
        w.rank_pricing_at(r, LoadSignal::Backlog, 3000, now)
            .utilisation
    };
    assert!(close(rank(0, 1_001), 0.4) && close(rank(1, 1_001), 0.2));
    assert_eq!((price(4_002), rank(0, 4_002)), (None, None), "stale");
    assert_eq!(
        w.pricing_at(LoadSignal::Inflight, 3000, 1_001).utilisation,
        None,
        "not priced on engine load"
    );
    assert!(close(w.utilisation(), 0.3), "shown whatever its age");
    // Policies read it through the fleet's view, per rank and whole.
    let workers = [w.clone()];
    let list = [
        crate::candidate::Candidate {
            worker: 0,
            rank: None,
        },
        crate::candidate::Candidate {
            worker: 0,
            rank: Some(1),
        },
    ];
    let mut v = crate::fleet_view::FleetView::new(&workers, LoadSignal::Backlog, 3000)
        .with_candidates(&list);
    v.now_ms = 1_001;
    assert!(close(v.utilisation(0), 0.3) && close(v.price(1).utilisation, 0.2));
    v.now_ms = 4_002;
    assert_eq!((v.utilisation(0), v.price(1).utilisation), (None, None));
}

#[test]
fn the_free_pool_reaches_the_price_fullest_rank_for_a_worker_and_not_when_stale() {
    let w = Arc::new(Worker::new("http://a".into(), 2, None, Instant::now()));
    let pool = |cap: i64, used: i64| LoadSnapshot {
        max_total_num_tokens: cap,
        num_used_tokens: used,
        ..Default::default()
    };
    w.record_at(0, 0, &pool(100_000, 30_000), 1);
    w.record_at(1, 0, &pool(0, 30_000), 1); // no pool size reported
    let free = |now| {
        w.pricing_at(LoadSignal::Backlog, 3000, now)
            .free_pool_tokens
    };
    let rank = |r, now| {
        w.rank_pricing_at(r, LoadSignal::Backlog, 3000, now)
            .free_pool_tokens
    };
    assert_eq!(
        (free(2), rank(0, 2), rank(1, 2)),
        (None, Some(70_000), None)
    );
    w.record_at(1, 1, &pool(100_000, 90_000), 2);
    assert_eq!(
        (free(2), rank(1, 2)),
        (Some(10_000), Some(10_000)),
        "the fullest rank"
    );
    w.record_at(1, 2, &pool(100_000, 120_000), 3); // more used than the pool: none free
    assert_eq!(rank(1, 3), Some(0));
    assert_eq!((free(3_005), rank(0, 3_005)), (None, None), "stale");
}
