//! The router's shutdown as a load balancer needs it: after the stop signal `/readiness` fails
//! at once, yet new connections and requests are still served for the drain delay; only then
//! does the listener close.

use loadlink_router::LoadSignal;
use loadlink_testkit::{complete_ok, engine, router, wait_for};
use serde_json::json;
use std::time::Duration;

async fn readiness(url: &str) -> Option<u16> {
    // A fresh client per probe: each probe is a new connection, as a load balancer's is.
    let c = reqwest::Client::new();
    let r = c.get(format!("{url}/readiness")).send().await.ok()?;
    Some(r.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_fails_while_requests_are_still_served_during_the_drain_delay() {
    let e = engine(|_| {}).await;
    let r = router(vec![e.url()], LoadSignal::Inflight, |_| {}).await;
    let url = r.url();
    wait_for("the router to be ready", 10, || async {
        readiness(&url).await == Some(200)
    })
    .await;

    // A delay far longer than the test needs: the assertions below wait for states, not time.
    let drain = tokio::spawn(r.drain(Duration::from_secs(30), Duration::from_secs(5)));
    wait_for("/readiness to answer 503", 10, || async {
        readiness(&url).await == Some(503)
    })
    .await;
    // A new connection with a new request is still routed and answered.
    let fresh = reqwest::Client::new();
    let body = json!({"model": "m", "prompt": "still serving", "max_tokens": 2});
    complete_ok(&fresh, &url, &body).await;
    assert!(!drain.is_finished(), "the drain waits out its delay");
    drain.abort();
    e.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_delay_the_listener_closes_and_the_drain_ends() {
    let e = engine(|_| {}).await;
    let r = router(vec![e.url()], LoadSignal::Inflight, |_| {}).await;
    let url = r.url();
    let finished = r
        .drain(Duration::from_millis(200), Duration::from_secs(5))
        .await;
    assert!(finished, "nothing was open, so the drain completes");
    let refused = reqwest::Client::new()
        .get(format!("{url}/health"))
        .send()
        .await;
    assert!(refused.is_err(), "the listener is closed: {refused:?}");
    e.stop().await;
}
