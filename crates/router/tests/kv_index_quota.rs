//! The per-rank KV-index quota against a real engine on loopback: a rank whose engine caches more
//! blocks than `Budgets::index_blocks_per_rank` stops being indexed, once, with the reason in
//! `/workers` and the `index_quota` refusal in `/metrics`; more traffic does not start a clear and
//! refill loop.

use loadlink_router::LoadSignal;
use loadlink_testkit::{
    complete_ok, engine_blocks, kv_engine, router, scrape, wait_for, worker_json,
};
use serde_json::json;

const PAGE: usize = 4;
const QUOTA: usize = 8;

async fn send(c: &reqwest::Client, url: &str, i: u32) {
    let ids: Vec<u32> = (0..40).map(|t| 1_000 + i * 100 + t).collect();
    complete_ok(c, url, &json!({"input_ids": ids, "max_tokens": 2})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_past_its_index_quota_is_dropped_once_with_the_reason_shown() {
    let e = kv_engine(|cfg| {
        cfg.time_scale = 50.0;
        cfg.model.page_size = PAGE;
    })
    .await;
    let url = e.engine.url();
    let r = router(vec![url.clone()], LoadSignal::Backlog, |cfg| {
        cfg.budgets.index_blocks_per_rank = QUOTA;
    })
    .await;
    let c = reqwest::Client::new();
    for i in 0..6 {
        send(&c, &url, i).await;
    }
    let held: usize = engine_blocks(&c, &url).await.iter().map(Vec::len).sum();
    assert!(
        held > QUOTA,
        "the engine caches {held} blocks, more than the quota"
    );
    wait_for("the rank over quota", 10, || async {
        let w = worker_json(&c, &r.url(), &url).await;
        w["kv_events"]["over_quota_ranks"] == json!([0])
    })
    .await;
    // More traffic, seen by the router: the rank stays unindexed, the refusal is counted once.
    let stored = || async {
        let m = scrape(&c, &r.url()).await;
        m.value("loadlink_kv_block_events_total", &[("type", "stored")])
            .unwrap_or(0.0)
    };
    let before = stored().await;
    for i in 6..12 {
        send(&c, &url, i).await;
    }
    wait_for("the later batches applied", 10, || async {
        stored().await > before
    })
    .await;
    let w = worker_json(&c, &r.url(), &url).await;
    let kv = &w["kv_events"];
    assert_eq!(kv["blocks"], json!(0), "{w}");
    assert_eq!(kv["rank_quota"], json!(QUOTA), "{w}");
    let reason = kv["not_indexed_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("approximate tree"), "{w}");
    assert_eq!(w["refusals"]["index_quota"], json!(1), "{w}");
    assert!(
        w["last_refusal"]
            .as_str()
            .unwrap_or_default()
            .starts_with("index_quota")
    );
    assert_eq!(r.state.cache.blocks(), 0);
    let m = scrape(&c, &r.url()).await;
    let refused = m.value("loadlink_peer_refusals_total", &[("reason", "index_quota")]);
    assert_eq!(refused, Some(1.0));
    r.stop().await;
    e.engine.stop().await;
}
