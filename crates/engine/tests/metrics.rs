//! `/metrics` is a well-formed Prometheus page (strict parser): SGLang's gauges per `dp_rank`, the
//! request counters and the publisher's outcomes per rank and sink, each family once.

use loadlink_engine::{Engine, EngineConfig};
use loadlink_wire::prom::{MetricType, parse};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_page_parses_with_every_family_per_rank() {
    let e = Engine::start(EngineConfig {
        port: 0,
        dp_size: 2,
        time_scale: 20.0,
        ..EngineConfig::default()
    })
    .await
    .unwrap();
    let c = reqwest::Client::new();
    let body = serde_json::json!({"prompt": "abcdefgh", "max_tokens": 3});
    let r = c
        .post(format!("{}/v1/completions", e.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let page = loop {
        let text = c
            .get(format!("{}/metrics", e.url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let page = parse(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
        let published = |rank: &str| {
            page.value(
                "loadlink_publish_total",
                &[("rank", rank), ("sink", "shm"), ("outcome", "published")],
            )
            .unwrap_or(0.0)
        };
        let both = page.samples("sglang:num_running_reqs").count() == 2;
        if both && published("0") > 0.0 && published("1") > 0.0 {
            break page;
        }
        assert!(Instant::now() < deadline, "ranks never published:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for name in [
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:num_used_tokens",
        "sglang:token_usage",
        "sglang:gen_throughput",
        "sglang:cache_hit_rate",
        "sglang:utilization",
        "sglang:max_total_num_tokens",
    ] {
        let f = page
            .family(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(f.ty, MetricType::Gauge);
        for rank in ["0", "1"] {
            assert!(
                page.value(name, &[("dp_rank", rank), ("model_name", "loadlink-sim")])
                    .is_some(),
                "{name} dp_rank {rank}"
            );
        }
    }
    assert_eq!(page.value("loadlink_engine_requests_total", &[]), Some(1.0));
    assert_eq!(page.value("loadlink_engine_aborted_total", &[]), Some(0.0));
    assert!(page.value("loadlink_engine_open_requests", &[]).is_some());
    let publish = page.family("loadlink_publish_total").unwrap();
    assert_eq!(publish.ty, MetricType::Counter);
    assert_eq!(publish.samples.len(), 2 * 4, "2 ranks × shm × 4 outcomes");
    e.stop().await;
}
