//! What a real `loadlink engine` publishes reaches the router's utilisation meter and free-pool
//! figure, and `/workers` and `/metrics` show them: the engine's prefill busy time gives ρ (not
//! the slot fallback), its pool size and usage
//! the free pool; its KV-event stream gives the eviction regret (0: nothing evicted).

use loadlink_router::LoadSignal;
use loadlink_testkit::{complete_ok, publishing_engine, router, scrape, wait_for, worker_json};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_engine_shows_its_utilisation_free_pool_and_regret() {
    let (e, _) = publishing_engine(|c| c.model.max_total_tokens = 50_000).await;
    let r = router(vec![e.url()], LoadSignal::Backlog, |_| {}).await;
    let c = reqwest::Client::new();
    wait_for("the engine priced on its load", 15, || async {
        worker_json(&c, &r.url(), &e.url()).await["source"] == "engine"
    })
    .await;
    let prompt = "a prompt long enough to need a few prefill pages ".repeat(20);
    let body = json!({"prompt": prompt, "max_tokens": 32});
    // Work for the meter: requests until a window of at least a second has measured some.
    wait_for("a measured utilisation above 0", 30, || async {
        complete_ok(&c, &r.url(), &body).await;
        let w = worker_json(&c, &r.url(), &e.url()).await;
        w["ranks"][0]["utilisation"]
            .as_f64()
            .is_some_and(|u| u > 0.0)
    })
    .await;
    let w = worker_json(&c, &r.url(), &e.url()).await;
    let rank = &w["ranks"][0];
    let rho = rank["utilisation"].as_f64().unwrap();
    assert!(rho < 1.0, "{rho}");
    assert_eq!(rank["utilisation_source"], "prefill", "{rank}");
    assert_eq!(
        w["utilisation"].as_f64(),
        Some(rho),
        "one rank: the worker's is its own"
    );
    let free = rank["pool_free_tokens"]
        .as_u64()
        .expect("a pool size was reported");
    assert!(free <= 50_000, "{free}");
    assert_eq!(
        w["eviction_regret"].as_f64(),
        Some(0.0),
        "{}",
        w["kv_events"]
    );
    let page = scrape(&c, &r.url()).await;
    let gauge = page.value(
        "loadlink_rank_utilisation",
        &[("worker", &e.url()), ("rank", "0")],
    );
    assert!(gauge.is_some_and(|g| (0.0..1.0).contains(&g)), "{gauge:?}");
    let regret = page.value(
        "loadlink_rank_eviction_regret",
        &[("worker", &e.url()), ("rank", "0")],
    );
    assert_eq!(regret, Some(0.0));
    r.stop().await;
    e.stop().await;
}
