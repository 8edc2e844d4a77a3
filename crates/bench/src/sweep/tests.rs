//! The acceptance check on synthetic rows: each criterion fires exactly when it should.

use super::*;

fn r(load: f64, label: &str, kind: RowKind, hit: f64, p50: f64, p99: f64, wait: f64) -> SweepRow {
    SweepRow {
        load,
        label: label.into(),
        kind,
        hit,
        p50,
        p99,
        wait_p99: wait,
        p99_whole_run: p99,
        rho: None,
        completed: 1,
        submitted: 1,
    }
}

use RowKind::{Oracle, Production};

/// A passing sweep at two loads: default equal to the best, an oracle better everywhere.
fn passing() -> Vec<SweepRow> {
    let mut rows = Vec::new();
    for (l, scale) in [(0.5, 1.0), (0.55, 1.5)] {
        rows.push(r(l, "other", Production, 0.7, 0.1 * scale, 1.0, 0.5));
        rows.push(r(l, "default", Production, 0.7, 0.1 * scale, 1.0, 0.5));
        rows.push(r(l, "oracle a", Oracle, 0.8, 0.05, 0.9, 0.4));
        rows.push(r(l, "oracle b", Oracle, 0.75, 0.04, 0.95, 0.45));
    }
    let b = bound(&rows);
    rows.extend(b);
    rows
}

#[test]
fn the_bound_takes_each_figure_from_its_best_oracle() {
    let rows = passing();
    let b: Vec<&SweepRow> = rows.iter().filter(|r| r.kind == RowKind::Bound).collect();
    assert_eq!(b.len(), 2);
    assert_eq!(
        (b[0].hit, b[0].p50, b[0].p99, b[0].wait_p99),
        (0.8, 0.04, 0.9, 0.4)
    );
    assert!(
        check(&rows, "default").is_empty(),
        "{:?}",
        check(&rows, "default")
    );
}

fn violations_after(edit: impl Fn(&mut Vec<SweepRow>)) -> Vec<String> {
    let mut rows = passing();
    edit(&mut rows);
    rows.retain(|r| r.kind != RowKind::Bound);
    let b = bound(&rows);
    rows.extend(b);
    check(&rows, "default")
        .into_iter()
        .map(|v| v.what)
        .collect()
}

fn set(rows: &mut [SweepRow], load: f64, label: &str, f: impl Fn(&mut SweepRow)) {
    rows.iter_mut()
        .filter(|r| r.load == load && r.label == label)
        .for_each(f);
}

#[test]
fn each_criterion_fires_on_its_own() {
    let one = |v: Vec<String>, needle: &str| {
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains(needle), "{v:?}");
    };
    one(
        violations_after(|x| set(x, 0.5, "other", |r| r.hit = 0.79)),
        "hit",
    );
    one(
        violations_after(|x| set(x, 0.5, "other", |r| r.p99 = 0.9)),
        "p99",
    );
    one(
        violations_after(|x| set(x, 0.5, "default", |r| r.wait_p99 = 0.621)),
        "wait p99",
    );
    assert!(violations_after(|x| set(x, 0.5, "default", |r| r.wait_p99 = 0.619)).is_empty());
    one(
        violations_after(|x| {
            set(x, 0.55, "default", |r| r.hit = 0.55);
            set(x, 0.55, "other", |r| r.hit = 0.55);
        }),
        "cliff: hit",
    );
    one(
        violations_after(|x| {
            set(x, 0.55, "default", |r| r.p50 = 0.21);
            set(x, 0.55, "other", |r| r.p50 = 0.21);
        }),
        "cliff: p50",
    );
    one(
        violations_after(|x| set(x, 0.5, "other", |r| r.p50 = 0.03)),
        "bound beaten on p50",
    );
}

#[test]
fn the_worst_hit_loss_is_relative_between_adjacent_loads() {
    let rows = vec![
        r(0.5, "a", Production, 0.8, 0.1, 1.0, 0.5),
        r(0.55, "a", Production, 0.6, 0.1, 1.0, 0.5),
        r(0.6, "a", Production, 0.2, 0.1, 1.0, 0.5),
    ];
    let (from, to, lost) = worst_hit_loss(&rows, "a").unwrap();
    assert_eq!((from, to), (0.55, 0.6));
    assert!((lost - 2.0 / 3.0).abs() < 1e-12);
}

#[test]
fn a_warm_up_leaves_out_early_requests_and_early_tokens() {
    let o = crate::sim::Outcome {
        ttft: vec![9.0, 0.1, 0.2],
        ttft_floor: vec![0.05, 0.05, 0.05],
        arrived: vec![10.0, 130.0, 200.0],
        cache_tokens: Some((900, 1_400)),
        cache_series: vec![(119.0, 0, 400), (120.0, 100, 600), (121.0, 200, 700)],
        ..Default::default()
    };
    let (ttft, waits) = o.since(120.0);
    assert_eq!(ttft, vec![0.1, 0.2]);
    assert!((waits[1] - 0.15).abs() < 1e-12);
    // 800 of the 800 prompt tokens after the 120 s sample: (900 − 100) / (1400 − 600).
    assert_eq!(o.hit_rate_since(120.0), Some(1.0));
    assert_eq!(o.hit_rate_since(0.0), Some(900.0 / 1_400.0));
}
