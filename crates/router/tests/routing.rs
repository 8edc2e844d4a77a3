//! The router on loopback against real engines (in-process `loadlink engine`s) and controllable
//! workers (a small HTTP server plus a real `PubSink` the test starts, stops and restarts).

use loadlink_engine::Engine;
use loadlink_publish::{Encoded, Sink, free_port_block};
use loadlink_router::LoadSignal;
use loadlink_testkit::{
    complete, complete_ok, http_worker, post, router, scrape, snapshot_pub, wait_for,
    wait_until_sync, worker_json, worker_of, workers,
};
use loadlink_wire::LoadSnapshot;
use loadlink_wire::codec::snapshot_bytes;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

/// A dp-1 engine publishing its load, `time_scale` times faster than real time.
async fn engine(time_scale: f64) -> Engine {
    loadlink_testkit::publishing_engine(|c| c.time_scale = time_scale)
        .await
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn engine_load_steers_away_from_a_worker_loaded_by_direct_clients() {
    let (a, b) = (engine(1.0).await, engine(1.0).await);
    let c = reqwest::Client::new();
    // Direct clients (not through any router) fill A: 16 running, 14 waiting.
    let direct: Vec<_> = (0..30)
        .map(|_| {
            let (c, url) = (c.clone(), a.url());
            tokio::spawn(async move {
                c.post(format!("{url}/v1/completions"))
                    .json(&json!({"prompt": "x", "max_tokens": 2000}))
                    .send()
                    .await
            })
        })
        .collect();
    let engine_router = router(vec![a.url(), b.url()], LoadSignal::Engine, |_| {}).await;
    let inflight_router = router(vec![a.url(), b.url()], LoadSignal::Inflight, |_| {}).await;
    wait_for(
        "A's direct load visible to the engine-load router",
        15,
        || async {
            let ws = workers(&c, &engine_router.url()).await;
            ws.iter().any(|w| {
                w["url"] == a.url().as_str()
                    && w["source"] == "engine"
                    && w["load"].as_i64().unwrap() >= 25
            })
        },
    )
    .await;
    let mut to_a = [0, 0];
    for (i, r) in [&engine_router, &inflight_router].iter().enumerate() {
        for _ in 0..20 {
            let resp = complete_ok(&c, &r.url(), &json!({"prompt": "hi", "max_tokens": 1})).await;
            if worker_of(&resp) == a.url() {
                to_a[i] += 1;
            }
            resp.bytes().await.unwrap();
        }
    }
    assert!(
        to_a[0] <= 2,
        "the engine-load router avoids the loaded worker: {} of 20 went to A",
        to_a[0]
    );
    assert!(
        to_a[1] >= 4,
        "an in-flight router cannot see direct load: only {} of 20 went to A",
        to_a[1]
    );
    for d in direct {
        d.abort();
    }
    engine_router.stop().await;
    inflight_router.stop().await;
    a.stop().await;
    b.stop().await;
}

/// A worker whose HTTP side always answers and whose load publisher the test controls.
struct FakeWorker {
    url: String,
    publishing: Arc<AtomicBool>,
    restart: Arc<AtomicBool>,
    waiting: Arc<AtomicI64>,
    stop: Arc<AtomicBool>,
}

async fn fake_worker(advertise: bool) -> FakeWorker {
    let load_port = free_port_block(1).unwrap();
    let url = http_worker(advertise.then_some(load_port)).await;
    let (publishing, restart, waiting, stop) = (
        Arc::new(AtomicBool::new(true)),
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicI64::new(7)),
        Arc::new(AtomicBool::new(false)),
    );
    if advertise {
        let (p, r, w, s) = (
            publishing.clone(),
            restart.clone(),
            waiting.clone(),
            stop.clone(),
        );
        std::thread::spawn(move || {
            let ctx = zmq::Context::new();
            let mut sink = snapshot_pub(&ctx, load_port).unwrap();
            while !s.load(Ordering::Relaxed) {
                if r.swap(false, Ordering::Relaxed) {
                    drop(sink);
                    // libzmq releases the port asynchronously: retry the bind briefly.
                    sink = wait_until_sync("rebinding the load port", 5, || {
                        snapshot_pub(&ctx, load_port)
                    });
                }
                if p.load(Ordering::Relaxed) {
                    let snap = LoadSnapshot {
                        num_waiting_reqs: w.load(Ordering::Relaxed),
                        ..Default::default()
                    };
                    let _ = sink.write(Encoded {
                        snapshot: &snap,
                        bytes: &snapshot_bytes(&snap),
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
    }
    FakeWorker {
        url,
        publishing,
        restart,
        waiting,
        stop,
    }
}

async fn source_of(c: &reqwest::Client, r: &str, url: &str) -> (String, Value) {
    let w = worker_json(c, r, url).await;
    (w["source"].as_str().unwrap().to_string(), w)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silence_falls_back_and_resumes_and_a_restart_is_picked_up() {
    let fw = fake_worker(true).await;
    let r = router(vec![fw.url.clone()], LoadSignal::Engine, |c| {
        c.freshness_ms = 400
    })
    .await;
    let c = reqwest::Client::new();
    let (rurl, wurl) = (r.url(), fw.url.clone());
    wait_for("engine-sourced load", 10, || async {
        source_of(&c, &rurl, &wurl).await.0 == "engine"
    })
    .await;
    assert_eq!(source_of(&c, &rurl, &wurl).await.1["load"], 7);

    fw.publishing.store(false, Ordering::Relaxed);
    wait_for("fallback after silence", 10, || async {
        source_of(&c, &rurl, &wurl).await.0 == "fallback"
    })
    .await;
    // No request fails because of it.
    for _ in 0..5 {
        complete_ok(&c, &rurl, &json!({"prompt": "x"})).await;
    }
    fw.waiting.store(3, Ordering::Relaxed);
    fw.publishing.store(true, Ordering::Relaxed);
    wait_for("engine load again", 10, || async {
        source_of(&c, &rurl, &wurl).await.0 == "engine"
    })
    .await;

    // Let the old stream run well past where the restarted one will be when the SUB reconnects
    // (a restart is recognised by the sequence going backwards).
    wait_for("a long-running stream", 10, || async {
        source_of(&c, &rurl, &wurl).await.1["ranks"][0]["seq"]
            .as_i64()
            .unwrap()
            >= 80
    })
    .await;
    fw.restart.store(true, Ordering::Relaxed);
    fw.waiting.store(11, Ordering::Relaxed);
    wait_for(
        "the restarted publisher (seq back to 0) used",
        10,
        || async {
            let (src, w) = source_of(&c, &rurl, &wurl).await;
            src == "engine" && w["load"] == 11 && w["ranks"][0]["restarts"].as_u64().unwrap() >= 1
        },
    )
    .await;
    fw.stop.store(true, Ordering::Relaxed);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_a_range_is_routed_on_inflight_with_its_reason() {
    let fw = fake_worker(false).await;
    let r = router(vec![fw.url.clone()], LoadSignal::Engine, |_| {}).await;
    let c = reqwest::Client::new();
    let (src, w) = source_of(&c, &r.url(), &fw.url).await;
    assert_eq!(src, "fallback");
    assert!(
        w["no_load_reason"]
            .as_str()
            .unwrap()
            .contains("kv_events is null"),
        "{w}"
    );
    complete_ok(&c, &r.url(), &json!({"prompt": "x"})).await;
    let m = scrape(&c, &r.url()).await;
    assert_eq!(
        m.value("loadlink_worker_engine_priced", &[("worker", &fw.url)]),
        Some(0.0),
        "{m:?}"
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_inflight_leak_after_mixed_traffic_with_disconnects() {
    let (a, b) = (engine(1000.0).await, engine(1000.0).await);
    let r = router(vec![a.url(), b.url()], LoadSignal::Engine, |_| {}).await;
    let c = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    let url = r.url();
    let total = 20_000u64;
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let ok = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (c, url, next, ok) = (c.clone(), url.clone(), next.clone(), ok.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    let stream = i % 2 == 0;
                    let disconnect = i % 10 == 3;
                    let body = json!({"prompt": "hello", "max_tokens": if disconnect { 400 } else { 3 }, "stream": stream || disconnect});
                    let mut resp = complete_ok(&c, &url, &body).await;
                    if disconnect {
                        let _ = resp.chunk().await; // first event, then hang up mid-stream
                        drop(resp);
                    } else {
                        let text = resp.text().await.unwrap();
                        assert!(!stream || text.ends_with("data: [DONE]\n\n"));
                    }
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(ok.load(Ordering::Relaxed), total);
    let st = r.state.clone();
    wait_for("every guard released", 20, || async {
        st.fleet.workers().iter().all(|w| w.inflight() == 0)
    })
    .await;
    let dispatched: u64 = st
        .fleet
        .workers()
        .iter()
        .map(|w| w.requests_total.load(Ordering::Relaxed))
        .sum();
    assert_eq!(dispatched, total);
    wait_for(
        "engines drained (disconnects aborted upstream)",
        20,
        || async { a.open_requests() == 0 && b.open_requests() == 0 },
    )
    .await;
    r.stop().await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_survive_load_swings_and_a_dead_worker_gets_none_of_them() {
    let a = engine(20.0).await;
    let dead = "http://127.0.0.1:9".to_string(); // discard port: nothing listens
    let r = router(vec![a.url(), dead.clone()], LoadSignal::Engine, |c| {
        c.discovery_attempts = 1
    })
    .await;
    let c = reqwest::Client::new();
    let streams: Vec<_> = (0..30)
        .map(|_| {
            let (c, url) = (c.clone(), r.url());
            tokio::spawn(async move {
                let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "stream": true});
                let resp = post(&c, &format!("{url}/v1/chat/completions"), &body).await;
                assert_eq!(resp.status(), 200);
                resp.text().await.unwrap()
            })
        })
        .collect();
    // A burst of other traffic swings the load while the streams run.
    for _ in 0..40 {
        let resp = complete(&c, &r.url(), &json!({"prompt": "x", "max_tokens": 5})).await;
        assert_eq!(resp.status(), 200, "the dead worker is never tried");
        assert_eq!(worker_of(&resp), a.url());
        resp.bytes().await.unwrap();
    }
    for s in streams {
        let text = s.await.unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"));
        assert_eq!(
            text.matches("\"delta\"").count(),
            200,
            "every token arrived"
        );
    }
    let ws = workers(&c, &r.url()).await;
    let d = ws.iter().find(|w| w["url"] == dead.as_str()).unwrap();
    // Its discovery failed, so it names no model: the requests (for the one model `a` serves)
    // are not its to take, and it is never tried.
    assert_eq!(d["models"]["names"], serde_json::Value::Null, "{d}");
    let workers = r.state.fleet.workers();
    let dw = workers.iter().find(|w| w.url == dead).unwrap();
    let sent = dw.requests_total.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(sent, 0, "nothing was sent to the dead worker");
    assert!(
        d["no_load_reason"]
            .as_str()
            .unwrap()
            .contains("discovery failed")
    );
    r.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_and_bad_input() {
    let fw = fake_worker(false).await;
    let c = reqwest::Client::new();
    let closed = router(vec![], LoadSignal::Engine, |_| {}).await;
    let resp = post(
        &c,
        &format!("{}/workers", closed.url()),
        &json!({"url": fw.url}),
    )
    .await;
    assert_eq!(resp.status(), 403, "no --admin-token: admin API off");
    let resp = complete(&c, &closed.url(), &json!({"prompt": "x"})).await;
    assert_eq!(resp.status(), 503);
    assert!(resp.text().await.unwrap().contains("no workers"));
    closed.stop().await;

    let r = router(vec![], LoadSignal::Engine, |c| {
        c.admin_token = Some("s3cret".into());
        c.max_body_bytes = 2048;
    })
    .await;
    let add = |token: Option<&'static str>, url: String| {
        let (c, r) = (c.clone(), r.url());
        async move {
            let mut req = c.post(format!("{r}/workers")).json(&json!({ "url": url }));
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            req.send().await.unwrap().status().as_u16()
        }
    };
    assert_eq!(add(None, fw.url.clone()).await, 401);
    assert_eq!(add(Some("wrong"), fw.url.clone()).await, 401);
    assert_eq!(add(Some("s3cret"), "ftp://x".into()).await, 400);
    assert_eq!(add(Some("s3cret"), fw.url.clone()).await, 201);
    assert_eq!(workers(&c, &r.url()).await.len(), 1);
    complete_ok(&c, &r.url(), &json!({"prompt": "x"})).await;
    let big = c
        .post(format!("{}/v1/completions", r.url()))
        .body(vec![b'x'; 8192])
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), 413);
    let refused = scrape(&c, &r.url()).await.value(
        "loadlink_peer_refusals_total",
        &[("reason", "request_too_large")],
    );
    assert_eq!(refused, Some(1.0), "a body over its budget is counted");
    assert_eq!(
        c.get(format!("{}/nope", r.url()))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    let del = c
        .delete(format!("{}/workers?url={}", r.url(), fw.url))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 204);
    assert!(workers(&c, &r.url()).await.is_empty());
    r.stop().await;
}
