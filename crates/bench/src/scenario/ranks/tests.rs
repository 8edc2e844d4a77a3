//! S5 on short runs: routing ranks keeps the reuse that rank-blind routing loses, and one-rank
//! engines do not care whether ranks are routed.

use super::*;
use crate::scenario::by_name;

fn short_s5(duration_s: f64) -> Scenario {
    Scenario {
        duration_s,
        ..by_name("S5").unwrap()
    }
}

fn row(fleet: Fleet, routing: RankRouting, label: &str) -> RankVariant {
    variants()
        .into_iter()
        .find(|v| v.fleet == fleet && v.routing == routing && v.router.label == label)
        .unwrap()
}

#[test]
fn routing_ranks_keeps_the_reuse_that_the_engines_dispatcher_loses() {
    let s = short_s5(60.0);
    let arrivals = arrivals(&s, 1, s.load);
    let run =
        |routing| run_rank_variant(&s, &arrivals, &row(FOUR_RANKS, routing, DEFAULT_ROUTER)).0;
    let (aware, blind) = (run(RankRouting::PerRank), run(RankRouting::Whole));
    for o in [&aware, &blind] {
        assert!(
            o.completed == o.submitted && o.completed > 1000,
            "everything finishes: {} of {}",
            o.completed,
            o.submitted
        );
    }
    let (a, b) = (hit(&aware), hit(&blind));
    // Whole-engine routing prices a worker at its best rank's cache; the dispatcher then picks a
    // rank by load, usually another one.
    assert!(a > b + 0.05, "rank-aware {a} vs rank-blind {b}");
}

#[test]
fn one_rank_engines_are_routed_the_same_whether_or_not_ranks_are_routed() {
    let s = short_s5(30.0);
    let arrivals = arrivals(&s, 2, s.load);
    let run = |routing| run_rank_variant(&s, &arrivals, &row(ONE_RANK, routing, DEFAULT_ROUTER)).0;
    // Only PerRank is listed for 8×1; Whole is the same router with ranks unrouted.
    let per_rank = run(RankRouting::PerRank);
    let whole = run_rank_variant(
        &s,
        &arrivals,
        &RankVariant {
            routing: RankRouting::Whole,
            ..row(ONE_RANK, RankRouting::PerRank, DEFAULT_ROUTER)
        },
    )
    .0;
    assert!(per_rank.completed > 500 && hit(&per_rank) > 0.3);
    assert_eq!(per_rank.ttft, whole.ttft);
    assert_eq!(per_rank.cache_tokens, whole.cache_tokens);
}

#[test]
fn s5_has_the_same_arrivals_on_either_fleet_and_its_acceptance_line_names_both_routings() {
    let s = short_s5(20.0);
    let shaped = Scenario {
        engines: FOUR_RANKS.engines,
        ranks: FOUR_RANKS.ranks,
        ..s.clone()
    };
    assert_eq!(s.schedulers(), shaped.schedulers());
    let (a, b) = (arrivals(&s, 3, s.load), arrivals(&shaped, 3, s.load));
    assert_eq!(a.len(), b.len());
    assert!(
        a.iter()
            .zip(&b)
            .all(|(x, y)| x.t == y.t && x.prompt == y.prompt)
    );
    let rows = comparison(&s, 3, s.load, |_| {});
    assert_eq!(rows.len(), variants().len());
    let text = acceptance(&rows);
    assert!(
        text.contains("2×4 rank-aware") && text.contains("2×4 rank-blind"),
        "{text}"
    );
    assert_eq!(rows_json(&rows)[4]["fleet"], "2×4");
}
