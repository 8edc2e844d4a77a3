//! The routes a fleet router serves beyond generation: SGLang's and OpenAI's other endpoints pass
//! through to a worker, and `/v1/models` is the union across workers.

use loadlink_router::LoadSignal;
use loadlink_testkit::{engine, get_json, router, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_the_union_and_other_routes_pass_through() {
    let a = engine(|c| c.model_name = "model-a".into()).await;
    let b = engine(|c| c.model_name = "model-b".into()).await;
    let r = router(vec![a.url(), b.url()], LoadSignal::Inflight, |_| {}).await;
    let c = reqwest::Client::new();
    let models = get_json(&c, &format!("{}/v1/models", r.url())).await;
    let mut ids: Vec<_> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    assert_eq!(ids, ["model-a", "model-b"], "{models}");
    let info = get_json(&c, &format!("{}/get_server_info", r.url())).await;
    assert!(
        info.get("kv_events").is_some(),
        "an engine's answer: {info}"
    );
    let health = c
        .get(format!("{}/health_generate", r.url()))
        .send()
        .await
        .unwrap();
    assert!(health.status().is_success());
    // The simulated engine has no embedding model: its own 404 reaches the client unchanged.
    let emb = c
        .post(format!("{}/v1/embeddings", r.url()))
        .json(&serde_json::json!({"input": "x", "model": "model-a"}))
        .send()
        .await
        .unwrap();
    assert_eq!(emb.status(), 404);
    // Two models and none named: the router cannot choose, and says which field to set.
    let unnamed = c
        .post(format!("{}/v1/embeddings", r.url()))
        .json(&serde_json::json!({"input": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(unnamed.status(), 400);
    let e: serde_json::Value = unnamed.json().await.unwrap();
    assert_eq!(e["error"]["code"], "model_required", "{e}");
    assert_eq!(e["error"]["param"], "model", "{e}");
    a.stop().await;
    // The list is the available workers' models: the stopped worker is left out once the health
    // check notices.
    wait_for("a stopped worker is left out of /v1/models", 10, || async {
        let one = get_json(&c, &format!("{}/v1/models", r.url())).await;
        one["data"].as_array().unwrap().len() == 1 && one["data"][0]["id"] == "model-b"
    })
    .await;
    r.stop().await;
    b.stop().await;
}
