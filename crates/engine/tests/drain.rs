//! The engine's shutdown as a load balancer needs it: once a drain begins `/readiness` fails,
//! yet new connections and requests are still served for the drain delay.

use loadlink_testkit::{complete_ok, engine, wait_for};
use serde_json::json;
use std::time::Duration;

async fn readiness(url: &str) -> Option<u16> {
    // A fresh client per probe: each probe is a new connection, as a load balancer's is.
    let r = reqwest::Client::new()
        .get(format!("{url}/readiness"))
        .send()
        .await
        .ok()?;
    Some(r.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_fails_while_requests_are_still_served_during_the_drain_delay() {
    let e = engine(|_| {}).await;
    let url = e.url();
    assert_eq!(readiness(&url).await, Some(200));
    // A delay far longer than the test needs: the assertions wait for states, not time.
    let drain = tokio::spawn(e.drain(Duration::from_secs(30), Duration::from_secs(5)));
    wait_for("/readiness to answer 503", 10, || async {
        readiness(&url).await == Some(503)
    })
    .await;
    let fresh = reqwest::Client::new();
    let body = json!({"model": "m", "prompt": "still serving", "max_tokens": 2});
    complete_ok(&fresh, &url, &body).await;
    assert!(!drain.is_finished(), "the drain waits out its delay");
    drain.abort();
}
