//! The hostile workers of the soak: each is a real HTTP server on its own loopback address and,
//! where it advertises sockets, real libzmq PUB and ROUTER sockets, that misbehaves in one way a
//! real peer can (a bug, a half-dead pod, or malice). None of them ever serves a completion: they
//! answer 503 at once, so a request the router sends there is retried elsewhere.
//!
//! * `stall`: `/server_info` sends its headers and then nothing, for ever.
//! * `dribble`: `/server_info` sends one byte every 200 ms, for ever.
//! * `huge`: `/server_info` sends 256 MiB.
//! * `ranks-json`: no load socket; `/v1/loads` reports ranks 2^40, 2^63-1 and 5,000 others, with
//!   counts at `i64::MAX` and `i64::MIN`.
//! * `ranks-metrics`: no load socket; `/metrics` has vLLM's gauges for 30,000 `engine` labels,
//!   one of them 2^40, values out of every range.
//! * `garbage-pub`: advertises 4 load ranks and 4 KV ranks with replay; its PUBs send random
//!   frames, oversized messages (2 MiB on load, 8 MiB on KV), valid snapshots with absurd numbers
//!   and seqs that jump across the whole i64 range; its replay ROUTER answers with garbage.

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use loadlink_wire::LoadSnapshot;
use loadlink_wire::codec::snapshot_bytes;
use loadlink_wire::descriptor::KvEventsDescriptor;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The kinds, in the order they are started.
pub const KINDS: [&str; 6] = [
    "stall",
    "dribble",
    "huge",
    "ranks-json",
    "ranks-metrics",
    "garbage-pub",
];

/// Running hostile workers; their publisher threads stop when this is dropped.
pub struct Hostile {
    /// `(kind, url)` of each.
    pub workers: Vec<(&'static str, String)>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Messages the garbage publishers sent.
    pub sent: Arc<AtomicU64>,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Starts one worker of each of `kinds` (names from [`KINDS`]), the i-th of [`KINDS`] on
/// 127.0.0.(10 + i). `flood_per_s` bounds the garbage publishers' message rate (all ranks
/// together).
pub async fn start(kinds: &[String], flood_per_s: u64) -> Result<Hostile, String> {
    if let Some(k) = kinds.iter().find(|k| !KINDS.contains(&k.as_str())) {
        return Err(format!(
            "unknown hostile worker kind {k:?}; expected some of {}",
            KINDS.join(", ")
        ));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut h = Hostile {
        workers: Vec::new(),
        stop: stop.clone(),
        threads: Vec::new(),
        sent: sent.clone(),
    };
    for (i, kind) in KINDS.iter().enumerate() {
        if !kinds.iter().any(|k| k == kind) {
            continue;
        }
        let ip = format!("127.0.0.{}", 10 + i);
        let app = match *kind {
            "garbage-pub" => {
                let ranks = 4u16;
                // load base, KV base and replay base, each `ranks` wide.
                let base = loadlink_publish::free_port_block(3 * ranks)?;
                let (stop, sent) = (stop.clone(), sent.clone());
                h.threads.push(std::thread::spawn(move || {
                    garbage_publisher(base, ranks, flood_per_s, &stop, &sent)
                }));
                server_info_app(json!({
                    "dp_size": ranks,
                    "kv_events": KvEventsDescriptor {
                        publisher: "zmq".into(),
                        endpoint_host: "*".into(),
                        endpoint_port_base: base + ranks,
                        topic: String::new(),
                        block_size: 16,
                        dp_size: ranks as u32,
                        load_endpoint_port_base: Some(base),
                        load_topic: None,
                        replay_endpoint_port_base: Some(base + 2 * ranks),
                    },
                }))
            }
            other => http_app(other),
        };
        let listener = tokio::net::TcpListener::bind(format!("{ip}:0"))
            .await
            .map_err(|e| format!("binding {ip}: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        h.workers.push((kind, format!("http://{ip}:{port}")));
    }
    Ok(h)
}

/// What every hostile worker answers besides its own misbehaviour.
fn base_app() -> axum::Router {
    let unavailable =
        || async { (StatusCode::SERVICE_UNAVAILABLE, "hostile worker").into_response() };
    axum::Router::new()
        .route("/health", get(unavailable))
        .route("/v1/completions", post(unavailable))
        .route("/v1/chat/completions", post(unavailable))
        .route("/generate", post(unavailable))
        .route("/v1/models", get(|| async { stall_body() }))
}

fn server_info_app(info: serde_json::Value) -> axum::Router {
    base_app().route(
        "/server_info",
        get(move || std::future::ready(axum::Json(info.clone()))),
    )
}

fn http_app(kind: &str) -> axum::Router {
    let app = base_app();
    match kind {
        "stall" => app.route("/server_info", get(|| async { stall_body() })),
        "dribble" => app.route("/server_info", get(|| async { dribble_body() })),
        "huge" => app.route("/server_info", get(|| async { huge_body(256 << 20) })),
        "ranks-json" => app
            .route("/server_info", get(|| async { axum::Json(json!({})) }))
            .route("/v1/loads", get(|| async { absurd_loads() })),
        _ => app
            .route("/server_info", get(|| async { axum::Json(json!({})) }))
            .route("/metrics", get(|| async { absurd_metrics() })),
    }
}

/// Headers with a length promised, ten bytes, then nothing for ever.
fn stall_body() -> Response {
    let stream = futures_stream(|i| async move {
        if i == 0 {
            Some(vec![b'{'; 10])
        } else {
            std::future::pending::<()>().await;
            None
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

/// One byte every 200 ms, for ever (chunked, so no length tells the reader when to give up).
fn dribble_body() -> Response {
    let stream = futures_stream(|i| async move {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Some(vec![if i == 0 { b'{' } else { b' ' }])
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

/// `total` bytes of a JSON document that never ends well.
fn huge_body(total: usize) -> Response {
    const CHUNK: usize = 64 << 10;
    let stream = futures_stream(move |i| async move {
        if i * CHUNK >= total {
            return None;
        }
        Some(if i == 0 {
            let mut v = b"{\"pad\":\"".to_vec();
            v.resize(CHUNK, b'x');
            v
        } else {
            vec![b'x'; CHUNK]
        })
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

/// A stream of `Ok(chunk)` from `next(i)` for i = 0, 1, … until it returns `None`.
fn futures_stream<F, Fut>(
    next: F,
) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> + Send
where
    F: Fn(usize) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Option<Vec<u8>>> + Send,
{
    futures_util::stream::unfold(0usize, move |i| {
        let fut = next(i);
        async move { fut.await.map(|c| (Ok(c), i + 1)) }
    })
}

/// `/v1/loads` with absurd ranks and numbers.
fn absurd_loads() -> axum::Json<serde_json::Value> {
    let rank = |r: i64, running: i64| {
        json!({"dp_rank": r, "num_running_reqs": running, "num_waiting_reqs": running,
               "num_waiting_uncached_tokens": running, "num_total_tokens": i64::MIN,
               "token_usage": 1e300, "timestamp": -1.0})
    };
    let mut loads = vec![rank(1 << 40, i64::MAX), rank(i64::MAX, i64::MIN)];
    loads.extend((0..5_000).map(|r| rank(r, i64::MAX - r)));
    axum::Json(json!({ "loads": loads }))
}

/// vLLM gauges for 30,000 engines, one at 2^40, values out of every range.
fn absurd_metrics() -> String {
    let mut page = String::with_capacity(8 << 20);
    for (name, v) in [
        ("vllm:num_requests_running", "9.3e18"),
        ("vllm:num_requests_waiting", "-9.3e18"),
        ("vllm:kv_cache_usage_perc", "NaN"),
    ] {
        page.push_str(&format!("# TYPE {name} gauge\n"));
        page.push_str(&format!(
            "{name}{{engine=\"1099511627776\",model_name=\"m\"}} {v}\n"
        ));
        for e in 0..30_000 {
            page.push_str(&format!("{name}{{engine=\"{e}\",model_name=\"m\"}} {v}\n"));
        }
    }
    page
}

/// A small xorshift generator: the garbage needs to vary, not to be unpredictable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// The garbage publisher: `ranks` load PUBs at `base`, KV PUBs at `base + ranks`, replay ROUTERs
/// at `base + 2 ranks`, about `per_s` messages a second in all until `stop`.
fn garbage_publisher(base: u16, ranks: u16, per_s: u64, stop: &AtomicBool, sent: &AtomicU64) {
    let ctx = zmq::Context::new();
    let bind = |kind, port: u16| -> Option<zmq::Socket> {
        let s = ctx.socket(kind).ok()?;
        s.set_linger(0).ok()?;
        s.set_sndhwm(100_000).ok()?;
        s.bind(&format!("tcp://0.0.0.0:{port}")).ok()?;
        Some(s)
    };
    let loads: Vec<_> = (0..ranks)
        .filter_map(|r| bind(zmq::PUB, base + r))
        .collect();
    let kvs: Vec<_> = (0..ranks)
        .filter_map(|r| bind(zmq::PUB, base + ranks + r))
        .collect();
    let replays: Vec<_> = (0..ranks)
        .filter_map(|r| bind(zmq::ROUTER, base + 2 * ranks + r))
        .collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let big_load = vec![0xA5u8; 2 << 20];
    let big_kv = vec![0x5Au8; 8 << 20];
    let tick = Duration::from_millis(10);
    let per_tick = (per_s / 100).max(1);
    let mut n = 0u64;
    while !stop.load(Relaxed) {
        let started = std::time::Instant::now();
        for _ in 0..per_tick {
            n += 1;
            let r = (rng.next() % ranks as u64) as usize;
            let seq = match n % 5 {
                0 => i64::MAX,
                1 => i64::MIN,
                2 => rng.next() as i64,
                _ => n as i64,
            };
            let load = &loads[r.min(loads.len().saturating_sub(1))];
            let kv = &kvs[r.min(kvs.len().saturating_sub(1))];
            let msg: Vec<Vec<u8>> = match n % 7 {
                0 => vec![
                    Vec::new(),
                    seq.to_be_bytes().to_vec(),
                    absurd_snapshot(&mut rng),
                ],
                1 => vec![rng.bytes(3)],
                2 => (0..1 + rng.next() % 5)
                    .map(|_| {
                        let len = (rng.next() % 300) as usize;
                        rng.bytes(len)
                    })
                    .collect(),
                3 => vec![Vec::new(), seq.to_be_bytes().to_vec(), rng.bytes(150)],
                _ => vec![b"load".to_vec(), rng.bytes(8), rng.bytes(64)],
            };
            let _ = load.send_multipart(&msg, zmq::DONTWAIT);
            let kv_msg = vec![Vec::new(), seq.to_be_bytes().to_vec(), rng.bytes(200)];
            let _ = kv.send_multipart(&kv_msg, zmq::DONTWAIT);
            if n.is_multiple_of(500) {
                let _ =
                    load.send_multipart([&b""[..], &seq.to_be_bytes(), &big_load], zmq::DONTWAIT);
                let _ = kv.send_multipart([&b""[..], &seq.to_be_bytes(), &big_kv], zmq::DONTWAIT);
            }
            sent.fetch_add(2, Relaxed);
        }
        for s in &replays {
            // Answer any request with garbage, one batch of it.
            while let Ok(frames) = s.recv_multipart(zmq::DONTWAIT) {
                if let Some(id) = frames.first() {
                    let junk = rng.bytes(100);
                    let _ = s.send_multipart(
                        [&id[..], b"", b"", &i64::MIN.to_be_bytes(), &junk],
                        zmq::DONTWAIT,
                    );
                }
            }
        }
        std::thread::sleep(tick.saturating_sub(started.elapsed()));
    }
}

/// A well-formed snapshot whose numbers are at the edges of i64.
fn absurd_snapshot(rng: &mut Rng) -> Vec<u8> {
    let pick = |x: u64| match x % 4 {
        0 => i64::MAX,
        1 => i64::MIN,
        2 => -1,
        _ => x as i64,
    };
    snapshot_bytes(&LoadSnapshot {
        dp_rank: pick(rng.next()) as i32 as i64,
        num_running_reqs: pick(rng.next()),
        num_waiting_reqs: pick(rng.next()),
        num_total_tokens: pick(rng.next()),
        num_waiting_uncached_tokens: pick(rng.next()),
        total_prefill_uncached_tokens: pick(rng.next()),
        total_prefill_busy_us: pick(rng.next()),
        timestamp: Some(f64::from_bits(rng.next())),
        ..Default::default()
    })
}
