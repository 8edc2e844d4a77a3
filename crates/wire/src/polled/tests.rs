use super::*;
use crate::loads::{Include, LoadsMeta, render_json};

fn rank(r: i64, running: i64, waiting: i64) -> LoadSnapshot {
    LoadSnapshot {
        dp_rank: r,
        num_running_reqs: running,
        num_waiting_reqs: waiting,
        num_waiting_uncached_tokens: 700 * waiting,
        token_usage: Some(0.25),
        ..Default::default()
    }
}

#[test]
fn loads_json_round_trips_what_the_engine_renders() {
    let meta = LoadsMeta {
        timestamp: "2026-12-01T00:00:00.000Z",
        version: "x",
        accelerator: "simulated",
        num_accelerators: 2,
    };
    let snaps = [rank(1, 3, 4), rank(0, 1, 0)];
    let body = render_json(&meta, &snaps, Include::ALL).to_string();
    let got = loads_from_json(body.as_bytes()).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].dp_rank, 0);
    assert_eq!(got[1].num_waiting_reqs, 4);
    assert_eq!(got[1].num_waiting_uncached_tokens, 2800);
    assert_eq!(got[1].token_usage, Some(0.25));
}

#[test]
fn loads_json_ignores_unknown_fields_and_names_what_is_missing() {
    let ok = br#"{"loads":[{"dp_rank":0,"num_running_reqs":2,"num_waiting_reqs":1,"future_field":7,"memory":{"x":1}}]}"#;
    assert_eq!(loads_from_json(ok).unwrap()[0].num_running_reqs, 2);
    let missing = br#"{"loads":[{"dp_rank":0,"num_running_reqs":2}]}"#;
    let e = loads_from_json(missing).unwrap_err().to_string();
    assert!(
        e.contains("loads[0]") && e.contains("num_waiting_reqs"),
        "{e}"
    );
    let typed = br#"{"loads":[{"dp_rank":0,"num_running_reqs":"2","num_waiting_reqs":1}]}"#;
    let e = loads_from_json(typed).unwrap_err().to_string();
    assert!(e.contains("num_running_reqs"), "{e}");
    for (body, want) in [
        (&b"{}"[..], "missing \"loads\""),
        (b"{\"loads\":[]}", "empty"),
        (b"nope", "not JSON"),
    ] {
        let e = loads_from_json(body).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}

#[test]
fn vllm_metrics_page_with_counters_and_histograms() {
    let page = "\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0
vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 5.0
vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} 100.0
vllm:prompt_tokens_created{engine=\"0\",model_name=\"m\"} 1.7e9
";
    let (flavor, snaps) = loads_from_metrics(page).unwrap();
    assert_eq!(flavor, MetricsFlavor::Vllm);
    assert_eq!(snaps.len(), 2);
    assert_eq!(
        (snaps[0].num_running_reqs, snaps[0].num_waiting_reqs),
        (3, 5)
    );
    assert_eq!(snaps[0].token_usage, Some(0.5));
    assert_eq!((snaps[1].dp_rank, snaps[1].token_usage), (1, None));
}

#[test]
fn older_vllm_usage_name_and_sglang_names() {
    let old = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\n\
# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1\n\
# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.75\n";
    let (_, s) = loads_from_metrics(old).unwrap();
    assert_eq!((s[0].dp_rank, s[0].token_usage), (0, Some(0.75)));
    let sg = "# TYPE sglang:num_running_reqs gauge\n\
sglang:num_running_reqs{dp_rank=\"0\",tp_rank=\"0\"} 4\nsglang:num_running_reqs{dp_rank=\"0\",tp_rank=\"1\"} 4\n\
# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{dp_rank=\"0\",tp_rank=\"0\"} 9\n";
    let (flavor, s) = loads_from_metrics(sg).unwrap();
    assert_eq!(flavor, MetricsFlavor::Sglang);
    assert_eq!(
        (s.len(), s[0].num_running_reqs, s[0].num_waiting_reqs),
        (1, 4, 9)
    );
    let by_priority = "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 1\n\
# TYPE sglang:num_queue_reqs gauge\n\
sglang:num_queue_reqs{priority=\"0\",tp_rank=\"0\"} 2\nsglang:num_queue_reqs{priority=\"0\",tp_rank=\"1\"} 2\n\
sglang:num_queue_reqs{priority=\"1\",tp_rank=\"0\"} 3\n";
    let (_, s) = loads_from_metrics(by_priority).unwrap();
    assert_eq!(
        s[0].num_waiting_reqs, 5,
        "priorities add, tensor ranks do not"
    );
}

#[test]
fn metrics_errors_name_what_is_missing() {
    let e = loads_from_metrics("# TYPE up gauge\nup 1\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("vllm:num_requests_running"), "{e}");
    let no_wait =
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 2\n";
    let e = loads_from_metrics(no_wait).unwrap_err().to_string();
    assert!(e.contains("vllm:num_requests_waiting"), "{e}");
    let bad_rank =
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"x\"} 2\n";
    let e = loads_from_metrics(bad_rank).unwrap_err().to_string();
    assert!(e.contains("engine=\"x\""), "{e}");
}

#[test]
fn a_page_over_its_sample_budget_is_refused_before_it_is_parsed() {
    let mut page = String::new();
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting"] {
        page += &format!("# TYPE {name} gauge\n");
        for e in 0..10 {
            page += &format!("{name}{{engine=\"{e}\"}} 1\n");
        }
    }
    let (_, snaps) = loads_from_metrics_within(&page, 20).unwrap();
    assert_eq!(snaps.len(), 10, "20 samples fit a budget of 20");
    match loads_from_metrics_within(&page, 19) {
        Err(PolledError::OverBudget { samples, budget }) => {
            assert_eq!((samples, budget), (20, 19));
        }
        other => panic!("expected OverBudget, got {other:?}"),
    }
    // Other metrics on the page do not count against the budget.
    let noisy = format!("{page}# TYPE other gauge\nother{{a=\"1\"}} 1\nother{{a=\"2\"}} 1\n");
    assert!(loads_from_metrics_within(&noisy, 20).is_ok());
}
