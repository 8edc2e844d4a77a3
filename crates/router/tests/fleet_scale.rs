//! The router at fleet scale, on loopback with real libzmq: more subscriptions than libzmq's
//! default socket limit, a backlog decoded once per drain with every seq accounted, and recovery
//! after one rank's load socket is cut while its engine keeps serving.
//!
//! Many workers are served by one process: every worker is a distinct 127.0.x.y address on one
//! HTTP port (one axum app answers `/server_info` for all), and each rank's PUB is bound on
//! 0.0.0.0, so it serves every worker's subscription to that rank.

use axum::routing::{get, post};
use loadlink_publish::free_port_block;
use loadlink_router::ingest::drain::{Scratch, drain_rank};
use loadlink_router::ingest::stats::IngestStats;
use loadlink_router::{LoadSignal, Source, Worker};
use loadlink_testkit::router::router;
use loadlink_testkit::wait::{wait_for, wait_for_sync};
use loadlink_wire::LoadSnapshot;
use loadlink_wire::codec::snapshot_bytes;
use loadlink_wire::descriptor::KvEventsDescriptor;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

fn snapshot(waiting: i64) -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    snapshot_bytes(&LoadSnapshot {
        num_waiting_reqs: waiting,
        timestamp: Some(now),
        ..Default::default()
    })
}

fn send(s: &zmq::Socket, seq: i64, payload: &[u8]) {
    let _ = s.send_multipart([&b""[..], &seq.to_be_bytes(), payload], zmq::DONTWAIT);
}

/// One HTTP app on 0.0.0.0 that is every worker: `/server_info` advertises `ranks` load sockets
/// from `load_base`. Returns its port.
async fn fake_workers(ranks: u32, load_base: u16) -> u16 {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let kv = KvEventsDescriptor {
        publisher: "zmq".into(),
        endpoint_host: "*".into(),
        endpoint_port_base: load_base + 200,
        topic: String::new(),
        block_size: 16,
        dp_size: ranks,
        load_endpoint_port_base: Some(load_base),
        load_topic: None,
        replay_endpoint_port_base: None,
    };
    let info = json!({ "dp_size": ranks, "kv_events": kv });
    let app = axum::Router::new()
        .route(
            "/server_info",
            get(move || std::future::ready(axum::Json(info.clone()))),
        )
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/completions",
            post(|| async { axum::Json(json!({"choices": [{"text": "ok"}]})) }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// Worker `i`'s URL: its own loopback address.
fn worker_url(i: usize, port: u16) -> String {
    format!("http://127.0.{}.{}:{port}", 1 + i / 250, 1 + i % 250)
}

/// Publishes on one PUB per rank at `hz` until `stop`; rank `cut` (if < ranks) is closed while it
/// is set and bound again after.
fn publisher(base: u16, ranks: u16, hz: u32, stop: Arc<AtomicBool>, cut: Arc<AtomicUsize>) {
    let ctx = zmq::Context::new();
    let bind = |r: u16| loop {
        let s = ctx.socket(zmq::PUB).unwrap();
        s.set_linger(0).unwrap();
        if s.bind(&format!("tcp://0.0.0.0:{}", base + r)).is_ok() {
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut pubs: Vec<Option<zmq::Socket>> = (0..ranks).map(|r| Some(bind(r))).collect();
    let mut seq = 0i64;
    while !stop.load(Relaxed) {
        for (r, p) in pubs.iter_mut().enumerate() {
            let cut_now = cut.load(Relaxed) == r;
            match (cut_now, p.is_some()) {
                (true, true) => *p = None,
                (false, false) => *p = Some(bind(r as u16)),
                _ => {}
            }
            if let Some(s) = p {
                send(s, seq, &snapshot(r as i64));
            }
        }
        seq += 1;
        std::thread::sleep(Duration::from_millis(1000 / hz as u64));
    }
}

fn engine_priced(ws: &[Arc<Worker>], freshness_ms: u64) -> usize {
    ws.iter()
        .filter(|w| w.load(LoadSignal::Engine, freshness_ms).source == Source::Engine)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_workers_of_eight_ranks_are_all_priced_on_engine_load() {
    let (n, ranks) = (200usize, 8u16);
    let base = free_port_block(ranks).unwrap();
    let http = fake_workers(ranks as u32, base).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (s2, cut) = (stop.clone(), Arc::new(AtomicUsize::new(usize::MAX)));
    let pubt = std::thread::spawn(move || publisher(base, ranks, 20, s2, cut));
    let urls: Vec<String> = (0..n).map(|i| worker_url(i, http)).collect();
    let r = router(urls, LoadSignal::Engine, |_| {}).await;
    assert!(n * ranks as usize > loadlink_router::zctx::ZMQ_DEFAULT_MAX_SOCKETS);
    let st = r.state.clone();
    wait_for("every worker priced on engine load", 60, || {
        let ws = st.fleet.workers();
        std::future::ready(ws.len() == n && engine_priced(&ws, 3000) == n)
    })
    .await;
    let stats = st.fleet.ingest_stats().expect("ingest running");
    assert_eq!(
        stats.subscriptions.load(Relaxed),
        (n * ranks as usize) as u64
    );
    assert!(
        st.fleet
            .workers()
            .iter()
            .all(|w| w.no_load_reason.is_none())
    );
    stop.store(true, Relaxed);
    pubt.join().unwrap();
    r.stop().await;
}

#[test]
fn a_backlog_is_decoded_once_and_every_seq_is_accounted() {
    let ctx = zmq::Context::new();
    let p = ctx.socket(zmq::PUB).unwrap();
    p.bind("inproc://backlog").unwrap();
    let sub = loadlink_router::subscribe::open(&ctx, "inproc://backlog", b"").unwrap();
    // Join: publish until the subscription has propagated, then empty the socket.
    wait_for_sync("the subscription to propagate", 10, || {
        send(&p, 1000, &snapshot(0));
        std::thread::sleep(Duration::from_millis(5));
        sub.get_events().unwrap().contains(zmq::POLLIN)
    });
    while sub.recv_multipart(zmq::DONTWAIT).is_ok() {}
    let w = Worker::new("http://a".into(), 1, None, Instant::now());
    let seqs: Vec<i64> = (0..10).chain(15..20).chain(3..6).collect();
    for (i, seq) in seqs.iter().enumerate() {
        send(&p, *seq, &snapshot(i as i64));
    }
    // A malformed message (two frames) in the middle of the backlog is counted, not decoded.
    p.send_multipart([&b""[..], &b"x"[..]], 0).unwrap();
    send(&p, 6, &snapshot(77));
    let stats = IngestStats::default();
    let mut scratch = Scratch::default();
    let d = drain_rank(&sub, &w, 0, &mut scratch, &stats);
    assert_eq!(
        d.messages,
        seqs.len() as u64 + 2,
        "every queued message received"
    );
    assert_eq!(d.decoded, 1, "only the newest is decoded");
    let r = w.ranks.get(0).expect("rank 0");
    assert_eq!(r.gaps.load(Relaxed), 5, "10..=14 skipped");
    assert_eq!(r.restarts.load(Relaxed), 1, "19 → 3 is a restart");
    assert_eq!(r.messages.load(Relaxed), seqs.len() as u64 + 1);
    assert_eq!(r.last_seq.load(Relaxed), 6);
    assert_eq!(
        r.waiting.load(Relaxed),
        77,
        "the newest snapshot is in the book"
    );
    assert_eq!(
        w.dropped[loadlink_wire::FrameError::FrameCount(2).index()].load(Relaxed),
        1
    );
    assert_eq!(stats.decoded.load(Relaxed), 1);
    let d = drain_rank(&sub, &w, 0, &mut scratch, &stats);
    assert_eq!((d.messages, d.decoded), (0, 0), "drained fully");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_rank_falls_back_and_is_used_again_soon_after_it_returns() {
    let ranks = 2u16;
    let freshness_ms = 1000;
    let base = free_port_block(ranks).unwrap();
    let http = fake_workers(ranks as u32, base).await;
    let stop = Arc::new(AtomicBool::new(false));
    let cut = Arc::new(AtomicUsize::new(usize::MAX));
    let (s2, c2) = (stop.clone(), cut.clone());
    let pubt = std::thread::spawn(move || publisher(base, ranks, 50, s2, c2));
    let r = router(vec![worker_url(0, http)], LoadSignal::Engine, |c| {
        c.freshness_ms = freshness_ms;
    })
    .await;
    let st = r.state.clone();
    let source = move || {
        st.fleet.workers()[0]
            .load(LoadSignal::Engine, freshness_ms)
            .source
    };
    wait_for("engine load", 20, || {
        std::future::ready(source() == Source::Engine)
    })
    .await;
    cut.store(1, Relaxed);
    let cut_at = Instant::now();
    wait_for("fallback after the cut", 10, || {
        std::future::ready(source() == Source::Fallback)
    })
    .await;
    let fell_back = cut_at.elapsed();
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(cut_at.elapsed())).await;
    cut.store(usize::MAX, Relaxed);
    let back_at = Instant::now();
    // libzmq retries a lost publisher at most every 500 ms, so a 3 s bound leaves room for a
    // loaded machine; the measured figure is printed (docs/router.md quotes it).
    const { assert!(loadlink_router::subscribe::RECONNECT_IVL_MAX_MS <= 500) };
    wait_for("engine load again after the socket returns", 3, || {
        std::future::ready(source() == Source::Engine)
    })
    .await;
    eprintln!(
        "fell back {:?} after the cut; engine load again {:?} after the socket returned",
        fell_back,
        back_at.elapsed()
    );
    stop.store(true, Relaxed);
    pubt.join().unwrap();
    r.stop().await;
}

/// Worker `i`'s discovery: `ranks` load sockets on `inproc://` endpoints nobody binds (a socket
/// that stays connecting costs its descriptors and nothing else: no connect attempts).
fn inproc_discovery(i: usize, ranks: u32) -> loadlink_router::fleet::Discovery {
    loadlink_router::fleet::Discovery {
        models: Err(String::from("not read").into()),
        endpoints: (0..ranks)
            .map(|rank| loadlink_wire::descriptor::LoadEndpoint {
                rank,
                endpoint: format!("inproc://fd-limit-{i}-{rank}"),
                generation: loadlink_wire::Generation::Snapshot,
            })
            .collect(),
        no_load_reason: None,
        kv: Err("no KV events".into()),
        poll: None,
        pd: None,
    }
}

fn set_nofile(soft: u64, hard: u64) {
    let r = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }, 0);
}

const FD_CHILD: &str = "LOADLINK_TEST_FD_LIMIT_CHILD";

/// Workers added at runtime past the start-up limits: the soft descriptor limit grows with them
/// (libzmq's socket limit is already at its maximum); past the hard limit a new worker is refused
/// with `socket_limit` and the reason, the descriptors for listeners stay free, and a removal gives
/// its share back. Runs in a child process, whose limits it lowers.
#[test]
fn workers_added_at_runtime_grow_the_limits_and_past_the_hard_limit_are_refused() {
    if std::env::var_os(FD_CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "workers_added_at_runtime_grow_the_limits_and_past_the_hard_limit_are_refused",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(FD_CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "the child failed:\n{text}");
        assert!(text.contains("1 passed"), "the child ran the test:\n{text}");
        return;
    }
    use loadlink_router::budget::Refusal;
    use loadlink_router::fdlimit::{FD_RESERVE, current, descriptors_needed};
    let (_, hard) = current().unwrap();
    let (n, ranks) = (300usize, 4u32);
    let needed = descriptors_needed(n, n * ranks as usize);
    assert!(hard >= needed, "this test needs a hard limit of {needed}");
    // A router started small (limits sized for a handful of workers), then a fleet arrives.
    set_nofile(1200, hard);
    let fleet = loadlink_router::fleet::Fleet::new(1);
    for i in 0..n {
        fleet.add(
            &format!("http://10.9.{}.{}:1", i / 250, i % 250),
            inproc_discovery(i, ranks),
        );
    }
    let refused: Vec<_> = fleet
        .workers()
        .iter()
        .filter_map(|w| w.no_load_reason.clone())
        .collect();
    assert!(
        refused.is_empty(),
        "{} refused, e.g. {:?}",
        refused.len(),
        refused.first()
    );
    let stats = fleet.ingest_stats().unwrap();
    wait_for_sync("every rank on the ingest thread", 30, || {
        stats.subscriptions.load(Relaxed) == (n * ranks as usize) as u64
    });
    let (soft, _) = current().unwrap();
    assert!(soft >= needed, "the soft limit grew with the fleet: {soft}");

    // The hard limit reached: the next worker is refused, visibly, and the reserve stays free.
    set_nofile(soft, soft);
    let late = fleet.add("http://10.9.9.9:1", inproc_discovery(n, ranks));
    let reason = late.no_load_reason.clone().expect("refused");
    assert!(reason.contains("file descriptors"), "{reason}");
    assert_eq!(late.refusals.counts().get(Refusal::SocketLimit), 1);
    assert_eq!(fleet.refusals.get(Refusal::SocketLimit), 1);
    let spare: Vec<_> = (0..FD_RESERVE / 2)
        .map(|_| std::fs::File::open("/dev/null").expect("a descriptor from the reserve"))
        .collect();
    drop(spare);

    // A removal gives its descriptors back: the late worker fits now.
    assert!(fleet.remove("http://10.9.0.0:1"));
    let late = fleet.add("http://10.9.9.9:1", inproc_discovery(n, ranks));
    assert_eq!(late.no_load_reason, None);
}
