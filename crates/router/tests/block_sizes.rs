//! Engines that page by different sizes behind one router: each worker's KV events name pages of
//! its own advertised `block_size`, and the router must hash every request at that size to find
//! them. A fleet of real engines at page sizes 1 (SGLang's default), 16 and 64, with the router's
//! own `--page-size` left at 16: a prefix cached on each of them attracts its repeats, and the
//! router believes them hits, on every one.

use loadlink_router::LoadSignal;
use loadlink_router::policy::{MinTtft, Policy};
use loadlink_testkit::{complete_ok, router, wait_for, worker_json, worker_of};
use serde_json::json;

/// A prompt of about `tokens` tokens (4 characters each) that no other prompt shares.
fn prompt(tag: &str, tokens: usize) -> String {
    let unit = format!("{tag}-{}-", tag.len());
    unit.repeat(tokens * 4 / unit.len() + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn engines_at_page_sizes_1_16_and_64_all_get_kv_index_hits() {
    let sizes = [1usize, 16, 64];
    let mut engines = Vec::new();
    for size in sizes {
        let (e, _) = loadlink_testkit::publishing_engine(|cfg| cfg.model.page_size = size).await;
        engines.push(e);
    }
    let urls: Vec<String> = engines.iter().map(|e| e.url()).collect();
    let r = router(urls.clone(), LoadSignal::Backlog, |c| {
        c.policy = Policy::MinTtft(MinTtft::default());
        c.load_poll_interval_ms = 0;
    })
    .await;
    let c = reqwest::Client::new();
    for (url, size) in urls.iter().zip(sizes) {
        wait_for("the KV stream is subscribed", 20, || async {
            worker_json(&c, &r.url(), url).await["kv_events"]["block_size"] == json!(size)
        })
        .await;
    }

    for (url, size) in urls.iter().zip(sizes) {
        // A client talks to the engine directly: only its KV events tell the router.
        let shared = prompt(&format!("tenant{size}"), 1200);
        complete_ok(&c, url, &json!({ "prompt": shared, "max_tokens": 1 })).await;
        // ... and has seen the engine idle again: a snapshot still showing the direct request's
        // prefill queued would price the holder as busy (a race a loaded CI machine lost).
        wait_for(
            "the router indexes the engine's pages and sees it idle",
            20,
            || async {
                let w = worker_json(&c, &r.url(), url).await;
                let rank = &w["ranks"][0];
                w["kv_events"]["blocks"].as_u64().unwrap_or(0) * size as u64 >= 1100
                    && rank["running"] == json!(0)
                    && rank["waiting"] == json!(0)
                    && rank["backlog_tokens"] == json!(0)
            },
        )
        .await;
        for i in 0..4 {
            let body = json!({ "prompt": format!("{shared} question {i}"), "max_tokens": 1 });
            let got = worker_of(&complete_ok(&c, &r.url(), &body).await);
            assert_eq!(
                &got, url,
                "page size {size}: request {i} follows its cached prefix"
            );
        }
        let routed = &worker_json(&c, &r.url(), url).await["routed"];
        let (cached, total) = (
            routed["cached_tokens"].as_u64().unwrap(),
            routed["prompt_tokens"].as_u64().unwrap(),
        );
        assert!(
            total > 0 && cached * 10 > total * 8,
            "page size {size}: the router believed {cached} of {total} routed tokens cached"
        );
    }
    r.stop().await;
    for e in engines {
        e.stop().await;
    }
}
