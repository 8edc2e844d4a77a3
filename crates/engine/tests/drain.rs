//! The engine's shutdown as a load balancer needs it: once a drain begins `/readiness` fails,
//! yet new connections and requests are still served for the drain delay.

use loadlink_testkit::drain::{readiness, serves_through_the_drain_delay};
use loadlink_testkit::engine;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_fails_while_requests_are_still_served_during_the_drain_delay() {
    let e = engine(|_| {}).await;
    let url = e.url();
    assert_eq!(readiness(&url).await, Some(200));
    // A delay far longer than the test needs: the assertions wait for states, not time.
    let drain = tokio::spawn(e.drain(Duration::from_secs(30), Duration::from_secs(5)));
    // A new connection with a new request is still answered.
    serves_through_the_drain_delay(&url, &drain).await;
    drain.abort();
}
