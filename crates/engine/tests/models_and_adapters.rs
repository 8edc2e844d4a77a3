//! An engine serving several names and LoRA adapters, over HTTP: what it lists (`/v1/models`,
//! `/server_info`, `/model_info`), which adapter each way of naming one selects (seen in the
//! per-model counters), loads and residency, the errors for what it does not serve (SGLang's 400,
//! vLLM's 404), and the cache namespaces a request's adapter and salt put its pages in.

use loadlink_engine::{Flavor, LoraConfig};
use loadlink_testkit::served::{
    lora_loads, model_engine, model_requests, restart_on_same_port, unserved_requests,
};
use loadlink_testkit::{get_json, get_text, post};
use loadlink_wire::kv_namespace::{LoraRef, Namespace};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

const ADAPTERS: [&str; 2] = ["sql=/adapters/sql", "chat=/adapters/chat"];

fn lora(max_loaded: usize) -> LoraConfig {
    LoraConfig {
        max_loaded,
        load_time_s: 0.01,
    }
}

/// POSTs `body` to `{url}{route}` and returns (status, body as JSON or text).
async fn send(c: &Client, url: &str, route: &str, body: Value) -> (StatusCode, Value) {
    let r = post(c, &format!("{url}{route}"), &body).await;
    let status = r.status();
    let text = r.text().await.expect("a body");
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, v)
}

async fn ok(c: &Client, url: &str, route: &str, body: Value) -> Value {
    let (status, v) = send(c, url, route, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{route} {body}: {v}");
    v
}

fn completion(model: &str) -> Value {
    json!({"model": model, "prompt": "hello there", "max_tokens": 2})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_and_adapters_are_listed_with_their_parent_and_paths() {
    let e = model_engine(&["base", "alias"], &ADAPTERS, lora(2), |c| {
        c.model_path = Some("/models/base".into());
    })
    .await;
    let c = Client::new();
    let models = get_json(&c, &format!("{}/v1/models", e.url())).await;
    let data = models["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["base", "alias", "sql", "chat"]);
    for m in &data[..2] {
        assert_eq!(
            (&m["root"], &m["parent"]),
            (&json!("/models/base"), &Value::Null)
        );
    }
    assert_eq!(data[2]["root"], "/adapters/sql");
    assert_eq!(data[3]["parent"], "base");
    assert_eq!(data[2]["loaded"], false, "nothing loaded before a request");

    let info = get_json(&c, &format!("{}/server_info", e.url())).await;
    assert_eq!(info["served_model_name"], "base");
    assert_eq!(info["served_model_names"], json!(["base", "alias"]));
    assert_eq!(info["model_path"], "/models/base");
    assert_eq!(info["enable_lora"], true);
    assert_eq!(info["max_loaded_loras"], 2);
    assert_eq!(info["lora_load_time_s"], 0.01);
    assert_eq!(
        info["lora_paths"],
        json!([{"lora_name": "sql", "lora_path": "/adapters/sql", "pinned": false},
               {"lora_name": "chat", "lora_path": "/adapters/chat", "pinned": false}])
    );
    assert_eq!(info["loaded_loras"], json!([[]]));
    let mi = get_json(&c, &format!("{}/model_info", e.url())).await;
    assert_eq!(
        (&mi["model_path"], &mi["served_model_name"]),
        (&json!("/models/base"), &json!("base"))
    );
    e.stop().await;

    // Without adapters: no LoRA keys to speak of.
    let plain = model_engine(&["solo"], &[], LoraConfig::default(), |_| {}).await;
    let info = get_json(&c, &format!("{}/server_info", plain.url())).await;
    assert_eq!(info["enable_lora"], false);
    assert_eq!(
        (&info["lora_paths"], &info["loaded_loras"]),
        (&Value::Null, &Value::Null)
    );
    plain.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_way_of_naming_an_adapter_selects_it_and_loads_are_counted() {
    let e = model_engine(&["base", "alias"], &ADAPTERS, lora(2), |_| {}).await;
    let (c, url) = (Client::new(), e.url());
    // SGLang's `base:adapter`, echoed in the response.
    let v = ok(&c, &url, "/v1/completions", completion("base:sql")).await;
    assert_eq!(v["model"], "base:sql");
    // `lora_path` by name on /generate.
    let gen_body =
        json!({"text": "hi", "lora_path": "chat", "sampling_params": {"max_new_tokens": 2}});
    ok(&c, &url, "/generate", gen_body).await;
    // vLLM's bare adapter name, on chat.
    let chat =
        json!({"model": "sql", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    ok(&c, &url, "/v1/chat/completions", chat).await;
    // `lora_path` by the adapter's path.
    let by_path = json!({"prompt": "x", "lora_path": "/adapters/chat", "max_tokens": 1});
    ok(&c, &url, "/v1/completions", by_path).await;
    // The base model under its alias, without a model, and under a name it does not serve
    // (SGLang serves that one anyway).
    ok(&c, &url, "/v1/completions", completion("alias")).await;
    ok(
        &c,
        &url,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 1}),
    )
    .await;
    let v = ok(&c, &url, "/v1/completions", completion("nobody")).await;
    assert_eq!(v["model"], "nobody");

    let counts = model_requests(&c, &url).await;
    let want: Vec<(&str, u64)> = vec![
        ("<unserved>", 1),
        ("alias", 1),
        ("base", 1),
        ("chat", 2),
        ("sql", 2),
    ];
    let got: Vec<(&str, u64)> = counts.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(got, want);
    assert_eq!(
        lora_loads(&c, &url).await,
        2,
        "each adapter loaded once: both stay resident"
    );
    // Least recently used first: chat (by path) ran last.
    let info = get_json(&c, &format!("{url}/server_info")).await;
    assert_eq!(info["loaded_loras"], json!([["sql", "chat"]]));
    let models = get_json(&c, &format!("{url}/v1/models")).await;
    assert_eq!(models["data"][2]["loaded"], true);
    e.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slot_evicts_the_idle_adapter_and_the_metrics_show_it() {
    let e = model_engine(&["base"], &ADAPTERS, lora(1), |_| {}).await;
    let (c, url) = (Client::new(), e.url());
    for adapter in ["sql", "chat", "chat", "sql"] {
        ok(
            &c,
            &url,
            "/v1/completions",
            completion(&format!("base:{adapter}")),
        )
        .await;
    }
    assert_eq!(lora_loads(&c, &url).await, 3, "sql, chat, then sql again");
    let info = get_json(&c, &format!("{url}/server_info")).await;
    assert_eq!(info["loaded_loras"], json!([["sql"]]));
    let models = get_json(&c, &format!("{url}/v1/models")).await;
    let loaded: Vec<&Value> = models["data"].as_array().unwrap()[1..]
        .iter()
        .map(|m| &m["loaded"])
        .collect();
    assert_eq!(loaded, [&json!(true), &json!(false)]);
    let page = get_text(&c, &format!("{url}/metrics")).await;
    assert!(
        page.contains("loadlink_engine_lora_resident{rank=\"0\"} 1"),
        "{page}"
    );
    e.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_adapter_is_sglangs_400_on_every_route() {
    let e = model_engine(&["base"], &ADAPTERS, lora(2), |_| {}).await;
    let (c, url) = (Client::new(), e.url());
    let (status, v) = send(&c, &url, "/v1/completions", completion("base:nope")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        (&v["object"], &v["type"], &v["code"]),
        (&json!("error"), &json!("BadRequest"), &json!(400))
    );
    assert!(v["message"].as_str().unwrap().contains("\"nope\""), "{v}");
    let body = json!({"text": "x", "lora_path": "nope"});
    let (status, v) = send(&c, &url, "/generate", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("nope"),
        "{v}"
    );
    let body = json!({"text": "x", "lora_path": "nope", "stream": true});
    let (status, v) = send(&c, &url, "/generate", body).await;
    assert_eq!(status, StatusCode::OK, "SGLang streams the error");
    let text = v.as_str().unwrap();
    assert!(
        text.contains("\"error\"") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
    assert_eq!(unserved_requests(&c, &url).await, 3);
    e.stop().await;

    let plain = model_engine(&["base"], &[], LoraConfig::default(), |_| {}).await;
    let (status, v) = send(&c, &plain.url(), "/v1/completions", completion("base:sql")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        v["message"].as_str().unwrap().contains("--lora-paths"),
        "{v}"
    );
    plain.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vllm_flavor_serves_adapters_by_name_and_404s_the_rest() {
    let e = model_engine(&["m1", "m2"], &["a=/p/a"], lora(1), |c| {
        c.flavor = Flavor::Vllm
    })
    .await;
    let (c, url) = (Client::new(), e.url());
    let (status, v) = send(&c, &url, "/v1/completions", completion("zzz")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        v,
        json!({"error": {"message": "The model `zzz` does not exist.", "type": "NotFoundError",
                         "param": "model", "code": 404}})
    );
    // vLLM has no `base:adapter`.
    let (status, _) = send(&c, &url, "/v1/completions", completion("m1:a")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let v = ok(&c, &url, "/v1/completions", completion("a")).await;
    assert_eq!(v["model"], "a");
    ok(&c, &url, "/v1/completions", completion("m2")).await;
    let counts = model_requests(&c, &url).await;
    let got: Vec<(&str, u64)> = counts.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(got, [("<unserved>", 2), ("a", 1), ("m1", 0), ("m2", 1)]);
    let models = get_json(&c, &format!("{url}/v1/models")).await;
    let a = &models["data"][2];
    assert_eq!(
        (&a["id"], &a["root"], &a["parent"]),
        (&json!("a"), &json!("/p/a"), &json!("m1"))
    );
    assert_eq!(
        (&a["owned_by"], &a["loaded"]),
        (&json!("vllm"), &json!(true))
    );
    e.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_the_same_port_serves_the_new_name() {
    let old = model_engine(&["old-model"], &[], LoraConfig::default(), |_| {}).await;
    let port = old.addr.port();
    let new = restart_on_same_port(old, |c| c.model_name = "new-model".into()).await;
    assert_eq!(new.addr.port(), port);
    let c = Client::new();
    let models = get_json(&c, &format!("{}/v1/models", new.url())).await;
    assert_eq!(models["data"][0]["id"], "new-model");
    ok(&c, &new.url(), "/v1/completions", completion("new-model")).await;
    assert_eq!(model_requests(&c, &new.url()).await["new-model"], 1);
    new.stop().await;
}

/// The ids of `/cache_blocks` rank 0, sorted.
async fn blocks(c: &Client, url: &str) -> Vec<i64> {
    let v = get_json(c, &format!("{url}/cache_blocks")).await;
    let mut b: Vec<i64> = v["ranks"][0]["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_i64().unwrap())
        .collect();
    b.sort_unstable();
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_and_a_salt_cache_the_prompt_under_their_own_hashes() {
    let e = model_engine(&["base"], &ADAPTERS, lora(2), |_| {}).await;
    let (c, url) = (Client::new(), e.url());
    let ids: Vec<u32> = (1000..1033).collect();
    let page = 16; // the engine's default page size
    let mut want = Vec::new();
    for (lora_path, salt) in [(None, None), (Some("sql"), None), (None, Some("s1"))] {
        let body = json!({"input_ids": ids, "lora_path": lora_path, "cache_salt": salt,
                          "sampling_params": {"max_new_tokens": 1}});
        ok(&c, &url, "/generate", body).await;
        let ns = Namespace {
            lora: lora_path.map(|n| LoraRef::from_path(n, &format!("/adapters/{n}"))),
            cache_salt: salt.map(Into::into),
            ..Default::default()
        };
        want.extend(ns.event_hashes(&ids[..32], page));
    }
    want.sort_unstable();
    assert_eq!(want.len(), 6);
    assert_eq!(
        blocks(&c, &url).await,
        want,
        "three namespaces, two pages each"
    );
    e.stop().await;
}
