//! The drain a load balancer needs, checked the same way for the engine and the router: once a
//! drain begins `/readiness` fails, yet new connections and requests are still served while the
//! drain waits out its delay.

use crate::{complete_ok, wait_for};
use serde_json::json;
use tokio::task::JoinHandle;

/// `GET {url}/readiness`'s status (None when nothing answers), on a fresh connection each time,
/// as a load balancer's probe is.
pub async fn readiness(url: &str) -> Option<u16> {
    let c = reqwest::Client::new();
    let r = c.get(format!("{url}/readiness")).send().await.ok()?;
    Some(r.status().as_u16())
}

/// With `drain` started on the server at `url` (a delay far longer than the test needs: this
/// waits for states, not time): `/readiness` turns 503, a new client's completion is still
/// answered 200, and the drain is still waiting out its delay.
pub async fn serves_through_the_drain_delay<T>(url: &str, drain: &JoinHandle<T>) {
    wait_for("/readiness to answer 503", 10, || async {
        readiness(url).await == Some(503)
    })
    .await;
    let fresh = reqwest::Client::new();
    let body = json!({"model": "loadlink-sim", "prompt": "still serving", "max_tokens": 2});
    complete_ok(&fresh, url, &body).await;
    assert!(!drain.is_finished(), "the drain waits out its delay");
}
