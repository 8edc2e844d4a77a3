//! The router's KV index against real engines on loopback: after churn with eviction, a forced
//! gap (recovered by replay, or past the replay buffer and recovered by a snapshot), an engine
//! restart and a flush, the index holds
//! exactly the blocks the engine's own cache holds (`GET /cache_blocks`), rank by rank.
//!
//! How a gap is forced: the router's KV subscription goes through a TCP relay (its
//! `/server_info` front advertises the relay's port; replay requests go straight to the engine).
//! The test cuts the relay, sends requests so the engine publishes batches the router cannot
//! see, and restores it: the next batch the router receives is past a gap.

use loadlink_router::LoadSignal;
use loadlink_router::RouterHandle;
use loadlink_testkit::{
    KvEngine, TcpRelay, complete_ok, engine, engine_blocks, kv_engine, kv_engine_config,
    kv_engine_then, router, scrape, server_info_front, wait_for, wait_index_matches, wait_until,
    worker_json,
};
use loadlink_wire::kv_events::page_hashes;
use serde_json::json;

const PAGE: usize = 4;

/// Prompt `i` of a workload with reuse: one of three 16-token system prompts, then 8–23 tokens
/// of its own.
fn prompt(i: u32) -> Vec<u32> {
    let tenant = i % 3;
    let mut p: Vec<u32> = (0..16).map(|t| 100 + tenant * 50 + t).collect();
    p.extend((0..8 + i % 16).map(|t| 10_000 + i * 40 + t));
    p
}

async fn send(c: &reqwest::Client, url: &str, i: u32) {
    let body = json!({"input_ids": prompt(i), "max_tokens": 2});
    complete_ok(c, url, &body).await;
}

/// A small pool (48 pages of 4 per rank), so a few dozen prompts evict.
async fn small_engine(dp: u32) -> KvEngine {
    kv_engine(|cfg| {
        cfg.dp_size = dp;
        cfg.time_scale = 50.0;
        cfg.model.page_size = PAGE;
        cfg.model.max_total_tokens = 192;
        cfg.model.max_running_requests = 4;
    })
    .await
}

async fn metric(c: &reqwest::Client, r: &RouterHandle, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape(c, &r.url())
        .await
        .value(name, labels)
        .unwrap_or_else(|| panic!("{name}{labels:?} missing"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_matches_the_engine_after_churn_with_eviction() {
    let e = small_engine(2).await;
    let url = e.engine.url();
    let r = router(vec![url.clone()], LoadSignal::Backlog, |_| {}).await;
    let c = reqwest::Client::new();
    for i in 0..60 {
        send(&c, &url, i).await;
    }
    let blocks = wait_index_matches(&c, &r, &url, &url).await;
    assert!(
        blocks.iter().all(|b| !b.is_empty()),
        "both ranks cache something"
    );
    assert!(metric(&c, &r, "loadlink_kv_events_total", &[("type", "removed")]).await > 0.0);
    // The request path's answer agrees with the engine's cache: the longest cached run of the
    // prompt's pages over the worker's ranks.
    let workers = r.state.fleet.workers();
    let fresh = engine_blocks(&c, &url).await;
    for i in [57, 58, 59, 3] {
        let chain = page_hashes(&prompt(i), PAGE);
        let want = fresh
            .iter()
            .map(|b| {
                chain
                    .iter()
                    .take_while(|h| b.binary_search(h).is_ok())
                    .count()
            })
            .max()
            .unwrap() as u64
            * PAGE as u64;
        let mut out = Vec::new();
        r.state.cache.cached_tokens(
            loadlink_router::candidate::Candidates::whole(&workers),
            &chain,
            PAGE as u64,
            &mut out,
        );
        assert_eq!(out, [want], "prompt {i}");
    }
    // A router that joins late gets the same view through the initial replay.
    let late = router(vec![url.clone()], LoadSignal::Backlog, |_| {}).await;
    wait_index_matches(&c, &late, &url, &url).await;
    let w = worker_json(&c, &late.url(), &url).await;
    let sum: usize = fresh.iter().map(Vec::len).sum();
    assert_eq!(w["kv_events"]["blocks"], json!(sum), "{w}");
    assert_eq!(w["kv_events"]["needs_resync"], json!(false));
    late.stop().await;
    r.stop().await;
    e.engine.stop().await;
}

/// An engine (replay buffer of `buffer_steps` batches) behind a relay, and a router subscribed
/// through it, already in sync.
async fn relayed(buffer_steps: u32) -> (KvEngine, TcpRelay, String, RouterHandle) {
    let tweak = |cfg: &mut loadlink_engine::EngineConfig| {
        cfg.time_scale = 50.0;
        cfg.model.page_size = PAGE;
    };
    let e = kv_engine_then(tweak, |cfg| {
        let mut kv: serde_json::Value =
            serde_json::from_str(cfg.kv_events_config.as_deref().unwrap_or("{}")).unwrap();
        kv["buffer_steps"] = json!(buffer_steps);
        cfg.kv_events_config = Some(kv.to_string());
    })
    .await;
    let c = reqwest::Client::new();
    let relay = TcpRelay::start(e.kv_port).await;
    let front = server_info_front(&c, &e.engine.url(), relay.port).await;
    let r = router(vec![front.clone()], LoadSignal::Backlog, |_| {}).await;
    for i in 0..5 {
        send(&c, &e.engine.url(), i).await;
    }
    wait_index_matches(&c, &r, &front, &e.engine.url()).await;
    (e, relay, front, r)
}

/// Cuts the relay, sends `missed` requests, restores it and sends requests until the router
/// reports one more gap than before.
async fn force_gap(
    c: &reqwest::Client,
    e: &KvEngine,
    relay: &TcpRelay,
    r: &RouterHandle,
    missed: u32,
) {
    let before = metric(c, r, "loadlink_kv_gaps_total", &[]).await;
    relay.cut();
    for i in 100..100 + missed {
        send(c, &e.engine.url(), i).await;
    }
    relay.restore();
    let mut i = 200;
    wait_until("a gap seen after the relay is restored", 20, || {
        i += 1;
        let n = i;
        async move {
            send(c, &e.engine.url(), n).await;
            match metric(c, r, "loadlink_kv_gaps_total", &[]).await {
                g if g > before => Ok(()),
                g => Err(format!("{g} gaps, {before} before the cut")),
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_gap_is_filled_by_replay() {
    let c = reqwest::Client::new();
    let (e, relay, front, r) = relayed(10_000).await;
    let replays = metric(&c, &r, "loadlink_kv_replays_succeeded_total", &[]).await;
    force_gap(&c, &e, &relay, &r, 6).await;
    wait_index_matches(&c, &r, &front, &e.engine.url()).await;
    wait_for("the gap's replay to end", 10, || async {
        metric(&c, &r, "loadlink_kv_replays_succeeded_total", &[]).await > replays
    })
    .await;
    // The replay covered the gap: nothing was cleared.
    for reason in ["restart", "gap_not_covered", "replay_failed", "no_replay"] {
        let n = metric(&c, &r, "loadlink_kv_resyncs_total", &[("reason", reason)]).await;
        assert_eq!(n, 0.0, "{reason}");
    }
    let w = worker_json(&c, &r.url(), &front).await;
    assert_eq!(w["kv_events"]["needs_resync"], json!(false), "{w}");
    assert!(w["kv_events"]["gaps"].as_u64().unwrap() >= 1, "{w}");
    r.stop().await;
    e.engine.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_the_replay_buffer_no_longer_holds_is_filled_by_a_snapshot() {
    let c = reqwest::Client::new();
    // The buffer holds the initial requests' batches but not the twenty requests the router
    // misses: the replay cannot cover the gap, the engine's snapshot must.
    let (e, relay, front, r) = relayed(12).await;
    let loaded = metric(&c, &r, "loadlink_kv_snapshots_loaded_total", &[]).await;
    force_gap(&c, &e, &relay, &r, 20).await;
    wait_for("the uncovered gap resynced", 10, || async {
        metric(
            &c,
            &r,
            "loadlink_kv_resyncs_total",
            &[("reason", "gap_not_covered")],
        )
        .await
            >= 1.0
    })
    .await;
    wait_index_matches(&c, &r, &front, &e.engine.url()).await;
    assert!(metric(&c, &r, "loadlink_kv_snapshots_loaded_total", &[]).await > loaded);
    let w = worker_json(&c, &r.url(), &front).await;
    assert_eq!(w["kv_events"]["needs_resync"], json!(false), "{w}");
    assert_eq!(w["kv_events"]["views"], json!(["complete"]), "{w}");
    r.stop().await;
    e.engine.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_follows_an_engine_restart() {
    let c = reqwest::Client::new();
    let http_port = loadlink_publish::free_port_block(1).unwrap();
    let base = loadlink_publish::free_port_block(3).unwrap();
    let start = || {
        engine(move |cfg| {
            cfg.port = http_port;
            cfg.time_scale = 50.0;
            cfg.model.page_size = PAGE;
            kv_engine_config(cfg, base);
        })
    };
    let first = start().await;
    let url = first.url();
    let r = router(vec![url.clone()], LoadSignal::Backlog, |_| {}).await;
    for i in 0..20 {
        send(&c, &url, i).await;
    }
    let before = wait_index_matches(&c, &r, &url, &url).await;
    first.stop().await;
    let second = start().await;
    for i in 500..503 {
        send(&c, &url, i).await;
    }
    let after = wait_index_matches(&c, &r, &url, &url).await;
    // Equal to the new engine's cache, so the old engine's pages it lacks are gone (the shared
    // system prompts come back under the same hashes).
    let gone = before[0]
        .iter()
        .filter(|h| after[0].binary_search(h).is_err())
        .count();
    assert!(
        gone > 0,
        "some of the old engine's blocks are not cached any more"
    );
    assert!(
        metric(
            &c,
            &r,
            "loadlink_kv_resyncs_total",
            &[("reason", "restart")]
        )
        .await
            >= 1.0
    );
    r.stop().await;
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_empties_the_rank_and_a_worker_without_kv_events_says_why() {
    let c = reqwest::Client::new();
    let e = small_engine(1).await;
    let url = e.engine.url();
    let plain = engine(|_| {}).await;
    let r = router(vec![url.clone(), plain.url()], LoadSignal::Backlog, |_| {}).await;
    for i in 0..6 {
        send(&c, &url, i).await;
    }
    let full = wait_index_matches(&c, &r, &url, &url).await;
    assert!(!full[0].is_empty());
    let flushed = c.post(format!("{url}/flush_cache")).send().await.unwrap();
    assert_eq!(flushed.status(), 200);
    wait_for("the flush applied", 10, || async {
        metric(&c, &r, "loadlink_kv_events_total", &[("type", "cleared")]).await >= 1.0
    })
    .await;
    let empty = wait_index_matches(&c, &r, &url, &url).await;
    assert!(empty[0].is_empty());
    assert_eq!(metric(&c, &r, "loadlink_kv_index_blocks", &[]).await, 0.0);
    let w = worker_json(&c, &r.url(), &plain.url()).await;
    assert_eq!(w["kv_events"], json!(null), "{w}");
    let why = w["no_kv_events_reason"].as_str().unwrap();
    assert!(why.contains("no KV events"), "{why}");
    r.stop().await;
    e.engine.stop().await;
    plain.stop().await;
}

/// A replay longer than the engine's ROUTER send high-water mark (1,000) loses its tail and its
/// end marker at the engine; the router continues it from the last batch it got, until every
/// block of a 5,000-batch buffer is indexed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_longer_than_the_engines_send_hwm_is_continued() {
    use loadlink_publish::{KvEventPublisher, KvPublisherConfig};
    use loadlink_wire::kv_events::{BlockStored, KvEvent, KvEventBatch};
    const BATCHES: u64 = 5_000;
    let base = loadlink_publish::free_port_block(2).unwrap();
    let ctx = zmq::Context::new();
    let mut cfg = KvPublisherConfig::new(format!("tcp://127.0.0.1:{base}"));
    cfg.replay_endpoint = Some(format!("tcp://127.0.0.1:{}", base + 1));
    let publisher = KvEventPublisher::bind(&ctx, cfg).unwrap();
    for i in 0..BATCHES as i64 {
        let stored = KvEvent::Stored(BlockStored {
            block_hashes: vec![2 * i + 1, 2 * i + 2],
            block_size: 4,
            ..Default::default()
        });
        let batch = KvEventBatch {
            ts: 1.0,
            events: vec![stored],
            attn_dp_rank: Some(0),
        };
        assert!(publisher.publish(batch), "the queue holds them all");
    }
    let stats = publisher.stats();
    wait_for("every batch published", 20, || {
        let n = stats.published.load(std::sync::atomic::Ordering::Relaxed);
        async move { n == BATCHES }
    })
    .await;
    let (book, fleet, d) = loadlink_testkit::bare_kv_fleet(base, 4);
    fleet.add("http://127.0.0.1:9", d);
    let b = book.clone();
    wait_for("every replayed block indexed", 20, || {
        let n = b.blocks();
        async move { n == 2 * BATCHES as usize }
    })
    .await;
    let c = &book.counters;
    assert_eq!(
        c.batches.load(std::sync::atomic::Ordering::Relaxed),
        BATCHES
    );
    tokio::task::spawn_blocking(move || fleet.remove("http://127.0.0.1:9"))
        .await
        .unwrap();
}

/// A replay endpoint that never answers: the replay fails after its timeout, the rank is cleared
/// and marked incomplete, and live batches are indexed from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_never_answers_fails_and_live_batches_still_count() {
    use loadlink_publish::{KvEventPublisher, KvPublisherConfig};
    use loadlink_router::cache::ResyncReason;
    use loadlink_wire::kv_events::{BlockStored, KvEvent, KvEventBatch};
    use std::sync::atomic::Ordering::Relaxed;
    // Two ports: the PUB, and a replay port nothing listens on.
    let base = loadlink_publish::free_port_block(2).unwrap();
    let ctx = zmq::Context::new();
    let publisher = KvEventPublisher::bind(
        &ctx,
        KvPublisherConfig::new(format!("tcp://127.0.0.1:{base}")),
    )
    .unwrap();
    let (book, fleet, d) = loadlink_testkit::bare_kv_fleet(base, 4);
    let w = fleet.add("http://127.0.0.1:9", d);
    let b = book.clone();
    wait_for("the initial replay to fail", 10, || {
        let n = b.counters.replays_failed.load(Relaxed);
        async move { n >= 1 }
    })
    .await;
    let failed = ResyncReason::ReplayFailed as usize;
    assert_eq!(book.counters.resyncs[failed].load(Relaxed), 1);
    let mut next = 0;
    let b = book.clone();
    wait_for("live batches indexed", 10, || {
        next += 1;
        let stored = KvEvent::Stored(BlockStored {
            block_hashes: vec![next],
            block_size: 4,
            ..Default::default()
        });
        publisher.publish(KvEventBatch {
            ts: 1.0,
            events: vec![stored],
            attn_dp_rank: None,
        });
        let n = b.blocks();
        async move { n >= 1 }
    })
    .await;
    let (view, _) = book.worker_json(&w);
    assert_eq!(view["needs_resync"], json!(true), "{view}");
    tokio::task::spawn_blocking(move || fleet.remove("http://127.0.0.1:9"))
        .await
        .unwrap();
}
