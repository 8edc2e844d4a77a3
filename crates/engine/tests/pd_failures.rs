//! Prefill–decode disaggregation when things fail, over real engines and real TCP: a decode
//! engine pointed at a bootstrap port nobody serves, a prefill engine killed while its transfer
//! is under way, a decode side that never registers, and a peer that sends garbage to the
//! bootstrap port. Each fails only its own request, cleanly (JSON: a 500 in SGLang's shape;
//! SSE: an error event and `[DONE]`), and the engines keep serving.

use loadlink_engine::PdMode;
use loadlink_testkit::pd_engines::{PdFleet, pd_engines, rooms_total, send_both, with_fields};
use loadlink_testkit::{get_json, post, scrape, wait_until};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The `data:` payloads of an SSE body.
fn events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// A loopback port nothing listens on (bound, then released).
fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Asserts `body` is an SSE error event followed by `[DONE]`, and returns the error's message.
fn sse_error(body: &str) -> String {
    let ev = events(body);
    assert_eq!(ev.len(), 2, "an error event, then [DONE]: {body}");
    assert_eq!(ev[1], "[DONE]");
    let v: Value = serde_json::from_str(&ev[0]).unwrap();
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A request the decode engine of `f` completes without any prefill engine (the fake host).
async fn decode_still_serves(c: &reqwest::Client, f: &PdFleet) {
    let body = json!({"text": "still here", "sampling_params": {"max_new_tokens": 2},
                      "bootstrap_host": "2.2.2.2", "bootstrap_room": 0});
    let r = post(c, &format!("{}/generate", f.decode[0].url), &body).await;
    assert_eq!(r.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_port_nobody_serves_fails_the_decode_request_cleanly() {
    let f = pd_engines(0, 1, |_, c| c.time_scale = 20.0).await;
    let c = reqwest::Client::new();
    let fields =
        json!({"bootstrap_host": "127.0.0.1", "bootstrap_port": dead_port(), "bootstrap_room": 5});
    let url = &f.decode[0].url;
    let sse = json!({"messages": [{"role": "user", "content": "x"}], "stream": true});
    let r = post(
        &c,
        &format!("{url}/v1/chat/completions"),
        &with_fields(&sse, &fields),
    )
    .await;
    let body = r.text().await.unwrap();
    assert!(
        sse_error(&body).starts_with("Decode handshake failed"),
        "{body}"
    );
    let gen_body = json!({"text": "x"});
    let r = post(
        &c,
        &format!("{url}/generate"),
        &with_fields(&gen_body, &fields),
    )
    .await;
    assert_eq!(r.status().as_u16(), 500);
    let v: Value = r.json().await.unwrap();
    let m = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        m.contains("bootstrap_room=5") && m.contains("dialing"),
        "{v}"
    );
    assert_eq!(rooms_total(&c, url, "failed").await, 2.0);
    decode_still_serves(&c, &f).await;
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_engine_killed_mid_transfer_fails_only_its_request() {
    // A slow link: a 64-token prompt's KV takes 64 × 131072 B ÷ 1 MB/s ≈ 8 s to send.
    let mut f = pd_engines(1, 1, |mode, c| {
        if mode == PdMode::Prefill {
            c.pd.kv_transfer_gb_s = 0.001;
        }
    })
    .await;
    let c = reqwest::Client::new();
    let body = json!({"input_ids": (0..64).collect::<Vec<u32>>(), "stream": true,
                      "sampling_params": {"max_new_tokens": 4}});
    let body = with_fields(&body, &f.prefill[0].bootstrap_fields(77));
    let (pc, dc) = (c.clone(), c.clone());
    let (purl, durl) = (f.prefill[0].url.clone(), f.decode[0].url.clone());
    let (pbody, dbody) = (body.clone(), body.clone());
    let _prefill =
        tokio::spawn(async move { post(&pc, &format!("{purl}/generate"), &pbody).await });
    let decode = tokio::spawn(async move {
        post(&dc, &format!("{durl}/generate"), &dbody)
            .await
            .text()
            .await
            .unwrap()
    });
    // Wait until the KV is on the wire: prefilled, registered, being sent.
    let loads = format!("{}/v1/loads?include=disagg", f.prefill[0].url);
    wait_until("the transfer under way", 10, || async {
        let v = get_json(&c, &loads).await;
        let inflight = &v["loads"][0]["disaggregation"]["prefill_inflight_queue_reqs"];
        if inflight == 1 {
            Ok(())
        } else {
            Err(format!("{v}"))
        }
    })
    .await;
    let killed = f.prefill.remove(0);
    drop(killed.engine);
    let body = tokio::time::timeout(Duration::from_secs(10), decode)
        .await
        .expect("the decode request ends once its prefill engine is gone")
        .unwrap();
    let m = sse_error(&body);
    assert!(m.contains("bootstrap_room=77") && m.contains("lost"), "{m}");
    let durl = &f.decode[0].url;
    assert_eq!(rooms_total(&c, durl, "failed").await, 1.0);
    assert_eq!(rooms_total(&c, durl, "transferred").await, 0.0);
    let waiting = scrape(&c, durl).await;
    assert_eq!(
        waiting.value("loadlink_engine_pd_rooms_waiting", &[]),
        Some(0.0)
    );
    decode_still_serves(&c, &f).await;
    // A new prefill engine: the same decode engine completes a room through it.
    let fresh = pd_engines(1, 0, |_, c| c.time_scale = 20.0).await;
    let ok = with_fields(
        &json!({"text": "again"}),
        &fresh.prefill[0].bootstrap_fields(78),
    );
    let (p, d) = send_both(&c, &fresh.prefill[0].url, durl, "/generate", &ok).await;
    assert_eq!((p.0, d.0), (200, 200), "{p:?} {d:?}");
    assert_eq!(rooms_total(&c, durl, "transferred").await, 1.0);
    fresh.stop().await;
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_side_that_never_registers_times_the_prefill_request_out() {
    let f = pd_engines(1, 0, |_, c| {
        c.time_scale = 20.0;
        c.pd.timeout = Duration::from_millis(300);
    })
    .await;
    let c = reqwest::Client::new();
    let p = &f.prefill[0];
    let body = with_fields(&json!({"text": "lonely"}), &p.bootstrap_fields(3));
    let r = post(&c, &format!("{}/generate", p.url), &body).await;
    assert_eq!(r.status().as_u16(), 500);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("timed out"),
        "{v}"
    );
    assert_eq!(rooms_total(&c, &p.url, "timeout").await, 1.0);
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_bootstrap_port_closes_that_connection_only() {
    let f = pd_engines(1, 1, |_, c| c.time_scale = 20.0).await;
    let port = f.prefill[0].bootstrap_port.unwrap();
    // An over-budget length prefix: the server closes this connection without reading on.
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3])
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("the server closes the connection")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    // An unknown frame kind, same.
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(&[0, 0, 0, 2, 42, 0]).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("the server closes the connection")
        .unwrap_or(0);
    assert_eq!(n, 0);
    // Both refusals are counted for the operator, by reason.
    let c = reqwest::Client::new();
    let page = scrape(&c, &f.prefill[0].url).await;
    let refused = |reason| {
        page.value(
            "loadlink_engine_pd_bootstrap_refused_total",
            &[("reason", reason)],
        )
    };
    assert_eq!(refused("frame"), Some(2.0));
    assert_eq!(refused("connections"), Some(0.0));
    // The engine still transfers for a well-behaved decode engine.
    let ok = with_fields(&json!({"text": "fine"}), &f.prefill[0].bootstrap_fields(9));
    let (p, d) = send_both(&c, &f.prefill[0].url, &f.decode[0].url, "/generate", &ok).await;
    assert_eq!((p.0, d.0), (200, 200), "{p:?} {d:?}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_request_whose_kv_never_comes_times_out() {
    // The prefill engine accepts the registration but never gets the request itself.
    let f = pd_engines(1, 1, |_, c| {
        c.time_scale = 20.0;
        c.pd.timeout = Duration::from_millis(300);
    })
    .await;
    let c = reqwest::Client::new();
    let body = json!({"messages": [{"role": "user", "content": "x"}], "stream": true});
    let body = with_fields(&body, &f.prefill[0].bootstrap_fields(44));
    let url = &f.decode[0].url;
    let r = post(&c, &format!("{url}/v1/chat/completions"), &body).await;
    let m = sse_error(&r.text().await.unwrap());
    assert!(
        m.starts_with("KV transfer timed out") && m.contains("bootstrap_room=44"),
        "{m}"
    );
    assert_eq!(rooms_total(&c, url, "timeout").await, 1.0);
    let page = scrape(&c, url).await;
    assert_eq!(
        page.value("loadlink_engine_aborted_total", &[]),
        Some(0.0),
        "not a client abort"
    );
    decode_still_serves(&c, &f).await;
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_bootstrap_port_stops_the_prefill_engine_from_starting() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = loadlink_engine::EngineConfig {
        port: 0,
        pd: loadlink_engine::PdConfig {
            mode: PdMode::Prefill,
            bootstrap_port: taken.local_addr().unwrap().port(),
            ..Default::default()
        },
        ..Default::default()
    };
    let err = match loadlink_engine::Engine::start(cfg).await {
        Ok(_) => panic!("started on a taken bootstrap port"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("--disaggregation-bootstrap-port"), "{err}");
}
