//! Unit tests of [`super::PrefixCache`]: matching, eviction order and its events, flush.

use super::*;

fn toks(n: u32, salt: u32) -> Vec<u32> {
    (0..n).map(|i| i * 7 + salt).collect()
}

#[test]
fn insert_then_match_longest_prefix_and_events_chain() {
    let mut c = PrefixCache::new(4, true);
    let a = toks(10, 1); // two full pages + 2 tokens
    let ca = PageChain::of(&a, 4);
    assert_eq!(ca.hashes.len(), 2);
    assert_eq!(c.insert(&a, &ca), 8);
    let ev = c.take_events();
    let [KvEvent::Stored(s)] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert_eq!(s.block_hashes, ca.hashes);
    assert_eq!(s.parent_block_hash, None);
    assert_eq!(s.token_ids.len(), 8);
    // A longer request sharing the first page only.
    let mut b = a[..4].to_vec();
    b.extend(toks(8, 99));
    let cb = PageChain::of(&b, 4);
    assert_eq!(c.matched_tokens(&cb), 4);
    assert_eq!(c.insert(&b, &cb), 8);
    let ev = c.take_events();
    let [KvEvent::Stored(s)] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert_eq!(s.parent_block_hash, Some(ca.hashes[0]));
    assert_eq!(s.block_hashes, cb.hashes[1..]);
    assert_eq!(c.stats().cached_tokens, 16);
}

#[test]
fn eviction_takes_only_unlocked_lru_leaves_and_announces_them() {
    let mut c = PrefixCache::new(2, true);
    let (a, b, d) = (toks(4, 1), toks(4, 2), toks(4, 3));
    let (ca, cb, cd) = (
        PageChain::of(&a, 2),
        PageChain::of(&b, 2),
        PageChain::of(&d, 2),
    );
    c.insert(&a, &ca);
    c.insert(&b, &cb);
    c.insert(&d, &cd);
    c.take_events();
    let (lock_b, hit) = c.lock(&cb);
    assert_eq!(hit, 4);
    // Using a makes it the most recent; d is now the least recently used.
    let (lock_a, _) = c.lock(&ca);
    c.unlock(lock_a);
    // d's leaf goes first, then d's first page, which became a leaf.
    assert_eq!(c.evict(4), 4);
    let ev = c.take_events();
    assert_eq!(
        ev,
        vec![KvEvent::Removed(BlockRemoved {
            block_hashes: vec![cd.hashes[1], cd.hashes[0]],
            medium: Some("GPU".into())
        })]
    );
    // Everything evictable goes (a, leaf first); b stays while locked.
    assert_eq!(c.evict(u64::MAX), 4);
    assert!(ca.hashes.iter().all(|&h| !c.contains(h)));
    assert!(cb.hashes.iter().all(|&h| c.contains(h)));
    assert_eq!(c.stats().evictable_tokens, 0);
    c.unlock(lock_b);
    // Both of b's pages are evictable again (the first once its child is gone).
    assert_eq!(c.stats().evictable_tokens, 4);
    assert_eq!(c.stats().cached_tokens, 4);
    assert_eq!(c.evict(u64::MAX), 4);
    assert_eq!(
        c.stats(),
        CacheStats {
            pages_stored: 6,
            pages_removed: 6,
            ..Default::default()
        }
    );
}

#[test]
fn flush_of_an_unlocked_cache_is_all_cleared() {
    let mut c = PrefixCache::new(1, true);
    let a = toks(3, 5);
    c.insert(&a, &PageChain::of(&a, 1));
    c.take_events();
    c.flush();
    assert_eq!(c.take_events(), vec![KvEvent::AllCleared]);
    assert_eq!(
        c.stats(),
        CacheStats {
            pages_stored: 3,
            pages_removed: 3,
            ..Default::default()
        }
    );
}
