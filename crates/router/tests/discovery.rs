//! Discovery end to end: an engine that declines its load range says why in `/server_info`, and
//! the router's `/workers` carries that reason (the same text `loadlink watch` prints), while the
//! worker is still routed on in-flight.

use loadlink_publish::free_port_block;
use loadlink_router::LoadSignal;
use loadlink_testkit::{KvEvents, router, worker_json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_shows_the_engines_own_decline_reason() {
    // A concrete-host KV endpoint: the engine declines the load range and reports why.
    let kv_port = free_port_block(1).unwrap();
    let engine = loadlink_testkit::engine(|c| {
        c.kv_events_config = Some(KvEvents::endpoint(format!("tcp://127.0.0.1:{kv_port}")).json());
    })
    .await;
    // Polling off: the engine serves /v1/loads, which the router would otherwise poll.
    let r = router(vec![engine.url()], LoadSignal::Engine, |c| {
        c.load_poll_interval_ms = 0
    })
    .await;
    let c = reqwest::Client::new();
    let w = worker_json(&c, &r.url(), &engine.url()).await;
    assert_eq!(w["source"], "fallback");
    let reason = w["no_load_reason"].as_str().unwrap();
    assert!(
        reason.contains("does not report load") && reason.contains("wildcard"),
        "{reason}"
    );
    r.stop().await;
}
