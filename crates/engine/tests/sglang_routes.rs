//! The two SGLang routes `sglang-router` reads from a worker besides `/server_info`: `/model_info`
//! (when the worker registers) and `/get_load` (its load monitor, for power-of-two and DP-minimum
//! tokens). Shapes as SGLang serves them; the Python interop suite runs the real router on them.

use loadlink_testkit::{complete_ok, get_json, wait_until};
use serde_json::{Value, json};
use std::collections::BTreeSet;

const WAIT_SECS: u64 = 15;

/// The keys of SGLang 0.5.23's `/model_info` (`entrypoints/http_server.py`, non-embedding model).
const MODEL_INFO_KEYS: [&str; 14] = [
    "model_path",
    "served_model_name",
    "tokenizer_path",
    "is_generation",
    "preferred_sampling_params",
    "weight_version",
    "load_format",
    "reasoning_parser",
    "tool_call_parser",
    "disaggregation_mode",
    "has_image_understanding",
    "has_audio_understanding",
    "model_type",
    "architectures",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_info_has_sglangs_keys_and_names_the_served_model() {
    let e = loadlink_testkit::engine(|c| c.model_name = "sim-7b".into()).await;
    let c = reqwest::Client::new();
    let v = get_json(&c, &format!("{}/model_info", e.url())).await;
    let keys: BTreeSet<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, BTreeSet::from(MODEL_INFO_KEYS));
    assert_eq!(v["served_model_name"], "sim-7b");
    assert_eq!(v["model_path"], "sim-7b");
    assert_eq!(v["is_generation"], true);
    e.stop().await;
}

/// `/get_load` as one entry per rank, once every rank has published.
async fn get_load(c: &reqwest::Client, url: &str, ranks: usize) -> Result<Vec<Value>, String> {
    let v = get_json(c, &format!("{url}/get_load")).await;
    let entries = v.as_array().cloned().unwrap_or_default();
    if entries.len() == ranks {
        Ok(entries)
    } else {
        Err(format!("{v}"))
    }
}

/// The router's reading of one entry: `(dp_rank, num_tokens)`, both integers.
fn router_view(entry: &Value) -> (i64, i64) {
    let int = |k: &str| {
        entry[k]
            .as_i64()
            .unwrap_or_else(|| panic!("{k} is not an integer in {entry}"))
    };
    (int("dp_rank"), int("num_tokens"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_load_reports_every_rank_and_follows_a_running_request() {
    let e = loadlink_testkit::engine(|c| c.dp_size = 2).await;
    let (c, url) = (reqwest::Client::new(), e.url());
    // A rank is listed before its first publish (all zeros): wait until both have published.
    let idle = wait_until("both ranks published in /get_load", WAIT_SECS, || async {
        let l = get_load(&c, &url, 2).await?;
        match l
            .iter()
            .all(|r| r["max_total_num_tokens"].as_i64() > Some(0))
        {
            true => Ok(l),
            false => Err(format!("{l:?}")),
        }
    })
    .await;
    let ranks: Vec<(i64, i64)> = idle.iter().map(router_view).collect();
    assert_eq!(ranks, [(0, 0), (1, 0)]);
    for entry in &idle {
        assert_eq!(entry["num_reqs"], 0);
        assert_eq!(entry["num_waiting_reqs"], 0);
        assert_eq!(entry["max_total_num_tokens"], 200_000);
    }

    // A long streamed request holds its KV until the client goes away.
    let body = json!({"prompt": "x".repeat(2000), "max_tokens": 100_000, "stream": true});
    let mut resp = complete_ok(&c, &url, &body).await;
    resp.chunk().await.unwrap().unwrap();
    let busy = wait_until("a rank reporting the request", WAIT_SECS, || async {
        let l = get_load(&c, &url, 2).await?;
        match l.iter().find(|r| r["num_reqs"] == 1) {
            Some(r) => Ok(r.clone()),
            None => Err(format!("{l:?}")),
        }
    })
    .await;
    let (_, tokens) = router_view(&busy);
    assert!(tokens >= 500, "num_tokens {tokens} for a 2000-char prompt");
    // The legacy fields are the core block's own numbers, from the same snapshot.
    assert_eq!(
        busy["num_reqs"].as_i64(),
        Some(
            busy["num_running_reqs"].as_i64().unwrap() + busy["num_waiting_reqs"].as_i64().unwrap()
        )
    );
    assert_eq!(busy["num_tokens"], busy["num_total_tokens"]);

    drop(resp);
    wait_until("/get_load back to idle", WAIT_SECS, || async {
        let l = get_load(&c, &url, 2).await?;
        if l.iter().all(|r| r["num_reqs"] == 0 && r["num_tokens"] == 0) {
            Ok(())
        } else {
            Err(format!("{l:?}"))
        }
    })
    .await;
    e.stop().await;
}
