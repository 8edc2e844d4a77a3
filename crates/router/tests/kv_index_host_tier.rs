//! The index against a simulated engine with a host tier (the engine's own scheduler model, no
//! mocks): sessions that return after other traffic has pushed them off the device, so pages are
//! demoted, evicted from the host, and loaded back. After every scheduler step the engine's
//! events are applied to the index, and the index must hold exactly the engine's pages per tier,
//! and price a returning session's prompt as the engine will: device tokens, then host tokens.

use loadlink_engine::host_tier::HostTierConfig;
use loadlink_engine::model::{ModelConfig, Scheduler, StepKind, Submit};
use loadlink_engine::radix::PageChain;
use loadlink_router::cache::{KvIndex, Tier, TierMatch};
use loadlink_wire::kv_events::KvEvent;
use std::sync::Arc;

const PAGE: usize = 4;

fn prompt(session: u32, turn: u32) -> Arc<[u32]> {
    // A session's turns share its first 24 tokens, then grow.
    let mut t: Vec<u32> = (0..24).map(|i| session * 10_000 + i).collect();
    t.extend((0..8 * (turn + 1)).map(|i| session * 10_000 + 1_000 + i));
    t.into()
}

fn sorted(mut v: Vec<i64>) -> Vec<i64> {
    v.sort_unstable();
    v
}

#[test]
fn the_index_holds_the_engines_pages_per_tier_through_demotion_and_load_back() {
    let mut s = Scheduler::with_kv_events(ModelConfig {
        page_size: PAGE,
        max_total_tokens: 160,
        new_token_ratio: 0.0,
        host_tier: HostTierConfig {
            tokens: 96,
            load_tokens_per_s: 100_000.0,
        },
        ..Default::default()
    });
    let mut ix = KvIndex::new(10_000);
    let (mut now, mut id) = (0.0, 0);
    let (mut host_hits, mut demotions, mut host_evictions) = (0, 0, 0);
    let mut out = Vec::new();
    for round in 0..6u32 {
        for session in 1..=5u32 {
            let p = prompt(session, round);
            // Before the request: the index's answer is what the engine is about to use.
            let chain = PageChain::of(&p[..p.len() - 1], PAGE).hashes;
            ix.match_tiers_into(&chain, &mut out);
            let (device, host) = s.tier_blocks();
            let on = |v: &Vec<i64>, h: &i64| v.binary_search(h).is_ok();
            let want_device = chain.iter().take_while(|h| on(&device, h)).count();
            let want_held = chain
                .iter()
                .take_while(|h| on(&device, h) || on(&host, h))
                .count();
            let got = out.first().copied().unwrap_or(TierMatch {
                slot: 0,
                held: 0,
                device: 0,
            });
            assert_eq!(
                (got.held as usize, got.device as usize),
                (want_held, want_device),
                "round {round} session {session}"
            );
            host_hits += usize::from(want_held > want_device);
            id += 1;
            s.submit(Submit::tokens(id, p, 2));
            loop {
                let st = s.step(now);
                for e in s.take_kv_events() {
                    match &e {
                        KvEvent::Stored(b) if b.medium.as_deref() == Some("CPU_PINNED") => {
                            demotions += 1
                        }
                        KvEvent::Removed(r) if r.medium.as_deref() == Some("CPU_PINNED") => {
                            host_evictions += 1
                        }
                        _ => {}
                    }
                    ix.apply(0, &e);
                }
                let (device, host) = s.tier_blocks();
                assert_eq!(sorted(ix.slot_blocks_on(0, Tier::Device)), device);
                assert_eq!(sorted(ix.slot_blocks_on(0, Tier::Host)), host);
                if st.kind == StepKind::Idle {
                    break;
                }
                now += st.duration;
            }
        }
    }
    assert!(
        demotions > 0 && host_evictions > 0 && host_hits > 0,
        "the run exercised the host tier: {demotions} demotions, {host_evictions} host evictions, \
         {host_hits} host hits"
    );
    assert_eq!(
        ix.slot_stats(0).orphaned_blocks,
        0,
        "every store chained onto a held parent"
    );
    assert!(s.cache_stats().loaded_back_tokens > 0);
}
