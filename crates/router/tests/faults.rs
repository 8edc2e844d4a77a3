//! Faults and hostile input on real sockets: a lying/malformed load publisher, a slow-body client,
//! and a worker that dies mid-stream (its socket closed the way the kernel closes a SIGKILLed
//! process's sockets).

use axum::routing::{get, post};
use loadlink_publish::free_port_block;
use loadlink_router::LoadSignal;
use loadlink_router::book::MAX_REPORTED;
use loadlink_testkit::{
    complete, complete_ok, http_worker, router as router_with, scrape, wait_for, wait_until,
    worker_json, worker_of,
};
use loadlink_wire::codec::snapshot_bytes;
use loadlink_wire::frame::seq_frame;
use loadlink_wire::prom::Scrape;
use loadlink_wire::{FrameError, LoadSnapshot};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Frames from `worker` the router dropped for `reason` (0 when the series is absent).
fn dropped(metrics: &Scrape, worker: &str, reason: &str) -> f64 {
    metrics
        .value(
            "loadlink_frames_dropped_total",
            &[("worker", worker), ("reason", reason)],
        )
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_publisher_is_dropped_by_reason_and_clamped_and_the_router_keeps_serving() {
    let (liar_port, honest_port) = (free_port_block(1).unwrap(), free_port_block(1).unwrap());
    let liar = http_worker(Some(liar_port)).await;
    let honest = http_worker(Some(honest_port)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    std::thread::spawn(move || {
        let ctx = zmq::Context::new();
        let bad = ctx.socket(zmq::PUB).unwrap();
        bad.bind(&format!("tcp://*:{liar_port}")).unwrap();
        let good = ctx.socket(zmq::PUB).unwrap();
        good.bind(&format!("tcp://*:{honest_port}")).unwrap();
        let lie = snapshot_bytes(&LoadSnapshot {
            num_waiting_reqs: i64::MAX,
            num_running_reqs: -5,
            ..Default::default()
        });
        let mut u64_max = vec![0x81, 0xa0 | 16];
        u64_max.extend_from_slice(b"num_waiting_reqs");
        u64_max.extend_from_slice(&[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        let honest_load = snapshot_bytes(&LoadSnapshot {
            num_waiting_reqs: 3,
            ..Default::default()
        });
        let mut seq = 0i64;
        while !s2.load(Ordering::Relaxed) {
            seq += 1;
            let s = seq_frame(seq);
            let send = |frames: &[&[u8]]| {
                let _ = bad.send_multipart(frames.iter().copied(), zmq::DONTWAIT);
            };
            send(&[b"", &lie]); // 2 frames
            send(&[b"", &s, &lie, b"x"]); // 4 frames
            send(&[b"", &s[..7], &lie]); // 7-byte seq
            send(&[b"", &[0; 9], &lie]); // 9-byte seq
            send(&[b"", &[0xff; 8], &lie]); // seq -1: end marker
            // The ingest decodes only the newest message of each drain (every frame and seq is
            // still checked), so a bad payload is seen when it is the last of its burst: each
            // burst ends with one of the three payloads in turn.
            match seq % 3 {
                0 => send(&[b"", &s, b"\xc1\xc1 not msgpack"]), // garbage
                1 => send(&[b"", &s, &u64_max]),                // u64::MAX in an int field
                _ => send(&[b"", &s, &lie]),                    // well-formed, absurd values
            }
            let _ = good.send_multipart([&b""[..], &s, &honest_load], zmq::DONTWAIT);
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let r = router_with(
        vec![liar.clone(), honest.clone()],
        LoadSignal::Engine,
        |_| {},
    )
    .await;
    let c = reqwest::Client::new();
    let metrics = wait_until("every malformation counted", 15, || async {
        let m = scrape(&c, &r.url()).await;
        if FrameError::REASONS
            .iter()
            .all(|k| dropped(&m, &liar, k) > 0.0)
        {
            Ok(m)
        } else {
            Err(format!("{m:?}"))
        }
    })
    .await;
    assert_eq!(dropped(&metrics, &honest, "payload"), 0.0);
    // Every third burst ends with the well-formed lie; under load the drains that counted the
    // malformations may all have ended with a bad payload, so wait for a lie to be decoded.
    wait_for("the liar's absurd snapshot is decoded", 15, || async {
        worker_json(&c, &r.url(), &liar).await["source"] == "engine"
    })
    .await;
    let w = worker_json(&c, &r.url(), &liar).await;
    assert_eq!(
        w["load"].as_i64().unwrap(),
        MAX_REPORTED,
        "i64::MAX waiting clamped, −5 running read as 0"
    );
    // The liar repels traffic, but only as far as any very loaded worker would: the honest one
    // gets the requests and the router answers every one.
    for _ in 0..20 {
        let resp = complete_ok(&c, &r.url(), &json!({"prompt": "x"})).await;
        assert_eq!(worker_of(&resp), honest);
    }
    stop.store(true, Ordering::Relaxed);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_gets_408_and_the_router_is_unaffected() {
    let w = http_worker(None).await;
    let r = router_with(vec![w], LoadSignal::Engine, |c| c.body_timeout_ms = 300).await;
    let mut s = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":").await.unwrap();
    let mut buf = vec![0u8; 2048];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("the router answers a stalled body")
        .unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    assert!(head.contains("--body-timeout-ms"));
    complete_ok(&reqwest::Client::new(), &r.url(), &json!({"prompt": "x"})).await;
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_dying_mid_stream_ends_the_stream_with_an_error_event_and_no_leak() {
    // A raw HTTP worker: /server_info says "no load range"; a completion starts an SSE stream,
    // sends two events, then the socket is closed without finishing the chunked body.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                if req.starts_with("GET /server_info") {
                    let body = r#"{"kv_events":null}"#;
                    let _ = sock.write_all(format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()).as_bytes()).await;
                    return;
                }
                let _ = sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n").await;
                for i in 0..2 {
                    let ev = format!("data: {{\"i\":{i}}}\n\n");
                    let _ = sock
                        .write_all(format!("{:x}\r\n{ev}\r\n", ev.len()).as_bytes())
                        .await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // "SIGKILL": the connection goes away mid-body.
                drop(sock);
            });
        }
    });
    let r = router_with(vec![url.clone()], LoadSignal::Engine, |_| {}).await;
    let body = json!({"prompt": "x", "stream": true});
    let resp = complete_ok(&reqwest::Client::new(), &r.url(), &body).await;
    let text = resp
        .text()
        .await
        .expect("the client sees a clean end, not a cut connection");
    assert!(text.starts_with("data: {\"i\":0}"), "{text}");
    assert!(text.contains("the worker failed mid-stream"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let st = r.state.clone();
    assert!(
        st.fleet.workers().iter().all(|w| w.inflight() == 0),
        "no in-flight leak"
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_worker_is_used_again_when_it_comes_back() {
    let live = http_worker(None).await;
    let port = free_port_block(1).unwrap();
    let dead = format!("http://127.0.0.1:{port}");
    let r = router_with(vec![live.clone(), dead.clone()], LoadSignal::Engine, |c| {
        c.discovery_attempts = 1;
        c.breaker_cooldown_ms = 200;
        c.health_interval_ms = 100;
    })
    .await;
    let c = reqwest::Client::new();
    let send = || async {
        let resp = complete(&c, &r.url(), &json!({"prompt": "x"})).await;
        assert_eq!(
            resp.status(),
            200,
            "requests never fail while a worker is down"
        );
        worker_of(&resp)
    };
    for _ in 0..10 {
        assert_eq!(send().await, live);
    }
    // The worker comes back on the same address.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/completions",
            post(|| async { axum::Json(json!({"choices": [{"text": "back"}]})) }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    wait_for("the revived worker to get traffic again", 15, || async {
        send().await == dead
    })
    .await;
    r.stop().await;
}
