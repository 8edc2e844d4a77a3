//! `min_ttft`'s fleet pricing ([`super::fleet_cost`]): as greedy as the plain TTFT at low load,
//! locality kept near saturation, a hot holder still shed, holders preferred among ties, and
//! exactly today's picks wherever nothing is cached or no utilisation is known.

use super::fleet_cost::{FleetCtx, externality};
use super::*;

/// One worker: its queue, its cached prefix of the request, its utilisation, its pool.
#[derive(Clone, Copy)]
struct F {
    queued_s: f64,
    cached: u64,
    rho: Option<f64>,
    free: Option<u64>,
    regret: f64,
}

const W: F = F {
    queued_s: 0.0,
    cached: 0,
    rho: None,
    free: None,
    regret: 0.0,
};

/// 10k prefill tokens/s everywhere.
const S_TOK: f64 = 1e-4;

struct Fleet {
    prompt: u64,
    w: Vec<F>,
    /// The request's first uncached page's key, and each worker's replica-independent key.
    page_key: Option<u64>,
    keys: Vec<u64>,
    /// What the tail-reuse meter says; `None`: the default (whenever something is cached).
    tail: Option<bool>,
}

impl View for Fleet {
    fn len(&self) -> usize {
        self.w.len()
    }
    fn load(&self, _i: usize) -> i64 {
        0
    }
    fn available(&self, _i: usize) -> bool {
        true
    }
    fn prompt_tokens(&self) -> u64 {
        self.prompt
    }
    fn cached_tokens(&self, i: usize) -> u64 {
        self.w[i].cached
    }
    fn queued_prefill_s(&self, i: usize) -> Option<f64> {
        Some(self.w[i].queued_s)
    }
    fn engine_requests(&self, _i: usize) -> Option<i64> {
        Some(0)
    }
    fn prefill_s_per_token(&self, _i: usize) -> f64 {
        S_TOK
    }
    fn utilisation(&self, i: usize) -> Option<f64> {
        self.w[i].rho
    }
    fn free_pool_tokens(&self, i: usize) -> Option<u64> {
        self.w[i].free
    }
    fn eviction_regret(&self, i: usize) -> f64 {
        self.w[i].regret
    }
    fn prefix_key(&self, _tokens: u64) -> Option<u64> {
        self.page_key
    }
    fn worker_key(&self, i: usize) -> u64 {
        self.keys.get(i).copied().unwrap_or(i as u64)
    }
    fn tail_reused(&self, deepest: u64) -> bool {
        self.tail.unwrap_or(deepest > 0)
    }
}

fn fleet(prompt: u64, w: Vec<F>) -> Fleet {
    Fleet {
        prompt,
        w,
        page_key: None,
        keys: Vec::new(),
        tail: None,
    }
}

fn aware() -> MinTtft {
    MinTtft::default()
}

fn blind() -> MinTtft {
    MinTtft {
        fleet_pricing: FleetPricing::Blind,
        ..MinTtft::default()
    }
}

/// A session of 4,000 tokens cached on worker 0, which is `busier_s` busier than worker 1; both
/// at utilisation `rho`.
fn session(rho: f64, busier_s: f64) -> Fleet {
    Fleet {
        prompt: 4_200,
        w: vec![
            F {
                queued_s: busier_s,
                cached: 4_000,
                rho: Some(rho),
                ..W
            },
            F {
                rho: Some(rho),
                ..W
            },
        ],
        page_key: None,
        keys: Vec::new(),
        tail: None,
    }
}

#[test]
fn the_externality_is_greedy_at_low_load_and_unbounded_near_saturation() {
    assert!(externality(0.1) < 0.13);
    assert!((externality(0.5) - 2.0).abs() < 1e-12);
    assert!((externality(0.9) - 90.0).abs() < 1e-9);
    assert!(externality(1.5).is_finite() && externality(1.5) > 9_000.0);
    assert_eq!(externality(-1.0), 0.0);
}

#[test]
fn a_busier_holder_keeps_its_session_near_saturation_but_not_at_low_load() {
    // Moving recomputes 4,000 tokens (0.4 s); the holder is 0.5 s busier.
    for e in 0..200 {
        assert_eq!(
            blind().pick(&session(0.9, 0.5), e),
            Some(1),
            "greedy moves it"
        );
        assert_eq!(
            aware().pick(&session(0.1, 0.5), e),
            Some(1),
            "at low load, as greedy"
        );
        assert_eq!(
            aware().pick(&session(0.9, 0.5), e),
            Some(0),
            "near saturation it stays"
        );
    }
}

#[test]
fn a_hot_holder_is_still_shed_when_its_queue_outweighs_the_recompute() {
    // ρ 0.5 elsewhere (M 2 at the fleet's floor): 0.4 s recompute costs 0.8 s more; a holder
    // 5 s behind sheds.
    let mut f = session(0.5, 5.0);
    f.w[0].rho = Some(0.98);
    f.w[1].rho = Some(0.3);
    let ctx = FleetCtx::of(&f, |v, i| v.cached_tokens(i));
    assert!(ctx.rho_bar.unwrap() > 0.6);
    assert!((0..200).all(|e| aware().pick(&f, e) == Some(1)));
}

#[test]
fn the_holder_wins_every_tie() {
    // Both within the tie band (5% of the best price): the holder is drawn every time, where the plain
    // draw spreads.
    // The holder's 0.4 s of queue against 0.4 s of recompute and 1 ms of queue elsewhere.
    let mut f = session(0.0001, 0.4);
    f.w[1].queued_s = 0.001;
    let picks = |p: MinTtft| (0..200).filter(|&e| p.pick(&f, e) == Some(0)).count();
    assert_eq!(picks(aware()), 200);
    let spread = picks(blind());
    assert!((40..160).contains(&spread), "{spread}");
}

#[test]
fn regretted_evictions_tip_a_tie_to_the_worker_with_room() {
    // Nothing cached for this request beyond a 100-token prefix on both; worker 0's pool is full
    // and half of what it evicts is needed again, worker 1 has room.
    let f = Fleet {
        prompt: 2_100,
        w: vec![
            F {
                cached: 100,
                rho: Some(0.8),
                free: Some(0),
                regret: 0.5,
                ..W
            },
            F {
                cached: 100,
                rho: Some(0.8),
                free: Some(1_000_000),
                ..W
            },
        ],
        page_key: None,
        keys: Vec::new(),
        tail: None,
    };
    assert!((0..200).all(|e| aware().pick(&f, e) == Some(1)));
    assert!((0..200).any(|e| blind().pick(&f, e) == Some(0)));
}

#[test]
fn without_hits_or_without_utilisation_the_picks_are_todays() {
    let mut rng = 0x1234_5678_u64;
    let mut next = |m: u64| {
        rng = mix(rng);
        rng % m
    };
    for _ in 0..2_000 {
        let n = 1 + next(6) as usize;
        let hits = next(2) == 0;
        let rho_known = !hits || next(2) == 0;
        let w: Vec<F> = (0..n)
            .map(|_| F {
                queued_s: next(1000) as f64 / 1000.0,
                cached: if hits && !rho_known { next(3000) } else { 0 },
                rho: rho_known.then(|| next(99) as f64 / 100.0),
                free: Some(next(5000)),
                regret: next(100) as f64 / 100.0,
            })
            .collect();
        let mut f = fleet(3_000, w);
        f.page_key = Some(next(u64::MAX));
        let e = next(u64::MAX);
        assert_eq!(aware().pick(&f, e), blind().pick(&f, e));
    }
}

#[test]
fn replicas_agree_on_a_home_for_what_nobody_caches_near_saturation() {
    // Four workers all hold a 2,000-token system prompt; the session's 5,000 tokens of history
    // are cached nowhere yet. The least busy worker differs by 0.3 s.
    let mut f = four(7_000, 2_000, 0.9);
    let homes: std::collections::HashSet<usize> = (0..64u64)
        .map(|session| {
            f.page_key = Some(mix(session));
            let picks: std::collections::HashSet<_> =
                (0..50).map(|e| aware().pick(&f, e).unwrap()).collect();
            assert_eq!(
                picks.len(),
                1,
                "every replica picks one home for session {session}"
            );
            *picks.iter().next().unwrap()
        })
        .collect();
    assert_eq!(homes.len(), 4, "sessions spread over the homes: {homes:?}");
    // The home follows the workers, not their order in the list.
    f.page_key = Some(mix(7));
    let home = f.keys[aware().pick(&f, 0).unwrap()];
    f.w.reverse();
    f.keys.reverse();
    assert_eq!(f.keys[aware().pick(&f, 0).unwrap()], home);
    // At low load the least busy worker wins: the term is as small as ρ.
    f.w.iter_mut().for_each(|x| x.rho = Some(0.05));
    f.w.iter_mut().for_each(|x| x.queued_s = 0.3);
    f.w[2].queued_s = 0.0;
    assert!((0..50).all(|e| aware().pick(&f, e) == Some(2)));
}

/// Four workers caching `cached` tokens of a `prompt`-token request at utilisation `rho`, worker
/// 1 the least busy by 0.3 s, each with its own replica-independent key.
fn four(prompt: u64, cached: u64, rho: f64) -> Fleet {
    let w = |q: f64| F {
        queued_s: q,
        cached,
        rho: Some(rho),
        ..W
    };
    let mut f = fleet(prompt, vec![w(0.3), w(0.0), w(0.3), w(0.3)]);
    f.keys = vec![11, 22, 33, 44];
    f
}

/// The picks of `f` over 64 prompts (first uncached pages) and 50 replicas' entropies each.
fn picks_by_prompt(f: &mut Fleet) -> Vec<std::collections::HashSet<usize>> {
    (0..64u64)
        .map(|prompt| {
            f.page_key = Some(mix(prompt));
            (0..50).map(|e| aware().pick(f, e).unwrap()).collect()
        })
        .collect()
}

#[test]
fn a_group_whose_questions_nobody_reuses_goes_to_the_least_busy_holder() {
    // A prefix group's 2,048 tokens on all four workers, a 128-token question; worker 1 is 0.3 s
    // less busy; ρ 0.95, where the home's price for 128 tokens (M · 128 · s) is 4.9 s.
    let mut f = four(2_176, 2_048, 0.95);
    f.tail = Some(true);
    let homes = picks_by_prompt(&mut f);
    assert!(homes.iter().all(|p| p.len() == 1), "a home per question");
    assert!(
        homes.iter().any(|p| !p.contains(&1)),
        "held on busier homes"
    );
    f.tail = Some(false);
    let picks = picks_by_prompt(&mut f);
    assert!(
        picks.iter().all(|p| p.len() == 1 && p.contains(&1)),
        "{picks:?}"
    );
}

#[test]
fn with_nothing_cached_a_prompt_someone_began_gets_a_home_and_one_nobody_shares_does_not() {
    let mut f = four(2_176, 0, 0.9);
    f.tail = Some(true);
    let homes = picks_by_prompt(&mut f);
    assert!(homes.iter().all(|p| p.len() == 1), "every replica agrees");
    let spread: std::collections::HashSet<usize> = homes.iter().flatten().copied().collect();
    assert_eq!(spread.len(), 4, "prefixes spread over the homes");
    f.tail = Some(false);
    for e in 0..50 {
        assert_eq!(aware().pick(&f, e), blind().pick(&f, e), "plain TTFT");
    }
}
