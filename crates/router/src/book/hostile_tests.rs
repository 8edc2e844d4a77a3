//! What a lying or broken peer can send the book: extreme and negative numbers, seq jumps of
//! ±2^63, ranks far beyond any real fleet. None of it may panic (these run in debug builds, where
//! overflow panics), and each leaves a belief that still makes sense.

use super::*;
use crate::budget::Refusal;
use std::sync::Arc;

fn extreme(v: i64) -> LoadSnapshot {
    LoadSnapshot {
        num_running_reqs: v,
        num_waiting_reqs: v,
        num_used_tokens: v,
        num_total_tokens: v,
        num_waiting_uncached_tokens: v,
        total_prefill_uncached_tokens: v,
        total_prefill_busy_us: v,
        ..Default::default()
    }
}

fn refused(w: &Worker, r: Refusal) -> u64 {
    w.refusals.counts().get(r)
}

#[test]
fn seq_jumps_of_two_to_the_63_neither_panic_nor_wrap_the_counters() {
    let w = Worker::new("http://a".into(), 1, None, Instant::now());
    let s = extreme(1);
    assert_eq!(w.record(0, 0, &s), SeqEvent::InOrder);
    assert_eq!(w.record(0, i64::MAX, &s), SeqEvent::Gap);
    let rank = w.ranks.get(0).expect("rank 0");
    assert_eq!(rank.gaps.load(Relaxed), (i64::MAX - 1) as u64);
    assert_eq!(
        w.record(0, i64::MAX, &s),
        SeqEvent::Restart,
        "a repeat of the largest seq"
    );
    assert_eq!(w.record(0, i64::MIN, &s), SeqEvent::OutOfRange);
    assert_eq!(refused(&w, Refusal::NumberOutOfRange), 1, "a negative seq");
    assert_eq!(w.record(0, 1, &s), SeqEvent::Restart);
    assert_eq!(w.record(0, i64::MAX, &s), SeqEvent::Gap);
    assert_eq!(w.record(0, 2, &s), SeqEvent::Restart);
    assert_eq!(w.record(0, i64::MAX, &s), SeqEvent::Gap);
    assert_eq!(
        rank.gaps.load(Relaxed),
        u64::MAX,
        "gaps saturate instead of wrapping to a small count"
    );
    assert_eq!(rank.messages.load(Relaxed), 8);
}

#[test]
fn extreme_and_negative_numbers_are_clamped_and_counted() {
    let w = Arc::new(Worker::new("http://a".into(), 2, None, Instant::now()));
    for (seq, v) in [
        (0, i64::MAX),
        (1, i64::MIN),
        (2, i64::MAX),
        (3, -1),
        (4, i64::MAX),
    ] {
        w.record(0, seq, &extreme(v));
        w.record(1, seq, &extreme(v));
    }
    let l = w.load(LoadSignal::Engine, 60_000);
    assert_eq!(l.source, Source::Engine);
    assert_eq!(
        l.requests,
        4 * MAX_REPORTED,
        "two ranks, running + waiting each"
    );
    assert!(l.tokens <= 2 * MAX_REPORTED * 1000, "{}", l.tokens);
    let _g: Vec<_> = (0..3).map(|_| InflightGuard::new(w.clone())).collect();
    let l = w.load(LoadSignal::Backlog, 60_000);
    assert!(l.score > 0, "no wrap to a negative score: {}", l.score);
    let p = w.pricing_at(LoadSignal::Backlog, 60_000, w.now_ms());
    assert!(
        p.queued_tokens
            .is_some_and(|q| q >= 2 * MAX_REPORTED as u64 * 1000)
    );
    assert!(
        p.us_per_token.is_finite() && p.us_per_token > 0.0,
        "{}",
        p.us_per_token
    );
    assert!(
        refused(&w, Refusal::NumberOutOfRange) >= 1,
        "values beyond the believed range are counted"
    );
    // A sane report afterwards is believed as is.
    w.record(0, 5, &extreme(2));
    w.record(1, 5, &extreme(3));
    drop(_g);
    assert_eq!(w.load(LoadSignal::Engine, 60_000).requests, 10);
}

#[test]
fn prefill_counters_at_the_extremes_do_not_panic_or_poison_the_estimate() {
    let m = prefill_rate::PrefillRate::default();
    for (t, u) in [
        (-5, -5),
        (i64::MAX, i64::MAX),
        (i64::MIN, i64::MIN),
        (i64::MAX, 0),
        (0, i64::MAX),
        (i64::MIN, i64::MAX),
    ] {
        m.observe(t, u);
    }
    assert_eq!(m.us_per_token(), None, "no nonsense sample was taken");
    m.observe(0, 0);
    m.observe(10_000, 2_000_000);
    assert_eq!(
        m.us_per_token(),
        Some(200.0),
        "measures again after the garbage"
    );
}

#[test]
fn a_sparse_worker_keeps_only_reported_ranks_within_its_bound() {
    let w = Worker::sparse("http://a".into(), 8, Instant::now());
    assert!(w.apply_at(3, &extreme(2), w.now_ms()), "rank 3 alone");
    let l = w.load(LoadSignal::Engine, 60_000);
    assert_eq!(
        (l.requests, l.source),
        (4, Source::Engine),
        "priced on the one rank that reports, not on in-flight"
    );
    assert!(!w.apply_at(1 << 40, &extreme(2), w.now_ms()));
    assert!(!w.apply_at(8, &extreme(2), w.now_ms()));
    assert_eq!(refused(&w, Refusal::RankOutOfRange), 2);
    assert!(
        w.refusals
            .last()
            .is_some_and(|t| t.contains("1099511627776") && t.contains('8')),
        "{:?}",
        w.refusals.last()
    );
    assert!(w.apply_at(0, &extreme(1), w.now_ms()));
    let ids: Vec<usize> = w.ranks.iter().map(|r| r.rank).collect();
    assert_eq!(
        ids,
        [3, 0],
        "one slot per reported rank, in the order they came"
    );
    assert_eq!(w.load(LoadSignal::Engine, 60_000).requests, 6);
    assert_eq!(w.record(3, 7, &extreme(1)), SeqEvent::InOrder);
}
