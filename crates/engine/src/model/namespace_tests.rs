//! Cache namespaces inside the scheduler model: requests in different namespaces never share
//! cached pages, and every event names pages by SGLang's default-format hashes
//! ([`Namespace::event_hashes`]) with the adapter's name and the salt.

use super::*;
use crate::host_tier::HostTierConfig;
use loadlink_wire::kv_events::{BlockStored, KvEvent};
use loadlink_wire::kv_namespace::{LoraRef, Namespace};

const PAGE: usize = 4;

fn cfg(total: u64, host: u64) -> ModelConfig {
    ModelConfig {
        page_size: PAGE,
        max_total_tokens: total,
        new_token_ratio: 0.0,
        host_tier: HostTierConfig {
            tokens: host,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// 13 tokens: 3 full pages are cached after a one-token answer.
fn prompt(base: u32) -> Arc<[u32]> {
    (base..base + 13).collect::<Vec<_>>().into()
}

use super::cache_tests::drain;

fn lora(name: &str) -> LoraRef {
    LoraRef::from_path(name, &format!("/adapters/{name}"))
}

/// The namespaces the tests compare: plain, an `extra_key`, a salt, two adapters, an adapter
/// with a salt and an `extra_key`.
fn namespaces() -> Vec<Option<Arc<Namespace>>> {
    let ns = |extra_key: Option<&str>, cache_salt: Option<&str>, l: Option<LoraRef>| {
        Some(Arc::new(Namespace {
            extra_key: extra_key.map(Into::into),
            cache_salt: cache_salt.map(Into::into),
            lora: l,
        }))
    };
    vec![
        None,
        ns(Some("k"), None, None),
        ns(None, Some("s"), None),
        ns(None, None, Some(lora("a"))),
        ns(None, None, Some(lora("b"))),
        ns(Some("k"), Some("s"), Some(lora("a"))),
    ]
}

fn submit(id: u64, tokens: Arc<[u32]>, ns: &Option<Arc<Namespace>>) -> Submit {
    let s = Submit::tokens(id, tokens, 1);
    match ns {
        Some(n) => s.with_namespace(n.clone()),
        None => s,
    }
}

fn stored(events: &[KvEvent]) -> Vec<&BlockStored> {
    events
        .iter()
        .filter_map(|e| match e {
            KvEvent::Stored(s) => Some(s),
            _ => None,
        })
        .collect()
}

#[test]
fn namespaces_never_share_pages_and_each_hits_its_own() {
    let mut s = Scheduler::new(cfg(100_000, 0));
    let mut now = 0.0;
    let all = namespaces();
    for (i, ns) in all.iter().enumerate() {
        let before = s.cache_totals().0;
        s.submit(submit(i as u64, prompt(7), ns));
        now = drain(&mut s, now);
        assert_eq!(
            s.cache_totals().0,
            before,
            "namespace {i} hit another's pages"
        );
    }
    assert_eq!(s.cache_stats().cached_tokens, (all.len() * 3 * PAGE) as u64);
    for (i, ns) in all.iter().enumerate() {
        let before = s.cache_totals().0;
        s.submit(submit(100 + i as u64, prompt(7), ns));
        now = drain(&mut s, now);
        assert_eq!(
            s.cache_totals().0 - before,
            12,
            "namespace {i} hits its own 3 pages"
        );
    }
}

#[test]
fn stored_events_carry_the_default_format_hashes_the_adapter_and_the_salt() {
    let mut s = Scheduler::with_kv_events(cfg(100_000, 0));
    let mut now = 0.0;
    for (i, ns) in namespaces().iter().enumerate() {
        s.submit(submit(i as u64, prompt(7), ns));
        now = drain(&mut s, now);
        let events = s.take_kv_events();
        let st = stored(&events);
        let [one] = st[..] else {
            panic!("namespace {i}: {events:?}")
        };
        let n = ns.as_deref().cloned().unwrap_or_default();
        assert_eq!(one.block_hashes, n.event_hashes(&prompt(7)[..12], PAGE));
        assert_eq!(one.parent_block_hash, None);
        assert_eq!(one.lora_name, n.lora.as_ref().map(|l| l.name.clone()));
        assert_eq!(one.cache_salt, n.cache_salt);
        assert_eq!(one.lora_id, None);
    }
    // An extra_key alone publishes the plain hashes (the engine still keeps the pages apart),
    // and /cache_blocks lists each published hash once.
    let plain = Namespace::default().event_hashes(&prompt(7)[..12], PAGE);
    let listed = s.cached_blocks();
    assert!(plain.iter().all(|h| listed.contains(h)));
    assert_eq!(listed.len(), (namespaces().len() - 1) * 3);
}

#[test]
fn a_namespaced_continuation_chains_from_its_published_parent() {
    let mut s = Scheduler::with_kv_events(cfg(100_000, 0));
    let ns = Some(Arc::new(Namespace {
        cache_salt: Some("s".into()),
        lora: Some(lora("a")),
        ..Default::default()
    }));
    s.submit(submit(1, prompt(7), &ns));
    let now = drain(&mut s, 0.0);
    s.take_kv_events();
    let mut longer = prompt(7).to_vec();
    longer.extend(500..508);
    s.submit(submit(2, longer.clone().into(), &ns));
    drain(&mut s, now);
    let events = s.take_kv_events();
    let [one] = stored(&events)[..] else {
        panic!("{events:?}")
    };
    let all = ns.as_deref().unwrap().event_hashes(&longer[..20], PAGE);
    assert_eq!(one.parent_block_hash, Some(all[2]));
    assert_eq!(one.block_hashes, all[3..]);
}

#[test]
fn removals_demotions_and_cuts_name_pages_by_their_published_hashes() {
    // Room for 6 pages on the device: a second adapter's prompt pushes the first one's to the
    // host tier.
    let mut s = Scheduler::with_kv_events(cfg(24, 48));
    let a = Some(Arc::new(Namespace {
        lora: Some(lora("a")),
        ..Default::default()
    }));
    let b = Some(Arc::new(Namespace {
        lora: Some(lora("b")),
        ..Default::default()
    }));
    let mut now = 0.0;
    s.submit(submit(1, prompt(7), &a));
    now = drain(&mut s, now);
    s.submit(submit(2, prompt(100), &b));
    now = drain(&mut s, now);
    s.submit(submit(3, prompt(200), &b));
    drain(&mut s, now);
    let events = s.take_kv_events();
    let a_hashes = a.as_deref().unwrap().event_hashes(&prompt(7)[..12], PAGE);
    let removed: Vec<i64> = events
        .iter()
        .filter_map(|e| match e {
            KvEvent::Removed(r) if r.medium.as_deref() == Some("GPU") => {
                Some(r.block_hashes.clone())
            }
            _ => None,
        })
        .flatten()
        .collect();
    assert!(
        !removed.is_empty(),
        "pressure evicted something: {events:?}"
    );
    let published: Vec<i64> = stored(&events)
        .iter()
        .flat_map(|s| s.block_hashes.clone())
        .collect();
    assert!(
        removed.iter().all(|h| published.contains(h)),
        "removals name published hashes"
    );
    let demoted: Vec<&BlockStored> = stored(&events)
        .into_iter()
        .filter(|s| s.medium.as_deref() == Some(crate::host_tier::HOST_MEDIUM))
        .collect();
    assert!(!demoted.is_empty(), "{events:?}");
    for d in demoted {
        assert!(
            d.lora_name.is_some(),
            "a demoted adapter page names its adapter"
        );
        if d.lora_name.as_deref() == Some("a") {
            assert!(a_hashes.contains(&d.block_hashes[0]));
        }
    }
    // The snapshot cut and /cache_blocks name the same published hashes the events did.
    let cut: Vec<i64> = s
        .prefix_cache()
        .export_pages()
        .iter()
        .map(|p| p.hash)
        .collect();
    assert!(cut.iter().all(|h| published.contains(h)), "{cut:?}");
    assert!(s.cached_blocks().iter().all(|h| published.contains(h)));
}
