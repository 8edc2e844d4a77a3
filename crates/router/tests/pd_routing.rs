//! `loadlink route --pd` in front of capture engines (loopback HTTP servers that advertise a PD
//! role and record every body, `loadlink_testkit::pd_router`): the bootstrap fields of each
//! request's two legs, the pairing (one room, one prefill, one decode), retries after a failed
//! leg, and how prefill failures reach the client (4xx passed, others failing the request, a cut
//! prefill ending an open stream with an error event).

use loadlink_router::pd::{BootstrapPort, PdConfig};
use loadlink_router::{LoadSignal, Policy, RouterHandle};
use loadlink_testkit::metrics::scrape;
use loadlink_testkit::pd_router::{Answer, CaptureEngine, capture_engine, refusing_url};
use loadlink_testkit::router::{router, workers};
use loadlink_testkit::wait::wait_for;
use serde_json::{Value, json};
use std::collections::HashMap;

/// A `--pd` router over `prefill` (each with the port given on the command line, if any) and
/// `decode`, prefill and decode policies as given; waits until every worker is in `/workers`.
async fn pd_router(
    prefill: Vec<(String, Option<BootstrapPort>)>,
    decode: Vec<String>,
    policies: (Policy, Policy),
) -> RouterHandle {
    let n = prefill.len() + decode.len();
    let pd = PdConfig {
        prefill,
        decode,
        prefill_policy: policies.0,
        decode_policy: policies.1,
    };
    let r = router(Vec::new(), LoadSignal::Backlog, |c| {
        c.pd = Some(pd);
        c.discovery_attempts = 1;
        c.health_interval_ms = 600_000;
        c.retry_initial_backoff_ms = 1;
    })
    .await;
    let c = reqwest::Client::new();
    let url = r.url();
    wait_for("every PD worker in /workers", 20, || {
        let (c, url) = (c.clone(), url.clone());
        async move { workers(&c, &url).await.len() == n }
    })
    .await;
    r
}

/// One prefill engine (bootstrap port `port`) answering `prefill`, one decode engine answering
/// `decode`, and a PD router over the pair with the default policies.
async fn one_pair(
    port: u16,
    prefill: Answer,
    decode: Answer,
) -> (CaptureEngine, CaptureEngine, RouterHandle) {
    let p = capture_engine("prefill", port, prefill).await;
    let d = capture_engine("decode", 0, decode).await;
    let r = pd_router(
        vec![(p.url.clone(), None)],
        vec![d.url.clone()],
        default_policies(),
    )
    .await;
    (p, d, r)
}

fn default_policies() -> (Policy, Policy) {
    let pd = PdConfig::default();
    (pd.prefill_policy, pd.decode_policy)
}

/// Each room's bodies by engine URL, over `engines` (a room listed once per body received).
fn rooms(engines: &[&CaptureEngine]) -> Vec<(u64, String, Value)> {
    let mut out = Vec::new();
    for e in engines {
        for b in e.received() {
            match &b["bootstrap_room"] {
                Value::Array(rs) => rs
                    .iter()
                    .for_each(|r| out.push((r.as_u64().unwrap(), e.url.clone(), b.clone()))),
                r => out.push((r.as_u64().expect("a room"), e.url.clone(), b.clone())),
            }
        }
    }
    out
}

fn once_each(what: &str, rooms: &[(u64, String, Value)]) -> HashMap<u64, (String, Value)> {
    let mut by_room = HashMap::new();
    for (room, url, body) in rooms {
        let prev = by_room.insert(*room, (url.clone(), body.clone()));
        assert!(
            prev.is_none(),
            "{what}: room {room} sent twice ({url} and {:?})",
            prev.map(|p| p.0)
        );
    }
    by_room
}

async fn send(c: &reqwest::Client, base: &str, path: &str, body: Value) -> (u16, String) {
    let r = c
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .expect("router answers");
    let status = r.status().as_u16();
    (status, r.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_room_goes_to_one_prefill_and_one_decode_with_the_prefill_named() {
    let p1 = capture_engine("prefill", 9101, Answer::Normal).await;
    let p2 = capture_engine("prefill", 9102, Answer::Normal).await;
    let d1 = capture_engine("decode", 0, Answer::Normal).await;
    let d2 = capture_engine("decode", 0, Answer::Normal).await;
    let policies = (Policy::RoundRobin, Policy::RoundRobin);
    // p2's port is given on the command line: it wins over the advertised 9102.
    let prefill = vec![
        (p1.url.clone(), None),
        (p2.url.clone(), Some(BootstrapPort::Port(7002))),
    ];
    let r = pd_router(prefill, vec![d1.url.clone(), d2.url.clone()], policies).await;
    let (c, base) = (reqwest::Client::new(), r.url());
    let requests = [
        (
            "/generate",
            json!({"text": "a", "sampling_params": {"max_new_tokens": 2}}),
        ),
        (
            "/v1/completions",
            json!({"model": "m", "prompt": "b", "stream": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "user", "content": "c"}]}),
        ),
        (
            "/generate",
            json!({"text": ["d", "e"], "bootstrap_room": 5}),
        ),
    ];
    for round in 0..3 {
        for (path, body) in &requests {
            let (status, text) = send(&c, &base, path, body.clone()).await;
            assert_eq!(status, 200, "round {round} {path}: {text}");
            assert!(
                text.contains("decode"),
                "the client gets the decode engine's answer: {text}"
            );
        }
    }
    let port_of = HashMap::from([(p1.url.clone(), 9101u64), (p2.url.clone(), 7002)]);
    let pre = once_each("prefill", &rooms(&[&p1, &p2]));
    let dec = once_each("decode", &rooms(&[&d1, &d2]));
    assert_eq!(
        pre.len(),
        15,
        "3 rounds of 3 single requests and a batch of 2"
    );
    assert_eq!(
        pre.keys().collect::<std::collections::BTreeSet<_>>(),
        dec.keys().collect()
    );
    for (room, (url, body)) in &pre {
        assert!(*room < 1 << 63);
        let (_, dbody) = &dec[room];
        assert_eq!(body, dbody, "room {room}: both legs get the same body");
        let port = |v: &Value| v.as_array().map_or(v.clone(), |a| a[0].clone());
        assert_eq!(
            port(&body["bootstrap_port"]),
            json!(port_of[url]),
            "room {room} names its prefill"
        );
        assert_eq!(port(&body["bootstrap_host"]), json!("127.0.0.1"));
    }
    let batched: Vec<_> = pre.values().filter(|(_, b)| b["text"].is_array()).collect();
    assert_eq!(batched.len(), 6, "each batch lists one room per prompt");
    assert!(
        batched
            .iter()
            .all(|(_, b)| b["bootstrap_room"].as_array().unwrap().len() == 2)
    );
    let ws = workers(&c, &base).await;
    for w in &ws {
        let want = if port_of.contains_key(w["url"].as_str().unwrap()) {
            "prefill"
        } else {
            "decode"
        };
        assert_eq!(w["role"], want, "{w}");
    }
    let m = scrape(&c, &base).await;
    assert_eq!(
        m.value("loadlink_pd_requests_total", &[("outcome", "decoded")]),
        Some(12.0)
    );
    assert_eq!(
        m.value("loadlink_pd_workers", &[("role", "prefill")]),
        Some(2.0)
    );
    assert_eq!(
        m.value("loadlink_pd_dispatched_total", &[("role", "decode")]),
        Some(12.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_leg_is_retried_with_a_new_room_and_never_two_prefills() {
    let good = capture_engine("prefill", 9201, Answer::Normal).await;
    let dead_decode = refusing_url().await;
    let d = capture_engine("decode", 0, Answer::Normal).await;
    let dead_prefill = refusing_url().await;
    let prefill = vec![
        (dead_prefill.clone(), Some(BootstrapPort::Port(7777))),
        (good.url.clone(), None),
    ];
    let decode = vec![dead_decode, d.url.clone()];
    let r = pd_router(prefill, decode, (Policy::RoundRobin, Policy::RoundRobin)).await;
    let (c, base) = (reqwest::Client::new(), r.url());
    for i in 0..8 {
        let stream = i % 2 == 0;
        let (status, text) = send(
            &c,
            &base,
            "/v1/completions",
            json!({"prompt": "x", "stream": stream}),
        )
        .await;
        assert_eq!(status, 200, "request {i}: {text}");
    }
    let pre = once_each("prefill", &rooms(&[&good]));
    let dec = rooms(&[&d]);
    // Every room the live decode engine was sent was prefilled once on the engine it names, or
    // named the dead prefill engine (an attempt dropped when its prefill could not connect).
    for (room, _, body) in &dec {
        match body["bootstrap_port"].as_u64() {
            Some(7777) => assert!(!pre.contains_key(room), "room {room} reached a prefill too"),
            Some(9201) => assert!(
                pre.contains_key(room),
                "room {room}: decoded but never prefilled"
            ),
            other => panic!("room {room}: unexpected port {other:?}"),
        }
    }
    let m = scrape(&c, &base).await;
    let retries = |role| {
        m.value("loadlink_pd_retries_total", &[("role", role)])
            .unwrap_or(0.0)
    };
    assert!(
        retries("prefill") >= 1.0 && retries("decode") >= 1.0,
        "{} {}",
        retries("prefill"),
        retries("decode")
    );
    assert_eq!(
        m.value("loadlink_pd_requests_total", &[("outcome", "decoded")]),
        Some(8.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_errors_reach_the_client_as_sglang_routers_pass_them() {
    let cases = [
        (400, 400, "prefill_refused"),
        (500, 500, "prefill_failed"),
        (503, 502, "exhausted"),
    ];
    for (answer, want, outcome) in cases {
        let slow = Answer::Slow {
            events: 1,
            every_ms: 50,
        };
        let (p, _d, r) = one_pair(9301, Answer::Status(answer), slow).await;
        let (c, base) = (reqwest::Client::new(), r.url());
        let (status, text) = send(&c, &base, "/generate", json!({"text": "q"})).await;
        assert_eq!(status, want, "prefill {answer}: {text}");
        if answer < 500 {
            assert!(
                text.contains("prefill engine answered"),
                "the prefill's own body: {text}"
            );
        }
        let m = scrape(&c, &base).await;
        assert_eq!(
            m.value("loadlink_pd_requests_total", &[("outcome", outcome)]),
            Some(1.0),
            "prefill {answer}"
        );
        // A 503 is retried, but the one prefill engine is excluded after failing: one try each.
        assert_eq!(p.received().len(), 1, "prefill {answer}");
        let retried = m.value("loadlink_pd_retries_total", &[("role", "prefill")]);
        assert_eq!(
            retried,
            Some(if answer == 503 { 1.0 } else { 0.0 }),
            "prefill {answer}"
        );
        once_each("prefill", &rooms(&[&p]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_cut_mid_stream_ends_the_clients_stream_with_an_error_event() {
    let slow = Answer::Slow {
        events: 40,
        every_ms: 50,
    };
    let (_p, _d, r) = one_pair(9401, Answer::Cut, slow).await;
    let (c, base) = (reqwest::Client::new(), r.url());
    let (status, text) = send(
        &c,
        &base,
        "/v1/completions",
        json!({"prompt": "s", "stream": true}),
    )
    .await;
    assert_eq!(status, 200);
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"), "{text}");
    let err = events[events.len() - 2];
    assert!(
        err.starts_with("data: {\"error\"") && err.contains("prefill leg failed"),
        "{text}"
    );
    let decoded = events.iter().filter(|e| e.contains("decode-")).count();
    assert!(
        decoded < 40,
        "the stream ended before the decode engine's end: {decoded} events"
    );
    // JSON: the answer waits for both legs, and a cut prefill fails it.
    let (status, text) = send(&c, &base, "/v1/completions", json!({"prompt": "s"})).await;
    assert_eq!(status, 502, "{text}");
    assert!(text.contains("prefill leg failed"), "{text}");
    let m = scrape(&c, &base).await;
    assert_eq!(
        m.value("loadlink_pd_prefill_failed_mid_stream_total", &[]),
        Some(1.0)
    );
    assert_eq!(
        m.value(
            "loadlink_pd_requests_total",
            &[("outcome", "prefill_failed")]
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_are_discovered_from_server_info_and_regular_workers_take_no_pd_request() {
    let p = capture_engine("prefill", 9501, Answer::Normal).await;
    let d = capture_engine("decode", 0, Answer::Normal).await;
    let regular = capture_engine("null", 0, Answer::Normal).await;
    let urls = vec![p.url.clone(), d.url.clone(), regular.url.clone()];
    let r = router(urls, LoadSignal::Backlog, |c| {
        c.pd = Some(PdConfig::default());
        c.health_interval_ms = 600_000;
    })
    .await;
    let (c, base) = (reqwest::Client::new(), r.url());
    wait_for("three workers", 20, || {
        let (c, base) = (c.clone(), base.clone());
        async move { workers(&c, &base).await.len() == 3 }
    })
    .await;
    let ws = workers(&c, &base).await;
    let role = |url: &str| {
        ws.iter()
            .find(|w| w["url"] == url)
            .map(|w| (w["role"].clone(), w["bootstrap_port"].clone()))
    };
    assert_eq!(role(&p.url), Some((json!("prefill"), json!(9501))));
    assert_eq!(role(&d.url), Some((json!("decode"), Value::Null)));
    assert_eq!(role(&regular.url), Some((json!("regular"), Value::Null)));
    let doc: Value = loadlink_testkit::get_json(&c, &format!("{base}/workers")).await;
    assert_eq!(doc["pd"]["decode_policy"], "decode_load");
    assert_eq!(
        (
            doc["pd"]["prefill_workers"].as_u64(),
            doc["pd"]["regular_workers"].as_u64()
        ),
        (Some(1), Some(1))
    );
    for _ in 0..4 {
        let (status, _) = send(&c, &base, "/generate", json!({"text": "r"})).await;
        assert_eq!(status, 200);
    }
    assert_eq!(
        (
            p.received().len(),
            d.received().len(),
            regular.received().len()
        ),
        (4, 4, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_error_is_answered_without_waiting_for_the_prefill() {
    // The prefill leg would take a minute; the decode engine refuses at once.
    let minute = Answer::Slow {
        events: 1,
        every_ms: 60_000,
    };
    let (_p, _d, r) = one_pair(9601, minute, Answer::Status(400)).await;
    let (c, base) = (reqwest::Client::new(), r.url());
    let ask = send(&c, &base, "/generate", json!({"text": "q"}));
    let (status, text) = tokio::time::timeout(std::time::Duration::from_secs(30), ask)
        .await
        .expect("answered before the prefill leg ends");
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("decode engine answered 400"), "{text}");
    wait_for("the prefill leg closed", 10, || {
        let (c, base) = (c.clone(), base.clone());
        async move {
            let m = scrape(&c, &base).await;
            m.value("loadlink_pd_inflight", &[("role", "prefill")]) == Some(0.0)
        }
    })
    .await;
}
