//! Prefill–decode disaggregation over real engines on loopback: the same request sent to a
//! prefill and a decode engine (as a router sends it) completes, JSON and SSE, each engine
//! counting it once; PD engines refuse requests without a room with SGLang's message; health
//! checks' fake bootstrap host needs no transfer; both sides advertise their role.

use loadlink_engine::PdMode;
use loadlink_testkit::pd_engines::{
    PdFleet, pd_engines, requests_total, rooms_total, send_both, with_fields,
};
use loadlink_testkit::{get_json, post, wait_until};
use serde_json::{Value, json};

/// A fleet of one prefill and one decode engine, 20× faster than real time.
async fn pair() -> PdFleet {
    pd_engines(1, 1, |_, c| c.time_scale = 20.0).await
}

/// The `data:` payloads of an SSE body, `[DONE]` included.
fn events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// Sends `body` (with `room`'s bootstrap fields) to `path` on both engines at once; returns the
/// (prefill, decode) statuses and bodies.
async fn both(f: &PdFleet, path: &str, body: &Value, room: u64) -> ((u16, String), (u16, String)) {
    let c = reqwest::Client::new();
    let body = with_fields(body, &f.prefill[0].bootstrap_fields(room));
    send_both(&c, &f.prefill[0].url, &f.decode[0].url, path, &body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_completes_through_prefill_then_decode_json_and_sse() {
    let f = pair().await;
    let c = reqwest::Client::new();
    let gen_body = json!({"text": "abcdefgh".repeat(20), "sampling_params": {"max_new_tokens": 5}});
    let chat = json!({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4});
    // /generate JSON: decode answers all 5 tokens, prefill exactly one.
    let ((ps, pb), (ds, db)) = both(&f, "/generate", &gen_body, 11).await;
    assert_eq!((ps, ds), (200, 200), "prefill {pb}\ndecode {db}");
    let (p, d): (Value, Value) = (
        serde_json::from_str(&pb).unwrap(),
        serde_json::from_str(&db).unwrap(),
    );
    assert_eq!(p["meta_info"]["completion_tokens"], 1, "{p}");
    assert_eq!(d["meta_info"]["completion_tokens"], 5, "{d}");
    assert_eq!(
        d["meta_info"]["prompt_tokens"],
        p["meta_info"]["prompt_tokens"]
    );
    // Chat SSE: a chunk per token, the last with finish_reason, then [DONE].
    let mut chat_sse = chat.clone();
    chat_sse["stream"] = json!(true);
    let ((ps, pb), (ds, db)) = both(&f, "/v1/chat/completions", &chat_sse, 12).await;
    assert_eq!((ps, ds), (200, 200));
    let ev = events(&db);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{db}");
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks.iter().all(|c| c.get("error").is_none()), "{db}");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text.matches("tok").count(), 4, "{db}");
    assert_eq!(
        events(&pb).last().map(String::as_str),
        Some("[DONE]"),
        "{pb}"
    );
    // Chat JSON.
    let ((ps, _), (ds, db)) = both(&f, "/v1/chat/completions", &chat, 13).await;
    assert_eq!((ps, ds), (200, 200));
    let d: Value = serde_json::from_str(&db).unwrap();
    assert_eq!(d["usage"]["completion_tokens"], 4, "{d}");
    // Each side counted each room once, and nothing failed.
    for e in [&f.prefill[0], &f.decode[0]] {
        assert_eq!(
            rooms_total(&c, &e.url, "transferred").await,
            3.0,
            "{}",
            e.url
        );
        assert_eq!(rooms_total(&c, &e.url, "failed").await, 0.0);
        assert_eq!(rooms_total(&c, &e.url, "timeout").await, 0.0);
        assert_eq!(requests_total(&c, &e.url).await, 3.0);
    }
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_room_get_sglangs_400() {
    let f = pair().await;
    let c = reqwest::Client::new();
    for e in [&f.prefill[0], &f.decode[0]] {
        let body = json!({"text": "abcd", "rid": "r-7", "bootstrap_host": "127.0.0.1"});
        let r = post(&c, &format!("{}/generate", e.url), &body).await;
        assert_eq!(r.status().as_u16(), 400);
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            v["error"]["message"],
            "Invalid request: Disaggregated request received without bootstrap room id. \
             req.rid='r-7'"
        );
        let chat = json!({"messages": [{"role": "user", "content": "x"}]});
        let r = post(&c, &format!("{}/v1/chat/completions", e.url), &chat).await;
        assert_eq!(r.status().as_u16(), 400);
        let v: Value = r.json().await.unwrap();
        let m = v["message"].as_str().unwrap_or_default();
        assert!(
            m.starts_with(
                "Invalid request: Disaggregated request received without bootstrap room id."
            ),
            "{v}"
        );
        // A batch of rooms is refused, naming the field.
        let batch = json!({"text": "ab", "bootstrap_room": [1, 2]});
        let r = post(&c, &format!("{}/generate", e.url), &batch).await;
        assert_eq!(r.status().as_u16(), 400);
        assert!(r.text().await.unwrap().contains("bootstrap_room"));
    }
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_bootstrap_host_is_served_without_a_transfer() {
    let f = pair().await;
    let c = reqwest::Client::new();
    let body = json!({"text": "warm up", "sampling_params": {"max_new_tokens": 3},
                      "bootstrap_host": "2.2.2.2", "bootstrap_room": 0});
    for (e, tokens) in [(&f.prefill[0], 1), (&f.decode[0], 3)] {
        let r = post(&c, &format!("{}/generate", e.url), &body).await;
        assert_eq!(r.status().as_u16(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            v["meta_info"]["completion_tokens"], tokens,
            "{}: {v}",
            e.url
        );
        assert_eq!(rooms_total(&c, &e.url, "transferred").await, 0.0);
    }
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sides_advertise_their_role_and_publish_the_disaggregation_section() {
    let f = pair().await;
    let c = reqwest::Client::new();
    for (e, mode) in [
        (&f.prefill[0], PdMode::Prefill),
        (&f.decode[0], PdMode::Decode),
    ] {
        for route in ["/server_info", "/get_server_info"] {
            let info = get_json(&c, &format!("{}{route}", e.url)).await;
            assert_eq!(info["disaggregation_mode"], mode.as_str(), "{route}");
            let port = info["disaggregation_bootstrap_port"]
                .as_u64()
                .map(|p| p as u16);
            assert_eq!(port, e.bootstrap_port, "{route}");
        }
        assert_eq!(
            get_json(&c, &format!("{}/get_model_info", e.url)).await["disaggregation_mode"],
            mode.as_str()
        );
        let url = format!("{}/v1/loads?include=disagg", e.url);
        let disagg = wait_until("the disaggregation section", 10, || async {
            let loads = get_json(&c, &url).await;
            let d = loads["loads"][0]["disaggregation"].clone();
            if d.is_object() {
                Ok(d)
            } else {
                Err(format!("{loads}"))
            }
        })
        .await;
        assert_eq!(disagg["mode"], mode.as_str(), "{disagg}");
        assert_eq!(disagg["kv_transfer_speed_gb_s"], 25.0, "{disagg}");
    }
    assert!(f.prefill[0].bootstrap_port.is_some_and(|p| p != 0));
    assert_eq!(f.decode[0].bootstrap_port, None);
    f.stop().await;
}
