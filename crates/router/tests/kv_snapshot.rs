//! A router's KV view recovered from engine snapshots, against real engines on loopback: a router
//! that joins after 10,000 requests, one that restarts under traffic, an engine restart, and a
//! publisher overflow. In each case the engine's replay buffer is far too short to replay its
//! history, so only the snapshot can bring the router's index to the engine's cache; the router's
//! view at the engine's seq (`GET /cache_blocks` reports both, read together) must equal it, and
//! `/workers` must call the view complete.

use loadlink_router::LoadSignal;
use loadlink_router::RouterHandle;
use loadlink_testkit::{
    KvEngine, complete_ok, engine, engine_cut, kv_engine_config, router, router_blocks, scrape,
    wait_until, worker_json,
};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

const PAGE: usize = 4;
/// Batches the engine's replay buffer keeps: a few requests' worth.
const BUFFER: u32 = 16;

/// Prompt `i`: one of 8 shared 16-token prefixes, then 4–19 tokens of its own, so the cache both
/// reuses and evicts.
fn prompt(i: u32) -> Vec<u32> {
    let tenant = i % 8;
    let mut p: Vec<u32> = (0..16).map(|t| 100 + tenant * 50 + t).collect();
    p.extend((0..4 + i % 16).map(|t| 10_000 + (i % 5_000) * 40 + t));
    p
}

async fn send(c: &reqwest::Client, url: &str, i: u32) {
    complete_ok(c, url, &json!({"input_ids": prompt(i), "max_tokens": 1})).await;
}

/// Sends requests `from..to` from `lanes` concurrent clients.
async fn traffic(c: &reqwest::Client, url: &str, from: u32, to: u32, lanes: u32) {
    let next = Arc::new(AtomicU32::new(from));
    let mut tasks = Vec::new();
    for _ in 0..lanes {
        let (c, url, next) = (c.clone(), url.to_string(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= to {
                    return;
                }
                send(&c, &url, i).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("a traffic lane");
    }
}

/// An engine with KV events, a `BUFFER`-batch replay buffer and a pool that evicts, on `base`
/// (`http_port` 0: any); `kv` adjusts its KV-events config.
async fn short_buffer_engine(
    http_port: u16,
    base: u16,
    kv: impl Fn(&mut serde_json::Value),
) -> KvEngine {
    let engine = engine(|cfg| {
        cfg.port = http_port;
        cfg.time_scale = 200.0;
        cfg.model.page_size = PAGE;
        cfg.model.max_total_tokens = 2_048;
        cfg.model.max_running_requests = 8;
        kv_engine_config(cfg, base);
        let mut v: serde_json::Value =
            serde_json::from_str(cfg.kv_events_config.as_deref().expect("a KV config"))
                .expect("KV config JSON");
        v["buffer_steps"] = json!(BUFFER);
        kv(&mut v);
        cfg.kv_events_config = Some(v.to_string());
    })
    .await;
    KvEngine {
        engine,
        kv_port: base,
        replay_port: base + 2,
    }
}

fn free_base() -> u16 {
    loadlink_publish::free_port_block(3).expect("a free port block")
}

async fn metric(c: &reqwest::Client, r: &RouterHandle, name: &str) -> f64 {
    scrape(c, &r.url())
        .await
        .value(name, &[])
        .unwrap_or_else(|| panic!("{name} missing"))
}

/// Waits (bounded) until the router has applied rank 0 exactly up to the engine's seq and its
/// index equals the engine's cache read with that seq; returns the seq.
async fn wait_view_at_engine_seq(c: &reqwest::Client, r: &RouterHandle, url: &str) -> i64 {
    wait_until(
        "the router's view at the engine's seq to equal its cache",
        20,
        || async {
            let cut = engine_cut(c, url).await;
            let (seq, blocks) = &cut[0];
            let w = worker_json(c, &r.url(), url).await;
            let applied = w["kv_events"]["last_seq"][0].as_i64();
            let mine = router_blocks(r, url, 1).remove(0);
            if applied == Some(*seq) && mine.as_ref() == Some(blocks) {
                Ok(*seq)
            } else {
                Err(format!(
                    "engine at seq {seq} with {} blocks; router at {applied:?} with {:?}",
                    blocks.len(),
                    mine.map(|b| b.len())
                ))
            }
        },
    )
    .await
}

async fn assert_complete(c: &reqwest::Client, r: &RouterHandle, url: &str) {
    let kv = &worker_json(c, &r.url(), url).await["kv_events"];
    assert_eq!(kv["views"], json!(["complete"]), "{kv}");
    assert_eq!(kv["needs_resync"], json!(false), "{kv}");
    assert_eq!(kv["not_indexed_reason"], json!(null), "{kv}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_router_that_joins_after_10000_requests_indexes_exactly_the_engines_cache() {
    let c = reqwest::Client::new();
    let e = short_buffer_engine(0, free_base(), |_| {}).await;
    let url = e.engine.url();
    traffic(&c, &url, 0, 10_000, 8).await;
    let before = engine_cut(&c, &url).await;
    assert!(
        before[0].0 > i64::from(BUFFER) * 10,
        "far more batches than the buffer holds"
    );
    let r = router(vec![url.clone()], LoadSignal::Backlog, |_| {}).await;
    let seq = wait_view_at_engine_seq(&c, &r, &url).await;
    assert!(seq >= before[0].0);
    assert_complete(&c, &r, &url).await;
    assert!(metric(&c, &r, "loadlink_kv_snapshots_loaded_total").await >= 1.0);
    assert!(metric(&c, &r, "loadlink_kv_snapshot_blocks_total").await >= before[0].1.len() as f64);
    assert_eq!(
        metric(&c, &r, "loadlink_kv_snapshots_failed_total").await,
        0.0
    );
    r.stop().await;
    e.engine.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_router_restarted_under_traffic_catches_up_from_a_snapshot() {
    let c = reqwest::Client::new();
    let e = short_buffer_engine(0, free_base(), |_| {}).await;
    let url = e.engine.url();
    let running = Arc::new(AtomicBool::new(true));
    let bg = {
        let (c, url, running) = (c.clone(), url.clone(), running.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while running.load(Ordering::Relaxed) {
                send(&c, &url, i).await;
                i += 1;
            }
            i
        })
    };
    let first = router(vec![url.clone()], LoadSignal::Backlog, |_| {}).await;
    wait_until("the first router to load a snapshot", 20, || async {
        match metric(&c, &first, "loadlink_kv_snapshots_loaded_total").await {
            n if n >= 1.0 => Ok(()),
            n => Err(format!("{n} snapshots loaded")),
        }
    })
    .await;
    first.stop().await;
    traffic(&c, &url, 20_000, 20_300, 4).await; // while no router listens
    let second = router(vec![url.clone()], LoadSignal::Backlog, |_| {}).await;
    traffic(&c, &url, 30_000, 30_300, 4).await; // while it joins
    running.store(false, Ordering::Relaxed);
    let sent = bg.await.expect("the background traffic");
    assert!(sent > 0);
    wait_view_at_engine_seq(&c, &second, &url).await;
    assert_complete(&c, &second, &url).await;
    assert!(metric(&c, &second, "loadlink_kv_snapshots_loaded_total").await >= 1.0);
    second.stop().await;
    e.engine.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_engine_restart_is_recovered_from_the_new_engines_snapshot() {
    let c = reqwest::Client::new();
    let (http_port, base) = (
        loadlink_publish::free_port_block(1).expect("a free port"),
        free_base(),
    );
    let first = short_buffer_engine(http_port, base, |_| {}).await;
    let url = first.engine.url();
    let r = router(vec![url.clone()], LoadSignal::Backlog, |_| {}).await;
    traffic(&c, &url, 0, 200, 4).await;
    wait_view_at_engine_seq(&c, &r, &url).await;
    let epoch_before = worker_json(&c, &r.url(), &url).await["kv_events"]["epochs"][0].clone();
    first.engine.stop().await;
    let second = short_buffer_engine(http_port, base, |_| {}).await;
    // Many more batches than the buffer holds before the router can have reconnected.
    traffic(&c, &url, 1_000, 1_400, 8).await;
    wait_view_at_engine_seq(&c, &r, &url).await;
    assert_complete(&c, &r, &url).await;
    let epoch_after = worker_json(&c, &r.url(), &url).await["kv_events"]["epochs"][0].clone();
    assert!(
        epoch_after.as_u64() > epoch_before.as_u64(),
        "the new lifetime's epoch: {epoch_before} then {epoch_after}"
    );
    r.stop().await;
    second.engine.stop().await;
}

/// An engine with a host tier (HiCache): pages evicted from the device live on in the host pool.
/// A router that joins late gets both tiers from the snapshot: the same blocks as the engine, and
/// the same split between device and host.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_carries_the_host_tier() {
    let c = reqwest::Client::new();
    let engine = engine(|cfg| {
        cfg.time_scale = 200.0;
        cfg.model.page_size = PAGE;
        cfg.model.max_total_tokens = 512;
        cfg.model.max_running_requests = 4;
        cfg.model.host_tier.tokens = 4_096;
        kv_engine_config(cfg, free_base());
    })
    .await;
    let url = engine.url();
    traffic(&c, &url, 0, 300, 4).await;
    let r = router(vec![url.clone()], LoadSignal::Backlog, |_| {}).await;
    wait_view_at_engine_seq(&c, &r, &url).await;
    assert_complete(&c, &r, &url).await;
    let kv = worker_json(&c, &r.url(), &url).await["kv_events"].clone();
    let (device, host) = (
        kv["rank_tier_blocks"]["device"][0].as_u64().unwrap_or(0),
        kv["rank_tier_blocks"]["host"][0].as_u64().unwrap_or(0),
    );
    let info = loadlink_testkit::get_json(&c, &format!("{url}/cache_blocks")).await;
    let rank = &info["ranks"][0];
    let engine_device = rank["device_blocks"].as_array().map_or(0, Vec::len) as u64;
    let engine_host = rank["host_blocks"].as_array().map_or(0, Vec::len) as u64;
    assert!(engine_host > 0, "the pool evicted to the host tier: {rank}");
    assert_eq!((device, host), (engine_device, engine_host), "{kv}");
    // Its advertised load-back rate prices its host-tier hits.
    let w = r.state.fleet.workers()[0].clone();
    let rate = w
        .host_load_tokens_per_s
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(rate, 100_000, "the engine's default --hicache-load-rate");
    r.stop().await;
    engine.stop().await;
}

/// A real `KvEventPublisher` with a one-batch queue, fed in a tight loop so most batches are
/// dropped: each drop is a seq hole, no replay can fill it, and the snapshot (cut from the same
/// model cache the batches describe, under the same lock as the seqs) must.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_publisher_overflow_is_a_gap_a_snapshot_fills() {
    use loadlink_publish::{CacheCut, CutPage, KvEventPublisher, KvPublisherConfig};
    use loadlink_wire::kv_events::{BlockRemoved, BlockStored, KvEvent, KvEventBatch};
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::Ordering::Relaxed;

    let base = loadlink_publish::free_port_block(2).expect("free ports");
    let mut cfg = KvPublisherConfig::new(format!("tcp://*:{base}"));
    cfg.replay_endpoint = Some(format!("tcp://*:{}", base + 1));
    cfg.max_queue_size = 1;
    cfg.buffer_steps = BUFFER as usize;
    let ctx = zmq::Context::new();
    let publisher = Arc::new(KvEventPublisher::bind(&ctx, cfg).expect("bind"));
    // The model cache: block -> parent, changed and published under one lock.
    let cache: Arc<Mutex<BTreeMap<i64, Option<i64>>>> = Arc::default();
    let seq = publisher.seq();
    let (m, s) = (cache.clone(), seq.clone());
    publisher.set_snapshot_source(Arc::new(move || {
        let g = m.lock().ok()?;
        Some(CacheCut {
            replica_rank: 0,
            barrier_seq: s.last_assigned(),
            page_size: 4,
            pages: g
                .iter()
                .map(|(&hash, &parent)| CutPage {
                    hash,
                    parent,
                    medium: None,
                })
                .collect(),
        })
    }));
    // Step `i`: store a block under the previous one, and every third step evict the oldest leaf.
    let step = {
        let (cache, publisher) = (cache.clone(), publisher.clone());
        move |i: i64| {
            let mut g = cache.lock().expect("the model cache");
            let parent = (i > 0 && g.contains_key(&(i - 1))).then(|| i - 1);
            g.insert(i, parent);
            let mut events = vec![KvEvent::Stored(BlockStored {
                block_hashes: vec![i],
                parent_block_hash: parent,
                block_size: 4,
                ..Default::default()
            })];
            if i % 3 == 2 {
                let leaf = i - 2;
                if g.values().all(|p| *p != Some(leaf)) && g.remove(&leaf).is_some() {
                    events.push(KvEvent::Removed(BlockRemoved {
                        block_hashes: vec![leaf],
                        medium: None,
                    }));
                }
            }
            publisher.publish(KvEventBatch {
                ts: i as f64,
                events,
                attn_dp_rank: Some(0),
            })
        }
    };
    let (book, fleet, d) = loadlink_testkit::bare_kv_fleet(base, 4);
    fleet.add("http://127.0.0.1:9", d);
    let stats = publisher.stats();
    let mut i = 0;
    wait_until("the router's first snapshot", 20, || {
        step(i);
        i += 1;
        let n = book.counters.snapshots_loaded.load(Relaxed);
        async move {
            if n >= 1 {
                Ok(())
            } else {
                Err(format!("{n} loaded"))
            }
        }
    })
    .await;
    for _ in 0..20_000 {
        step(i);
        i += 1;
    }
    assert!(
        stats.dropped.load(Relaxed) > 0,
        "the burst overflowed the queue"
    );
    // Paced batches after the burst reveal the holes; the view must converge on the model.
    wait_until("the router's view to equal the model cache", 20, || {
        step(i);
        i += 1;
        std::thread::sleep(std::time::Duration::from_millis(2));
        let want: Vec<i64> = cache.lock().expect("model").keys().copied().collect();
        let mut mine = book
            .rank_blocks("http://127.0.0.1:9", 0)
            .unwrap_or_default();
        mine.sort_unstable();
        let last = seq.last_assigned();
        async move {
            if mine == want {
                Ok(())
            } else {
                Err(format!(
                    "model {} blocks at seq {last}, router {}",
                    want.len(),
                    mine.len()
                ))
            }
        }
    })
    .await;
    let c = &book.counters;
    assert!(c.gaps.load(Relaxed) >= 1);
    assert!(
        c.snapshots_loaded.load(Relaxed) >= 2,
        "the hole was filled by a snapshot"
    );
    tokio::task::spawn_blocking(move || fleet.remove("http://127.0.0.1:9"))
        .await
        .expect("remove");
}
