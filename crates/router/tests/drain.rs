//! The router's shutdown as a load balancer needs it: after the stop signal `/readiness` fails
//! at once, yet new connections and requests are still served for the drain delay; only then
//! does the listener close.

use loadlink_router::LoadSignal;
use loadlink_testkit::drain::{readiness, serves_through_the_drain_delay};
use loadlink_testkit::{engine, router, wait_for};
use std::time::Duration;

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
    // A new connection with a new request is still answered.
    serves_through_the_drain_delay(&url, &drain).await;
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
