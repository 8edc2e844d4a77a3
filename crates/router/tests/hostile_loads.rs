//! Workers whose polled load pages lie, on loopback against a real router: absurd rank numbers,
//! a DP rank reporting alone, bodies over the poll budgets and polls that never finish. The
//! router must stay up, refuse what is beyond a budget with a reason `/workers` shows, and price
//! what is left on the engine's numbers.

use loadlink_router::{LoadSignal, RouterHandle};
use loadlink_testkit::polled_worker::{Answer, loads_body, polled_worker, vllm_metrics_body};
use loadlink_testkit::{router, wait_worker};
use serde_json::Value;

fn refused(w: &Value, reason: &str) -> u64 {
    w["refusals"][reason].as_u64().unwrap_or(0)
}

async fn polling_router(url: &str) -> RouterHandle {
    router(vec![url.to_string()], LoadSignal::Engine, |c| {
        c.load_poll_interval_ms = 20;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_naming_dp_rank_2_pow_40_is_refused_and_the_rest_is_priced() {
    let page = loads_body(&[(0, 2, 1), (1 << 40, 5, 5)]);
    let url = polled_worker("/v1/loads", move |_| Answer::Body(page.clone())).await;
    let r = polling_router(&url).await;
    let w = wait_worker(&r, &url, "rank 0 priced and the huge rank refused", |w| {
        w["source"] == "engine" && refused(w, "rank_out_of_range") > 0
    })
    .await;
    assert_eq!(w["load"], 3, "{w}");
    assert_eq!(w["ranks"].as_array().map(Vec::len), Some(1), "{w}");
    assert_eq!(w["ranks"][0]["rank"], 0, "{w}");
    let last = w["last_refusal"].as_str().unwrap_or_default();
    assert!(
        last.starts_with("rank_out_of_range")
            && last.contains("1099511627776")
            && last.contains("1024"),
        "names the rank and the bound: {w}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_dp_rank_running_alone_is_priced_on_its_engine_load() {
    let page = vllm_metrics_body(&[(3, 2, 1)]);
    let url = polled_worker("/metrics", move |_| Answer::Body(page.clone())).await;
    let r = polling_router(&url).await;
    let w = wait_worker(&r, &url, "the worker priced on engine load", |w| {
        w["source"] == "engine"
    })
    .await;
    assert_eq!(w["load"], 3, "{w}");
    assert_eq!(w["load_source"], "scrape_metrics", "{w}");
    assert_eq!(w["ranks"][0]["rank"], 3, "{w}");
    assert_eq!(w["ranks"].as_array().map(Vec::len), Some(1), "{w}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polls_over_the_body_or_time_budget_are_refused_on_the_worker() {
    let good = loads_body(&[(0, 1, 0)]);
    let big = format!("{good}{}", " ".repeat(8 << 10));
    // The probe (request 0) is answered; then the worker alternates huge bodies and stalls.
    let url = polled_worker("/v1/loads", move |n| match n {
        0 => Answer::Body(good.clone()),
        n if n % 2 == 1 => Answer::Body(big.clone()),
        _ => Answer::Stall,
    })
    .await;
    let r = router(vec![url.clone()], LoadSignal::Engine, |c| {
        c.load_poll_interval_ms = 20;
        c.load_poll_timeout_ms = 100;
        c.budgets.poll_body_bytes = 4 << 10;
    })
    .await;
    let w = wait_worker(&r, &url, "both refusals counted", |w| {
        refused(w, "body_too_large") > 0 && refused(w, "timed_out") > 0
    })
    .await;
    assert_eq!(w["source"], "fallback", "no usable poll: {w}");
    let c = reqwest::Client::new();
    let metrics = loadlink_testkit::scrape(&c, &r.url()).await;
    let fleet = |reason: &str| {
        metrics
            .value("loadlink_peer_refusals_total", &[("reason", reason)])
            .unwrap_or(0.0)
    };
    assert!(fleet("body_too_large") >= 1.0 && fleet("timed_out") >= 1.0);
}
