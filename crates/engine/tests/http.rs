//! The engine over real HTTP and a real ZMQ SUB on loopback.

use loadlink_engine::{Engine, PublishPoint};
use loadlink_testkit::{
    complete, complete_ok, drain_snapshots as drain, get_json, get_text, joined_sub, post,
    post_json, scrape, wait_for, wait_until,
};
use loadlink_wire::descriptor::parse_server_info;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Seconds a test waits for the engine to reach a state.
const WAIT_SECS: u64 = 15;

/// An engine without a load range, `time_scale` times faster than real time, taking bodies up to
/// 64 KiB.
async fn engine(time_scale: f64) -> Engine {
    loadlink_testkit::engine(|c| {
        c.time_scale = time_scale;
        c.max_body_bytes = 64 * 1024;
    })
    .await
}

/// An engine at time-scale 1 publishing its load from `point`; returns it with its KV port.
async fn publishing_engine(dp: u32, point: PublishPoint) -> (Engine, u16) {
    loadlink_testkit::publishing_engine(|c| {
        c.dp_size = dp;
        c.publish_point = point;
        c.max_body_bytes = 64 * 1024;
    })
    .await
}

async fn loads(c: &reqwest::Client, url: &str) -> Vec<Value> {
    let v = get_json(c, &format!("{url}/v1/loads")).await;
    v["loads"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_json_and_sse_with_usage() {
    let e = engine(20.0).await;
    let c = reqwest::Client::new();
    let cases = [
        (
            "/v1/completions",
            json!({"prompt": "abcdefgh", "max_tokens": 4}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "abcd"}], "max_tokens": 4}),
        ),
        (
            "/generate",
            json!({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}}),
        ),
    ];
    for (path, body) in &cases {
        let v = post_json(&c, &format!("{}{path}", e.url()), body).await;
        let usage = if *path == "/generate" {
            &v["meta_info"]
        } else {
            &v["usage"]
        };
        assert_eq!(usage["completion_tokens"], 4, "{path}: {v}");
        assert_eq!(
            usage["prompt_tokens"],
            if *path == "/v1/chat/completions" {
                6 // <start> <user> abcd <end>, then the generation prompt <start> <assistant>
            } else {
                2
            },
            "{path}: {v}"
        );

        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        sbody["stream_options"] = json!({"include_usage": true});
        let resp = post(&c, &format!("{}{path}", e.url()), &sbody).await;
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        let text = resp.text().await.unwrap();
        let events: Vec<&str> = text.split("\n\n").filter(|s| !s.is_empty()).collect();
        assert_eq!(*events.last().unwrap(), "data: [DONE]", "{path}");
        assert_eq!(
            events.len(),
            5,
            "{path}: one event per token, then [DONE]: {text}"
        );
        let last: Value =
            serde_json::from_str(events[events.len() - 2].trim_start_matches("data: ")).unwrap();
        if *path == "/generate" {
            assert_eq!(last["meta_info"]["completion_tokens"], 4);
        } else {
            assert_eq!(last["choices"][0]["finish_reason"], "length");
            assert_eq!(last["usage"]["completion_tokens"], 4);
        }
    }
    let m = get_json(&c, &format!("{}/v1/models", e.url())).await;
    assert_eq!(m["data"][0]["id"], "loadlink-sim");
    e.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_get_clear_errors() {
    let e = engine(20.0).await;
    let c = reqwest::Client::new();
    let cases: [(&str, Vec<u8>, u16, &str); 6] = [
        (
            "/v1/chat/completions",
            br#"{"model":"m"}"#.to_vec(),
            400,
            "messages",
        ),
        (
            "/v1/completions",
            br#"{"prompt":"x","max_tokens":-3}"#.to_vec(),
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            b"{not json".to_vec(),
            400,
            "not valid JSON",
        ),
        (
            "/generate",
            br#"{"sampling_params":{}}"#.to_vec(),
            400,
            "text or input_ids",
        ),
        (
            "/v1/completions",
            vec![b' '; 100 * 1024],
            413,
            "--max-body-bytes",
        ),
        ("/nope", b"{}".to_vec(), 404, "no such route"),
    ];
    for (path, body, status, needle) in cases {
        let r = c
            .post(format!("{}{path}", e.url()))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{path}");
        let v: Value = r.json().await.unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{path}: {msg}");
    }
    // The engine still serves after bad input.
    complete_ok(&c, &e.url(), &json!({"prompt": "x", "max_tokens": 1})).await;
    e.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_advertised_socket_shows_load_rise_and_fall_and_agrees_with_v1_loads() {
    // The load range of a dp-1 engine is the one port after its KV port.
    let (e, kv_port) = publishing_engine(1, PublishPoint::default()).await;
    let c = reqwest::Client::new();
    let info = get_text(&c, &format!("{}/server_info", e.url())).await;
    let desc = parse_server_info(info.as_bytes())
        .unwrap()
        .expect("kv_events advertised");
    let eps = desc.load_endpoints("127.0.0.1");
    assert_eq!(eps.len(), 1);
    assert_eq!(eps[0].endpoint, format!("tcp://127.0.0.1:{}", kv_port + 1));
    // Idle heartbeats arrive.
    let s = tokio::task::spawn_blocking(move || joined_sub(&eps[0].endpoint))
        .await
        .unwrap();
    // 40 long requests against 16 slots: running fills, the rest wait.
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let c = c.clone();
        let url = e.url();
        tasks.push(tokio::spawn(async move {
            complete(&c, &url, &json!({"prompt": "hello", "max_tokens": 200}))
                .await
                .status()
        }));
    }
    let (s, peak) = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut peak = (0, 0);
        while Instant::now() < deadline {
            for snap in drain(&s) {
                peak = (
                    peak.0.max(snap.num_running_reqs),
                    peak.1.max(snap.num_waiting_reqs),
                );
            }
            if peak.0 == 16 && peak.1 >= 10 {
                break;
            }
        }
        (s, peak)
    })
    .await
    .unwrap();
    assert_eq!(peak.0, 16, "running fills the batch");
    assert!(peak.1 >= 10, "the rest wait: {peak:?}");
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    // Load falls back to zero, and /v1/loads serves a snapshot the socket also carried.
    let (s, last) = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = None;
        while Instant::now() < deadline {
            if let Some(x) = drain(&s).pop() {
                let idle = x.num_running_reqs == 0 && x.num_waiting_reqs == 0;
                last = Some(x);
                if idle {
                    break;
                }
            }
        }
        (s, last.unwrap())
    })
    .await
    .unwrap();
    assert_eq!(
        (
            last.num_running_reqs,
            last.num_waiting_reqs,
            last.num_used_tokens
        ),
        (0, 0, 0)
    );
    let http = loads(&c, &e.url()).await;
    let seen = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(300));
        drain(&s)
    })
    .await
    .unwrap();
    let ts = http[0]["timestamp"].as_f64().unwrap();
    let twin = seen
        .iter()
        .chain(std::iter::once(&last))
        .find(|x| x.timestamp() == ts);
    let twin = twin
        .unwrap_or_else(|| panic!("/v1/loads timestamp {ts} not among the published snapshots"));
    assert_eq!(
        loadlink_wire::loads::snapshot_dict(twin, loadlink_wire::loads::Include::ALL),
        http[0]
    );
    e.stop().await;
}

/// Under the default publish point the snapshot is taken after a cycle receives its requests and
/// before the next batch is scheduled, so routers see a request waiting for prefill while that
/// prefill runs. At SGLang's two points (after scheduling; after the batch) they never do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_ingest_point_publishes_a_new_request_waiting_before_its_prefill_ends() {
    for point in PublishPoint::ALL {
        let (e, kv_port) = publishing_engine(1, point).await;
        let endpoint = format!("tcp://127.0.0.1:{}", kv_port + 1);
        let s = tokio::task::spawn_blocking(move || joined_sub(&endpoint))
            .await
            .unwrap();
        // 4,000 prompt tokens: one prefill step of about 0.4 s at time-scale 1, and the only step.
        let prompt = 4000usize;
        let body = json!({"input_ids": vec![7u32; prompt], "max_tokens": 1});
        complete_ok(&reqwest::Client::new(), &e.url(), &body).await;
        let seen = tokio::task::spawn_blocking(move || drain(&s))
            .await
            .unwrap();
        let waiting_with_tokens = seen.iter().any(|x| {
            x.num_waiting_reqs == 1
                && x.num_waiting_uncached_tokens == prompt as i64
                && x.num_running_reqs == 0
        });
        assert_eq!(
            waiting_with_tokens,
            point == PublishPoint::Ingest,
            "{}: (running, waiting, uncached) seen: {:?}",
            point.as_str(),
            seen.iter()
                .map(|x| (
                    x.num_running_reqs,
                    x.num_waiting_reqs,
                    x.num_waiting_uncached_tokens
                ))
                .collect::<Vec<_>>()
        );
        e.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_disconnect_aborts_the_request_and_frees_kv() {
    let e = engine(1.0).await;
    let c = reqwest::Client::new();
    let body = json!({"prompt": "x".repeat(4000), "max_tokens": 100000, "stream": true});
    let mut resp = complete_ok(&c, &e.url(), &body).await;
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    wait_for("KV in use", WAIT_SECS, || async {
        loads(&c, &e.url()).await[0]["num_used_tokens"]
            .as_i64()
            .unwrap()
            > 1000
    })
    .await;
    drop(resp);
    wait_for("KV freed after the disconnect", WAIT_SECS, || async {
        let l = loads(&c, &e.url()).await;
        l[0]["num_used_tokens"] == 0 && l[0]["num_running_reqs"] == 0
    })
    .await;
    assert_eq!(e.open_requests(), 0);
    // The metrics page is well-formed and counts the abort.
    let m = scrape(&c, &e.url()).await;
    assert_eq!(m.value("loadlink_engine_aborted_total", &[]), Some(1.0));
    e.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dp_ranks_share_the_load_through_the_shm_dispatcher() {
    let (e, _) = publishing_engine(2, PublishPoint::default()).await;
    let c = reqwest::Client::new();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (c, url) = (c.clone(), e.url());
        tasks.push(tokio::spawn(async move {
            complete(&c, &url, &json!({"prompt": "hi", "max_tokens": 5000})).await;
        }));
    }
    // Every request lands (20 in the engine), and the dispatcher splits them, not one rank: each
    // rank comes to run at least 6. A request never moves between ranks, so this is a wait for the
    // schedulers to take in what was dispatched (a busy machine lags), not for a rebalance.
    wait_until(
        "all 20 requests in the engine and at least 6 running on each rank",
        WAIT_SECS,
        || async {
            let l = loads(&c, &e.url()).await;
            let running: Vec<i64> = l
                .iter()
                .map(|r| r["num_running_reqs"].as_i64().unwrap())
                .collect();
            let landed: i64 = l
                .iter()
                .map(|r| r["num_waiting_reqs"].as_i64().unwrap())
                .sum::<i64>()
                + running.iter().sum::<i64>();
            if l.len() == 2 && landed == 20 && running.iter().all(|&n| n >= 6) {
                Ok(())
            } else {
                Err(format!(
                    "{landed} in the engine, running per rank {running:?} (unbalanced dispatch?)"
                ))
            }
        },
    )
    .await;
    let l = loads(&c, &e.url()).await;
    let total: i64 = l
        .iter()
        .map(|r| r["num_running_reqs"].as_i64().unwrap() + r["num_waiting_reqs"].as_i64().unwrap())
        .sum();
    assert_eq!(total, 20);
    for t in tasks {
        t.abort();
    }
    e.stop().await;
}
