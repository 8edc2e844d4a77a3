//! `/metrics` is a well-formed Prometheus page (strict parser): SGLang's gauges per `dp_rank`, the
//! request counters and the publisher's outcomes per rank and sink, each family once.

use loadlink_testkit::{complete_ok, scrape, wait_until};
use loadlink_wire::prom::MetricType;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_page_parses_with_every_family_per_rank() {
    let e = loadlink_testkit::engine(|c| {
        c.dp_size = 2;
        c.time_scale = 20.0;
    })
    .await;
    let c = reqwest::Client::new();
    let body = serde_json::json!({"prompt": "abcdefgh", "max_tokens": 3});
    complete_ok(&c, &e.url(), &body).await;
    let page = wait_until("both ranks published", 10, || async {
        let page = scrape(&c, &e.url()).await;
        let published = |rank: &str| {
            page.value(
                "loadlink_publish_total",
                &[("rank", rank), ("sink", "shm"), ("outcome", "published")],
            )
            .unwrap_or(0.0)
        };
        let both = page.samples("sglang:num_running_reqs").count() == 2;
        if both && published("0") > 0.0 && published("1") > 0.0 {
            Ok(page)
        } else {
            Err(format!("{page:?}"))
        }
    })
    .await;
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
