//! `--flavor vllm`: vLLM's gauge names on `/metrics` (read back by the router's parser), vLLM's
//! `/v1/models`, and none of SGLang's load or discovery routes.

use loadlink_engine::Flavor;
use loadlink_testkit::{complete_ok, wait_until};
use loadlink_wire::polled::{MetricsFlavor, loads_from_metrics};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_flavor_serves_vllm_metrics_and_models_and_no_sglang_routes() {
    let e = loadlink_testkit::engine(|c| {
        c.dp_size = 2;
        c.time_scale = 20.0;
        c.flavor = Flavor::Vllm;
        // Ignored by the vLLM flavour: it has no load socket and no KV events.
        c.kv_events_config = Some(r#"{"publisher":"zmq","endpoint":"tcp://*:1"}"#.into());
    })
    .await;
    let c = reqwest::Client::new();
    complete_ok(
        &c,
        &e.url(),
        &serde_json::json!({"prompt": "abcd", "max_tokens": 2}),
    )
    .await;
    let snaps = wait_until("both engines in /metrics", 10, || async {
        let page = c
            .get(format!("{}/metrics", e.url()))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        match loads_from_metrics(&page) {
            Ok((MetricsFlavor::Vllm, s)) if s.len() == 2 => Ok(s),
            other => Err(format!("{other:?}: {page}")),
        }
    })
    .await;
    assert_eq!((snaps[0].dp_rank, snaps[1].dp_rank), (0, 1));
    let models: serde_json::Value = c
        .get(format!("{}/v1/models", e.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["owned_by"], "vllm");
    assert!(models["data"][0]["max_model_len"].as_u64().is_some());
    for path in ["/server_info", "/get_server_info", "/v1/loads", "/get_load"] {
        let status = c
            .get(format!("{}{path}", e.url()))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 404, "{path}");
    }
    e.stop().await;
}
