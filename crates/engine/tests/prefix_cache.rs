//! The engine's prefix cache over HTTP: a repeated prompt hits, the counters in `/metrics` say by
//! how much, and the KV-event stream (read back through the replay socket, so no slow-joiner
//! race) announces exactly the pages SGLang's hash chain names.

use loadlink_engine::tokenize::OUTPUT_TOKEN;
use loadlink_publish::free_port_block;
use loadlink_testkit::{KvEvents, complete_ok, engine, replay, scrape, wait_until};
use loadlink_wire::kv_events::{KvEvent, decode_kv_batch, page_hashes};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_prompt_hits_and_its_pages_are_announced_once() {
    let kv = free_port_block(3).unwrap(); // KV, then the load range, then replay
    let e = engine(|cfg| {
        cfg.kv_events_config = Some(KvEvents::zmq(kv).replay(kv + 2).json());
        cfg.time_scale = 20.0;
    })
    .await;
    let c = reqwest::Client::new();
    let prompt: Vec<u32> = (1000..1064).collect();
    for _ in 0..2 {
        let body = json!({"input_ids": prompt, "max_tokens": 2});
        complete_ok(&c, &e.url(), &body).await;
    }
    // Page 16: the first request computed 64 tokens; the second matched 3 pages (its pages are
    // hashed over all but its last token) and computed 16.
    let m = wait_until("the second request's hit counted", 10, || async {
        let m = scrape(&c, &e.url()).await;
        match m.value("loadlink_engine_prompt_tokens_total", &[("rank", "0")]) {
            Some(p) if p >= 128.0 => Ok(m),
            other => Err(format!("prompt tokens {other:?}")),
        }
    })
    .await;
    assert_eq!(
        m.value("loadlink_engine_cache_hit_tokens_total", &[("rank", "0")]),
        Some(48.0)
    );
    assert!(
        m.value("sglang:cache_hit_rate", &[("dp_rank", "0")])
            .unwrap()
            > 0.0
    );
    // The cache holds the prompt and the one output token with KV: 65 tokens, 4 full pages.
    let mut cached = prompt.clone();
    cached.push(OUTPUT_TOKEN);
    // The events are published on the engine's next cycle, which can come after the metrics.
    let stored = wait_until("the BlockStored published", 10, || async {
        let events: Vec<_> = replay(kv + 2, 0)
            .into_iter()
            .flat_map(|r| decode_kv_batch(&r.payload).unwrap().events)
            .collect();
        match events.len() {
            0 | 1 => Err(format!("{} KV events yet", events.len())),
            _ => Ok(events),
        }
    })
    .await;
    // The prompt's 3 full pages (its last token is never matched) are published once it is
    // prefilled, as SGLang's checkpoint does; the 4th page, closed by the output token, once it
    // finishes; the second request announces nothing new.
    let [KvEvent::Stored(at_prefill), KvEvent::Stored(at_finish)] = &stored[..] else {
        panic!("two BlockStored expected: {stored:?}")
    };
    let pages = page_hashes(&cached, 16);
    assert_eq!(at_prefill.block_hashes, pages[..3]);
    assert_eq!(
        (at_prefill.parent_block_hash, at_prefill.block_size),
        (None, 16)
    );
    assert_eq!(at_prefill.token_ids.len(), 48);
    assert_eq!(at_finish.block_hashes, pages[3..]);
    assert_eq!(at_finish.parent_block_hash, Some(pages[2]));
    assert_eq!(at_finish.token_ids.len(), 16);
    e.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_cache_empties_the_cache_so_a_repeated_prompt_misses() {
    let e = engine(|cfg| cfg.time_scale = 20.0).await;
    let c = reqwest::Client::new();
    let body = json!({"input_ids": (5000..5064).collect::<Vec<u32>>(), "max_tokens": 2});
    complete_ok(&c, &e.url(), &body).await;
    let flushed = c
        .post(format!("{}/flush_cache", e.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(flushed.status(), 200);
    // The flush is a rank command: wait until the cache is empty, then send the prompt again.
    wait_until("the cache emptied", 10, || async {
        let m = scrape(&c, &e.url()).await;
        match m.value("loadlink_engine_cached_tokens", &[("rank", "0")]) {
            Some(0.0) => Ok(()),
            other => Err(format!("cached tokens {other:?}")),
        }
    })
    .await;
    complete_ok(&c, &e.url(), &body).await;
    let m = scrape(&c, &e.url()).await;
    assert_eq!(
        m.value("loadlink_engine_cache_hit_tokens_total", &[("rank", "0")]),
        Some(0.0)
    );
    e.stop().await;
}
