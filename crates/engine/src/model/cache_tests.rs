//! The prefix cache inside the scheduler model, against hand-computed expectations.

use super::*;
use crate::radix::PageChain;
use loadlink_wire::kv_events::{BlockRemoved, KvEvent};
use loadlink_wire::tokenize::OUTPUT_TOKEN;

fn cfg(page: usize, total: u64) -> ModelConfig {
    ModelConfig {
        page_size: page,
        max_total_tokens: total,
        new_token_ratio: 0.0,
        ..Default::default()
    }
}

fn ids(range: std::ops::Range<u32>) -> Arc<[u32]> {
    range.collect::<Vec<_>>().into()
}

/// Steps until idle; returns the virtual time reached (shared with the other model tests).
pub(super) fn drain(s: &mut Scheduler, mut now: f64) -> f64 {
    loop {
        let st = s.step(now);
        if st.kind == StepKind::Idle {
            return now;
        }
        now += st.duration;
    }
}

#[test]
fn multi_turn_hits_equal_the_hand_computed_pages() {
    // Page 4. Turn 1: 10 prompt tokens, 3 generated → the cache keeps the prompt and the first 2
    // outputs (the last has no KV yet): 12 tokens, 3 pages.
    let mut s = Scheduler::new(cfg(4, 10_000));
    let turn1 = ids(100..110);
    s.submit(Submit::tokens(1, turn1.clone(), 3));
    let now = drain(&mut s, 0.0);
    assert_eq!(s.cache_stats().cached_tokens, 12);
    assert_eq!(s.cache_totals(), (0, 10));
    // Turn 2 = turn 1 + its 3-token answer + 6 new tokens: 19 tokens. Its pages are hashed over
    // all but the last token (16 → 4 pages); the first 3 are cached, the 4th ([OUT, 50, 51, 52])
    // is not: 12 tokens hit, 7 computed.
    let mut turn2: Vec<u32> = turn1.to_vec();
    turn2.extend([OUTPUT_TOKEN; 3]);
    turn2.extend(50..56);
    s.submit(Submit::tokens(2, turn2.into(), 2));
    let queued = s.snapshot(0, 0.0);
    assert_eq!(queued.num_waiting_uncached_tokens, 7, "matched when queued");
    let before = s.snapshot(0, 0.0).total_prefill_uncached_tokens;
    drain(&mut s, now);
    let after = s.snapshot(0, 0.0);
    assert_eq!(
        after.total_prefill_uncached_tokens - before,
        7,
        "only uncached tokens prefill"
    );
    assert_eq!(s.cache_totals(), (12, 29));
    assert!((s.cache_hit_rate() - 12.0 / 29.0).abs() < 1e-12);
    // Turn 2 added its 4th page and the one after: 19 prompt + 1 output with KV = 20 tokens.
    assert_eq!(s.cache_stats().cached_tokens, 20);
    // Nothing runs, so nothing is locked: every cached token is evictable and none is "used".
    assert_eq!(after.num_used_tokens, 0);
}

#[test]
fn pressure_evicts_only_unlocked_lru_leaves_and_announces_exactly_them() {
    let mut s = Scheduler::with_kv_events(cfg(4, 40));
    let (a, b) = (ids(0..12), ids(100..112));
    for (id, p) in [(1, &a), (2, &b)] {
        s.submit(Submit::tokens(id, p.clone(), 1));
        drain(&mut s, 0.0);
    }
    assert_eq!(s.cache_stats().cached_tokens, 24);
    s.take_kv_events();
    // D extends b and keeps running: it locks b's 3 pages (12 tokens hit, 5 computed).
    let mut d = b.to_vec();
    d.extend(200..205);
    s.submit(Submit::tokens(3, d.clone().into(), 1000));
    s.step(0.0);
    assert_eq!(s.num_running(), 1);
    assert_eq!(s.cache_totals().0, 12);
    // Prefilled and running on, D publishes its prompt's new full page at once (SGLang's
    // checkpoint), under b's last page; its 17th token stays its own.
    let chain_d = PageChain::of(&d[..16], 4);
    let [KvEvent::Stored(stored)] = &s.take_kv_events()[..] else {
        panic!("D's prompt is published after its prefill")
    };
    assert_eq!(stored.block_hashes, vec![chain_d.hashes[3]]);
    assert_eq!(stored.parent_block_hash, Some(chain_d.hashes[2]));
    assert_eq!(stored.token_ids, vec![200, 201, 202, 203]);
    // C needs 20 fresh tokens; free = 40 - 1 (D's own) - 28 (cached) = 11, so 9 more tokens must
    // go: a's pages, leaf first (12 tokens), never b's or D's page, which D holds.
    s.submit(Submit::tokens(4, ids(300..320), 1));
    s.step(0.1);
    let chain_a = PageChain::of(&a, 4);
    let events = s.take_kv_events();
    assert_eq!(
        events[0],
        KvEvent::Removed(BlockRemoved {
            block_hashes: vec![chain_a.hashes[2], chain_a.hashes[1], chain_a.hashes[0]],
            medium: Some("GPU".into()),
        })
    );
    // Then C, done at its first token, caches its 5 pages.
    let [_, KvEvent::Stored(c)] = &events[..] else {
        panic!("{events:?}")
    };
    assert_eq!(c.block_hashes, PageChain::of(&ids(300..320), 4).hashes);
    assert!(chain_d.hashes.iter().all(|h| s.cache.contains(*h)));
    assert!(s.used_tokens() <= 40);
}

#[test]
fn retraction_releases_the_lock_and_the_request_rematches() {
    // A pool too small for two growing requests that share a cached prefix.
    let mut s = Scheduler::new(ModelConfig {
        new_token_ratio: 0.0,
        ..cfg(4, 64)
    });
    let shared = ids(0..16);
    s.submit(Submit::tokens(1, shared.clone(), 1));
    drain(&mut s, 0.0);
    for id in [2, 3] {
        let mut p = shared.to_vec();
        p.extend(1000 * id as u32..1000 * id as u32 + 4);
        s.submit(Submit::tokens(id, p.into(), 40));
    }
    let now = drain(&mut s, 0.0);
    assert!(s.retractions() > 0, "the pool forced a retraction");
    assert!(s.is_idle() && now > 0.0);
    // Both finished; the retracted one re-matched the shared prefix when re-admitted.
    let (hit, prompt) = s.cache_totals();
    assert_eq!(prompt, 16 + 20 + 20, "a re-admission is not counted twice");
    assert_eq!(hit, 2 * 16);
    assert_eq!(s.used_tokens(), 0, "every lock released");
}

/// The published `num_waiting_uncached_tokens` against an independent account: the queue as
/// the test knows it (submitted, no first token yet) and, for each queued request, the pages a
/// mirror of the cache built from the KV events alone held when it was queued.
#[test]
fn published_uncached_tokens_match_an_account_kept_from_the_event_stream() {
    use std::collections::{HashMap, HashSet};
    let page = 8;
    let mut s = Scheduler::with_kv_events(ModelConfig {
        max_running_requests: 4,
        ..cfg(page, 1_000_000)
    });
    let mut mirror: HashSet<i64> = HashSet::new();
    let mut queued: HashMap<u64, u64> = HashMap::new(); // id -> uncached when queued
    let mut sessions: Vec<Vec<u32>> = (0..6)
        .map(|k| (k * 1000..k * 1000 + 40).collect())
        .collect();
    let (mut now, mut next_id, mut checks) = (0.0, 0u64, 0);
    for round in 0..40u32 {
        // Two sessions take a turn: their history plus the last answer plus a new message.
        for k in [round as usize % 6, (round as usize * 5 + 1) % 6] {
            let prompt: Arc<[u32]> = sessions[k].clone().into();
            let chain = PageChain::of(&prompt[..prompt.len() - 1], page);
            let hit = chain
                .hashes
                .iter()
                .take_while(|h| mirror.contains(h))
                .count();
            queued.insert(next_id, prompt.len() as u64 - (hit * page) as u64);
            s.submit(Submit::tokens(next_id, prompt, 3));
            sessions[k].extend([OUTPUT_TOKEN; 3]);
            sessions[k].extend(round * 7..round * 7 + 5);
            next_id += 1;
        }
        for _ in 0..3 {
            let expected: u64 = queued.values().sum();
            assert_eq!(
                s.snapshot(0, now).num_waiting_uncached_tokens as u64,
                expected
            );
            checks += 1;
            let st = s.step(now);
            now += st.duration;
            for e in &st.events {
                if let Event::FirstToken { id } = e {
                    queued.remove(id);
                }
            }
            for e in s.take_kv_events() {
                match e {
                    KvEvent::Stored(b) => mirror.extend(b.block_hashes),
                    KvEvent::Removed(b) => b.block_hashes.iter().for_each(|h| {
                        mirror.remove(h);
                    }),
                    KvEvent::AllCleared => mirror.clear(),
                }
            }
        }
    }
    assert!(
        checks >= 100 && s.cache_totals().0 > 0,
        "sessions really hit"
    );
}

#[test]
fn queued_match_sees_waiting_prompts_and_the_cache_takes_a_prompt_once_prefilled() {
    // Page 4. A 21-token prompt hashes 5 pages (all but its last token).
    let mut s = Scheduler::new(cfg(4, 10_000));
    let first = ids(0..21);
    s.submit(Submit::tokens(1, first.clone(), 5));
    // A follow-up sharing the first 9 tokens: its chain shares 2 full pages (8 tokens).
    let mut follow: Vec<u32> = first[..9].to_vec();
    follow.extend(500..520);
    let chain = PageChain::of(&follow[..follow.len() - 1], 4);
    let stranger = PageChain::of(&(900..940).collect::<Vec<u32>>(), 4);
    assert_eq!(s.queued_match(&chain), 8, "waiting: shared pages count");
    assert_eq!(s.prefix_cache().matched_tokens(&chain), 0, "not cached yet");
    assert_eq!(s.queued_match(&stranger), 0, "nothing shared");
    let st = s.step(0.0);
    assert_eq!(st.kind, StepKind::Prefill);
    assert_eq!(s.num_running(), 1);
    assert_eq!(s.queued_match(&chain), 8, "running: still counted");
    assert_eq!(
        s.prefix_cache().matched_tokens(&chain),
        8,
        "prefilled and running: published to the cache (SGLang's checkpoint)"
    );
    drain(&mut s, st.duration);
    assert_eq!(s.queued_match(&chain), 0, "finished: no longer queued");
    assert_eq!(s.prefix_cache().matched_tokens(&chain), 8, "now cached");
}

#[test]
fn a_running_request_reports_the_cached_prefix_it_was_admitted_with() {
    // Page 4: turn 1 caches its 10 prompt tokens and 2 outputs (12 tokens); turn 2 extends it and
    // is admitted with those 12 tokens cached, which it keeps reporting until it finishes.
    let mut s = Scheduler::new(cfg(4, 10_000));
    let turn1 = ids(100..110);
    s.submit(Submit::tokens(1, turn1.clone(), 3));
    let mut now = drain(&mut s, 0.0);
    assert_eq!(s.admitted_hit(1), None, "finished");
    let mut turn2: Vec<u32> = turn1.to_vec();
    turn2.extend([OUTPUT_TOKEN; 3]);
    turn2.extend(50..56);
    s.submit(Submit::tokens(2, turn2.into(), 4));
    assert_eq!(s.admitted_hit(2), None, "waiting, not admitted");
    let first = loop {
        let st = s.step(now);
        now += st.duration;
        if st.events.contains(&Event::FirstToken { id: 2 }) {
            break s.admitted_hit(2);
        }
        assert!(
            st.kind != StepKind::Idle,
            "turn 2 never got its first token"
        );
    };
    assert_eq!(first, Some(12));
    assert_eq!(s.admitted_hit(7), None, "never submitted");
    drain(&mut s, now);
    assert_eq!(s.admitted_hit(2), None);
}
