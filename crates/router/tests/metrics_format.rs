//! The router's `/metrics` page, scraped from a running router with workers on engine load and on
//! fallback, must parse under the strict `loadlink_wire::prom::parse` (one `# TYPE` per family, no
//! interleaved samples, histograms well-formed) and carry the values the book holds.

use loadlink_publish::free_port_block;
use loadlink_router::LoadSignal;
use loadlink_testkit::{complete_ok, http_worker, router, scrape, wait_for, worker_json};
use loadlink_wire::LoadSnapshot;
use loadlink_wire::codec::snapshot_bytes;
use loadlink_wire::frame::seq_frame;
use loadlink_wire::prom::MetricType;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Publishes `waiting` queued requests on `port` every 20 ms, plus one two-frame (malformed)
/// message each time, until `stop` is set.
fn publish(port: u16, waiting: i64, stop: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let ctx = zmq::Context::new();
        let pub_ = ctx.socket(zmq::PUB).unwrap();
        pub_.bind(&format!("tcp://*:{port}")).unwrap();
        let load = snapshot_bytes(&LoadSnapshot {
            num_waiting_reqs: waiting,
            ..Default::default()
        });
        let mut seq = 0i64;
        while !stop.load(Ordering::Relaxed) {
            seq += 1;
            let s = seq_frame(seq);
            let _ = pub_.send_multipart([&b""[..], &s, &load], zmq::DONTWAIT);
            let _ = pub_.send_multipart([&b""[..], &load], zmq::DONTWAIT);
            std::thread::sleep(Duration::from_millis(20));
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_page_is_strict_prometheus_with_the_books_values() {
    let (p1, p2) = (free_port_block(1).unwrap(), free_port_block(1).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    publish(p1, 3, stop.clone());
    publish(p2, 5, stop.clone());
    let engine_a = http_worker(Some(p1)).await;
    let engine_b = http_worker(Some(p2)).await;
    let fallback = http_worker(None).await;
    let urls = vec![engine_a.clone(), engine_b.clone(), fallback.clone()];
    let r = router(urls, LoadSignal::Engine, |_| {}).await;
    let c = reqwest::Client::new();
    for w in [&engine_a, &engine_b] {
        wait_for("both engines priced on engine load", 15, || async {
            worker_json(&c, &r.url(), w).await["source"] == "engine"
        })
        .await;
    }
    complete_ok(&c, &r.url(), &json!({"prompt": "x"})).await;
    let m = scrape(&c, &r.url()).await;
    stop.store(true, Ordering::Relaxed);

    assert_eq!(m.value("loadlink_router_decisions_total", &[]), Some(1.0));
    assert_eq!(
        m.value("loadlink_router_responses_total", &[("class", "2xx")]),
        Some(1.0)
    );
    let hist = m
        .family("loadlink_router_upstream_headers_seconds")
        .unwrap();
    assert_eq!(hist.ty, MetricType::Histogram);
    assert_eq!(
        m.value("loadlink_router_upstream_headers_seconds_count", &[]),
        Some(1.0)
    );

    let priced = |w: &str| m.value("loadlink_worker_engine_priced", &[("worker", w)]);
    assert_eq!(priced(&engine_a), Some(1.0));
    assert_eq!(priced(&engine_b), Some(1.0));
    assert_eq!(priced(&fallback), Some(0.0));
    let load =
        |w: &str, src: &str| m.value("loadlink_worker_load", &[("worker", w), ("source", src)]);
    assert!(load(&engine_a, "engine").unwrap() >= 3.0);
    assert!(load(&engine_b, "engine").unwrap() >= 5.0);
    assert!(load(&fallback, "fallback").is_some());
    assert!(
        m.value("loadlink_worker_load_age_seconds", &[("worker", &fallback)])
            .unwrap()
            .is_nan(),
        "a worker that never reported has no age"
    );
    let requests: f64 = m
        .samples("loadlink_worker_requests_total")
        .map(|s| s.value)
        .sum();
    assert_eq!(requests, 1.0);

    let rank_msgs = |w: &str| {
        m.value(
            "loadlink_rank_messages_total",
            &[("worker", w), ("rank", "0")],
        )
    };
    assert!(rank_msgs(&engine_a).unwrap() >= 1.0);
    assert_eq!(
        m.samples("loadlink_rank_messages_total").count(),
        2,
        "one series per rank of a worker with a load range"
    );
    let dropped = |w: &str, reason: &str| {
        m.value(
            "loadlink_frames_dropped_total",
            &[("worker", w), ("reason", reason)],
        )
    };
    assert!(dropped(&engine_a, "frame_count").unwrap() >= 1.0);
    assert_eq!(dropped(&engine_a, "payload"), Some(0.0));
    assert_eq!(dropped(&fallback, "frame_count"), Some(0.0));
    r.stop().await;
}
