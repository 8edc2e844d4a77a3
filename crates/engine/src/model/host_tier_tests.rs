//! The host tier inside the scheduler model: demotion, load-back and host eviction announced in
//! an order a subscriber can follow, and a load-back priced at the copy time.

use super::*;
use crate::host_tier::HostTierConfig;
use crate::radix::PageChain;
use loadlink_wire::kv_events::KvEvent;

const PAGE: usize = 4;
const RATE: f64 = 50_000.0;

fn cfg(host_tokens: u64) -> ModelConfig {
    ModelConfig {
        page_size: PAGE,
        max_total_tokens: 64,
        new_token_ratio: 0.0,
        host_tier: HostTierConfig {
            tokens: host_tokens,
            load_tokens_per_s: RATE,
        },
        ..Default::default()
    }
}

fn prompt(base: u32) -> Arc<[u32]> {
    (base..base + 41).collect::<Vec<_>>().into()
}

/// Runs `s` until idle from `now`; returns (the end time, the duration of the first prefill).
fn run(s: &mut Scheduler, now: f64) -> (f64, f64) {
    let (mut now, mut first) = (now, None);
    loop {
        let st = s.step(now);
        match st.kind {
            StepKind::Idle => return (now, first.unwrap_or(0.0)),
            StepKind::Prefill => {
                first.get_or_insert(st.duration);
            }
            StepKind::Decode => {}
        }
        now += st.duration;
    }
}

fn medium(m: &Option<String>) -> &str {
    m.as_deref().unwrap_or("GPU")
}

/// Session A, then two other sessions that push A's pages off the device, then A again.
fn sessions(s: &mut Scheduler) -> f64 {
    let mut now = 0.0;
    for (id, base) in [(1, 1_000), (2, 2_000), (3, 3_000)] {
        s.submit(Submit::tokens(id, prompt(base), 1));
        now = run(s, now).0;
    }
    s.submit(Submit::tokens(4, prompt(1_000), 1));
    run(s, now).1
}

#[test]
fn evicted_pages_are_demoted_before_their_device_removal_and_loaded_back_in_order() {
    let mut s = Scheduler::with_kv_events(cfg(1_000));
    let a = PageChain::of(&prompt(1_000)[..40], PAGE).hashes;
    let mut now = 0.0;
    for (id, base) in [(1, 1_000), (2, 2_000), (3, 3_000)] {
        s.submit(Submit::tokens(id, prompt(base), 1));
        now = run(&mut s, now).0;
    }
    let events = s.take_kv_events();
    let (device, host) = s.tier_blocks();
    assert!(
        a.iter().all(|h| host.binary_search(h).is_ok()),
        "all of A demoted"
    );
    assert!(
        a.iter().any(|h| device.binary_search(h).is_err()),
        "A left the device"
    );
    // Every device removal of a page of A comes after that page's host copy was announced,
    // under a parent held at that point.
    let mut host_seen: std::collections::HashSet<i64> = Default::default();
    let mut device_held: std::collections::HashSet<i64> = Default::default();
    for e in &events {
        match e {
            KvEvent::Stored(st) if medium(&st.medium) == "CPU_PINNED" => {
                let p = st.parent_block_hash;
                assert!(p.is_none_or(|p| device_held.contains(&p) || host_seen.contains(&p)));
                host_seen.extend(&st.block_hashes);
            }
            KvEvent::Stored(st) => device_held.extend(&st.block_hashes),
            KvEvent::Removed(r) if medium(&r.medium) == "GPU" => {
                for h in &r.block_hashes {
                    assert!(
                        host_seen.contains(h),
                        "{h} removed from the device before demotion"
                    );
                    device_held.remove(h);
                }
            }
            _ => {}
        }
    }
    // A again: its device prefix is locked, the rest comes back from the host in one device
    // store under the last device page, in chain order.
    let device_hit = a
        .iter()
        .take_while(|h| device.binary_search(h).is_ok())
        .count();
    s.submit(Submit::tokens(4, prompt(1_000), 1));
    run(&mut s, now);
    let events = s.take_kv_events();
    let load = events
        .iter()
        .find_map(|e| match e {
            KvEvent::Stored(st) if medium(&st.medium) == "GPU" => Some(st),
            _ => None,
        })
        .expect("a load-back store");
    assert_eq!(
        load.parent_block_hash,
        device_hit.checked_sub(1).map(|i| a[i])
    );
    assert_eq!(
        load.block_hashes,
        a[device_hit..],
        "the rest of A, in order"
    );
    assert_eq!(
        s.cache_stats().loaded_back_tokens,
        ((a.len() - device_hit) * PAGE) as u64
    );
}

#[test]
fn a_load_back_costs_its_copy_time_instead_of_its_compute() {
    let with_host = sessions(&mut Scheduler::new(cfg(1_000)));
    let mut s = Scheduler::new(cfg(1_000));
    sessions(&mut s);
    let loaded = s.cache_stats().loaded_back_tokens as f64;
    assert!(loaded > 0.0);
    let miss = sessions(&mut Scheduler::new(cfg(0)));
    let t = Timing::default();
    let compute = loaded * (t.per_prefill_token_us + t.per_kv_token_us) / 1e6;
    let copy = loaded / RATE;
    assert!(
        (miss - with_host - (compute - copy)).abs() < 1e-9,
        "miss {miss} s, host hit {with_host} s: the difference is compute {compute} s - copy {copy} s"
    );
}

#[test]
fn a_small_host_pool_evicts_leaves_first_and_a_flush_clears_every_tier() {
    let mut s = Scheduler::with_kv_events(cfg(3 * PAGE as u64));
    let mut now = 0.0;
    for id in 0..6u64 {
        s.submit(Submit::tokens(id, prompt(1_000 * (id as u32 + 1)), 1));
        now = run(&mut s, now).0;
    }
    let (_, host) = s.tier_blocks();
    assert_eq!(host.len(), 3, "the pool holds three pages");
    let events = s.take_kv_events();
    let host_removed: Vec<i64> = events
        .iter()
        .filter_map(|e| match e {
            KvEvent::Removed(r) if medium(&r.medium) == "CPU_PINNED" => {
                Some(r.block_hashes.clone())
            }
            _ => None,
        })
        .flatten()
        .collect();
    assert!(!host_removed.is_empty(), "host evictions announced");
    s.flush_cache();
    assert_eq!(s.tier_blocks(), (vec![], vec![]));
    assert_eq!(s.take_kv_events().last(), Some(&KvEvent::AllCleared));
}
