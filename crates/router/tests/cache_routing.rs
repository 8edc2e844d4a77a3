//! Cache-aware routing end to end, on loopback with real engines: a cached prefix attracts its
//! request while the holder is not backed up, and stops attracting it when the holder's published
//! backlog makes the hit not worth waiting for; workers without KV events are priced from the
//! router's approximate tree of what it sent them.

use loadlink_engine::Engine;
use loadlink_router::policy::{MinTtft, Policy};
use loadlink_router::{LoadSignal, RouterHandle};
use loadlink_testkit::{complete_ok, router, wait_for, worker_json, worker_of};
use serde_json::json;

/// A prompt of about `tokens` tokens (4 characters each) that no other prompt shares.
fn prompt(tag: &str, tokens: usize) -> String {
    let unit = format!("{tag}-{}-", tag.len());
    unit.repeat(tokens * 4 / unit.len() + 1)
}

async fn min_ttft_router(urls: Vec<String>, poll: bool) -> RouterHandle {
    router(urls, LoadSignal::Backlog, |c| {
        c.policy = Policy::MinTtft(MinTtft::default());
        if !poll {
            c.load_poll_interval_ms = 0;
        }
    })
    .await
}

async fn send(c: &reqwest::Client, r: &RouterHandle, text: &str) -> String {
    let body = json!({ "prompt": text, "max_tokens": 2 });
    worker_of(&complete_ok(c, &r.url(), &body).await)
}

async fn kv_blocks(c: &reqwest::Client, r: &RouterHandle, worker: &str) -> u64 {
    worker_json(c, &r.url(), worker).await["kv_events"]["blocks"]
        .as_u64()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cached_prefix_attracts_its_request_until_the_holder_is_backed_up() {
    let (a, _) = loadlink_testkit::publishing_engine(|_| {}).await;
    let (b, _) = loadlink_testkit::publishing_engine(|_| {}).await;
    let r = min_ttft_router(vec![a.url(), b.url()], true).await;
    let c = reqwest::Client::new();
    wait_for("both KV streams are subscribed", 20, || async {
        let w = worker_json(&c, &r.url(), &a.url()).await;
        w["kv_events"].is_object()
            && worker_json(&c, &r.url(), &b.url()).await["kv_events"].is_object()
    })
    .await;

    // A client talks to A directly: only A's own KV events tell the router what A holds.
    let shared = prompt("system", 3000);
    complete_ok(&c, &a.url(), &json!({ "prompt": shared, "max_tokens": 1 })).await;
    wait_for("the router learns A's blocks", 20, || async {
        kv_blocks(&c, &r, &a.url()).await >= 150
    })
    .await;
    for i in 0..6 {
        let q = format!("{shared} question {i}");
        assert_eq!(
            send(&c, &r, &q).await,
            a.url(),
            "request {i} follows its cached prefix"
        );
    }
    let hit = worker_json(&c, &r.url(), &a.url()).await["routed"]["hit_rate"]
        .as_f64()
        .unwrap();
    assert!(hit > 0.9, "the router routed for hits: {hit}");

    // Direct clients bury A under prefill work no router sent.
    let flood: Vec<_> = (0..24)
        .map(|i| {
            let (c, url) = (c.clone(), a.url());
            tokio::spawn(async move {
                let body = json!({ "prompt": prompt(&format!("flood{i}"), 6000), "max_tokens": 1 });
                c.post(format!("{url}/v1/completions"))
                    .json(&body)
                    .send()
                    .await
            })
        })
        .collect();
    wait_for("A publishes its backlog", 20, || async {
        let w = worker_json(&c, &r.url(), &a.url()).await;
        w["ranks"][0]["waiting"].as_i64().unwrap_or(0) >= 10
    })
    .await;
    let q = format!("{shared} question after the flood");
    assert_eq!(
        send(&c, &r, &q).await,
        b.url(),
        "a 3000-token hit is not worth a queue of ~100k tokens"
    );
    for f in flood {
        let _ = f.await;
    }
    stop(r, [a, b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_without_kv_events_are_priced_from_what_the_router_sent() {
    let a = loadlink_testkit::engine(|_| {}).await;
    let b = loadlink_testkit::engine(|_| {}).await;
    // Neither load nor KV events: priced on this router's in-flight count and its tree. (With
    // polled load, a single client's sequential turns race the poll: the snapshot taken while
    // turn 0 ran still shows its backlog when turn 1 is priced.)
    let r = min_ttft_router(vec![a.url(), b.url()], false).await;
    let c = reqwest::Client::new();
    let w = worker_json(&c, &r.url(), &a.url()).await;
    assert!(
        w["kv_events"].is_null() && w["no_kv_events_reason"].is_string(),
        "{w}"
    );
    for tenant in ["alpha", "beta", "gamma"] {
        let system = prompt(tenant, 2000);
        let first = send(&c, &r, &format!("{system} q0")).await;
        for i in 1..5 {
            let got = send(&c, &r, &format!("{system} q{i}")).await;
            assert_eq!(
                got, first,
                "{tenant}: turn {i} goes where the prefix was sent"
            );
        }
    }
    let (mut cached, mut total) = (0, 0);
    for u in [a.url(), b.url()] {
        let routed = &worker_json(&c, &r.url(), &u).await["routed"];
        cached += routed["cached_tokens"].as_u64().unwrap();
        total += routed["prompt_tokens"].as_u64().unwrap();
    }
    // 4 of every 5 requests reuse a 2000-token prefix the tree remembers.
    assert!(
        cached * 10 > total * 7,
        "{cached} of {total} tokens believed cached"
    );
    stop(r, [a, b]).await;
}

async fn stop(r: RouterHandle, engines: [Engine; 2]) {
    r.stop().await;
    for e in engines {
        e.stop().await;
    }
}
