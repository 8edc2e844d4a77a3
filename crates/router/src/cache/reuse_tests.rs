use super::*;
use crate::policy::mix;

const BLOCK: u64 = 16;
const TAU: u64 = 60_000;

/// A page hash, spread over all 64 bits as the engines' are.
fn h(x: u64) -> i64 {
    mix(x.wrapping_add(0x1234)) as i64
}

/// `shared` pages of a common prefix, then `own` pages of the request's own.
fn chain(shared: u64, own: &[u64]) -> Vec<i64> {
    (0..shared)
        .map(h)
        .chain(own.iter().map(|&p| h(1_000_000 + p)))
        .collect()
}

#[test]
fn a_group_whose_questions_are_each_asked_once_stops_expecting_reuse() {
    let m = TailReuse::new(TAU);
    let deepest = 128 * BLOCK; // the group's 2,048-token prefix is cached
    let first = chain(128, &[1]);
    assert!(
        m.expects_reuse(&first, BLOCK, deepest, 0),
        "no evidence about the prefix yet: the price before the meter"
    );
    for q in 1..=5 {
        m.record(&chain(128, &[q]), BLOCK, deepest, q * 100);
    }
    assert!(!m.expects_reuse(&chain(128, &[6]), BLOCK, deepest, 600));
    // The evidence fades: three τ later it is below one new tail, no evidence again.
    assert!(m.expects_reuse(&chain(128, &[6]), BLOCK, deepest, 600 + 3 * TAU));
}

#[test]
fn a_tail_another_request_began_belongs_with_it_and_teaches_the_prefix() {
    let m = TailReuse::new(TAU);
    let deepest = 128 * BLOCK; // an agent kind's system prompt
    // Ten sessions' first turns, none of them indexed before its next turn comes.
    for s in 0..10 {
        m.record(&chain(128, &[s * 10]), BLOCK, deepest, s * 10);
    }
    assert!(
        !m.expects_reuse(&chain(128, &[500]), BLOCK, deepest, 100),
        "so far every tail under this prefix was new"
    );
    // Session 3's second turn extends its first turn's tail, which nobody has indexed yet.
    let second = chain(128, &[30, 31]);
    assert!(
        m.expects_reuse(&second, BLOCK, deepest, 200),
        "its tail was begun by turn 1"
    );
    m.record(&second, BLOCK, deepest, 200);
    assert!(
        m.expects_reuse(&chain(128, &[900]), BLOCK, deepest, 300),
        "tails under this prefix do get reused: a new session's first turn keeps its home"
    );
}

#[test]
fn with_nothing_cached_only_a_prompt_someone_began_has_a_home() {
    let m = TailReuse::new(TAU);
    let cold = chain(128, &[1]);
    assert!(
        !m.expects_reuse(&cold, BLOCK, 0, 0),
        "a prompt that shares nothing"
    );
    m.record(&cold, BLOCK, 0, 0);
    assert!(
        m.expects_reuse(&chain(128, &[2]), BLOCK, 0, 10),
        "the group's second request, before the first is indexed"
    );
    let whole = chain(2, &[]);
    assert!(
        !m.expects_reuse(&whole, BLOCK, 2 * BLOCK, 10),
        "all cached: no tail"
    );
}

#[test]
fn a_slot_held_by_a_key_in_use_refuses_the_newcomer_and_counts_it() {
    let m = TailReuse::new(TAU);
    let a = 7u64;
    let b = (1u64..)
        .map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .find(|&k| slot_of(k) == slot_of(a) && tag_of(k) != tag_of(a))
        .unwrap();
    m.add(a, 0);
    m.add(b, 0);
    assert_eq!(m.count(a, 0), 0.0, "a key seen once gives way");
    assert!((m.count(b, 0) - 1.0).abs() < 0.1);
    m.add(b, 0);
    m.add(a, 0);
    assert!((m.count(b, 0) - 2.0).abs() < 0.1, "a key in use stays");
    assert_eq!((m.count(a, 0), m.refused()), (0.0, 1));
    // One τ later a count has fallen to e⁻¹ of itself.
    assert!((m.count(b, TAU) - 2.0 / std::f64::consts::E).abs() < 0.05);
}

#[test]
fn a_prefix_others_branched_from_is_a_familys_and_a_session_context_is_its_own() {
    let m = TailReuse::new(TAU);
    let system = 128 * BLOCK; // an agent kind's system prompt, cached
    assert!(
        !m.branched(&chain(128, &[1]), BLOCK, system, 0),
        "nobody began a tail under it yet"
    );
    m.record(&chain(128, &[1]), BLOCK, system, 0); // session 1's first turn
    assert!(
        m.branched(&chain(128, &[2]), BLOCK, system, 10),
        "session 2's first turn starts under a prefix session 1 branched from"
    );
    // Session 1's second turn: its first turn is cached, and nobody else branched from there.
    let turn1 = 129 * BLOCK;
    assert!(!m.branched(&chain(128, &[1, 2, 3]), BLOCK, turn1, 20));
    assert!(
        m.branched(&chain(0, &[1]), BLOCK, 0, 20),
        "nothing cached: nothing private"
    );
    assert!(
        !m.branched(&chain(128, &[2]), BLOCK, system, 10 + 4 * TAU),
        "evidence fades"
    );
}
